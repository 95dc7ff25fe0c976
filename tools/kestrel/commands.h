// Subcommands of the kestrel CLI. Each registers its options on the app and returns the
// function that runs it.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace kestrel::tools {

using Command = std::function<int()>;

Command add_run_command(CLI::App& app);
Command add_chat_command(CLI::App& app);
Command add_perplexity_command(CLI::App& app);
Command add_build_command(CLI::App& app);
Command add_inspect_command(CLI::App& app);
Command add_flashhead_eval_command(CLI::App& app);
Command add_serve_command(CLI::App& app);
Command add_export_tokenizer_command(CLI::App& app);
Command add_export_command(CLI::App& app);
Command add_bench_command(CLI::App& app);

}  // namespace kestrel::tools
