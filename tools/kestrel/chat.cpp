// kestrel chat: a multi-turn conversation in the terminal.
#include <cstdio>
#include <iostream>
#include <string>

#include "commands.h"
#include "common.h"
#include "kestrel/base/error.h"
#include "kestrel/text/chat_template.h"

namespace kestrel::tools {
namespace {

struct ChatOptions {
  ModelOptions model;
  SamplingOptions sampling;
  std::string system;
};

int chat(const ChatOptions& o) {
  runtime::Engine engine = o.model.load();
  std::vector<text::ChatMessage> messages;
  if (!o.system.empty()) messages.push_back({"system", o.system});
  std::fprintf(stderr, "kestrel chat: %s. Type a message; /reset starts over, /exit or Ctrl-D ends.\n",
               engine.model().info().name.c_str());
  std::string line;
  for (;;) {
    std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/reset") {
      messages.resize(o.system.empty() ? 0 : 1);
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({"user", line});
    const auto prompt = engine.tokenizer().encode(text::render_gemma3(messages, true), false, true);
    runtime::GenerateResult result;
    try {
      result = engine.generate(prompt, o.sampling.generate_options(), [](std::string_view piece) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
        return true;
      });
    } catch (const Error& e) {
      std::fprintf(stderr, "\nkestrel: %s\n", e.what());
      messages.pop_back();
      continue;
    }
    std::printf("\n");
    messages.push_back({"assistant", result.text});
  }
  return 0;
}

}  // namespace

Command add_chat_command(CLI::App& app) {
  auto opts = std::make_shared<ChatOptions>();
  auto* cmd = app.add_subcommand("chat", "Hold a multi-turn conversation in the terminal");
  opts->model.add_to(*cmd);
  opts->sampling.add_to(*cmd);
  cmd->add_option("-s,--system", opts->system, "System prompt");
  return [opts] { return chat(*opts); };
}

}  // namespace kestrel::tools
