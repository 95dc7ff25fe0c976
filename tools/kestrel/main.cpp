// kestrel: the command-line front end.
#include <cstdio>
#include <exception>
#include <new>
#include <utility>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "common.h"
#include "kestrel/base/error.h"
#include "kestrel/runtime/engine.h"

int main(int argc, char** argv) {
  CLI::App app{"Kestrel: fast small language models on edge hardware"};
  app.require_subcommand(1);
  app.set_version_flag("--version", KESTREL_VERSION);
  namespace t = kestrel::tools;
  const std::pair<const char*, t::Command> commands[] = {
      {"run", t::add_run_command(app)},
      {"chat", t::add_chat_command(app)},
      {"perplexity", t::add_perplexity_command(app)},
      {"build", t::add_build_command(app)},
      {"inspect", t::add_inspect_command(app)},
      {"flashhead-eval", t::add_flashhead_eval_command(app)},
      {"serve", t::add_serve_command(app)},
      {"export-tokenizer", t::add_export_tokenizer_command(app)},
      {"export", t::add_export_command(app)},
      {"bench", t::add_bench_command(app)},
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "kestrel: error: %s\nRun with --help for more information.\n", e.what());
    return 2;  // usage error
  }
  try {
    for (const auto& [name, command] : commands) {
      if (app.got_subcommand(name)) return command();
    }
  } catch (const kestrel::tools::UsageError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kestrel: error: %s\n", e.what());
    return 2;
  } catch (const kestrel::runtime::OptionMismatch& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kestrel: error: %s\n", e.what());
    return 2;  // a usage error: an option (--probes, --ctx, --draft's model ...) does not fit the model
  } catch (const std::bad_alloc&) {
    // (what() would only say "std::bad_alloc")
    std::fflush(stdout);
    std::fprintf(stderr, "kestrel: error: out of memory: an allocation failed (lower --ctx or --parallel, or use a "
                         "smaller model or precision)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kestrel: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
