// kestrel: the command-line front end.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "kestrel/base/error.h"

int main(int argc, char** argv) {
  CLI::App app{"Kestrel: fast small language models on edge hardware"};
  app.require_subcommand(1);
  app.set_version_flag("--version", KESTREL_VERSION);
  const kestrel::tools::Command run = kestrel::tools::add_run_command(app);
  const kestrel::tools::Command chat = kestrel::tools::add_chat_command(app);
  const kestrel::tools::Command perplexity = kestrel::tools::add_perplexity_command(app);
  CLI11_PARSE(app, argc, argv);
  try {
    if (app.got_subcommand("run")) return run();
    if (app.got_subcommand("chat")) return chat();
    if (app.got_subcommand("perplexity")) return perplexity();
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kestrel: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
