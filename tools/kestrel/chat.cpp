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

// Drops the oldest user/assistant exchange (keeping a system message); false if none is left
// to drop besides the newest user message.
bool drop_oldest_exchange(std::vector<text::ChatMessage>& messages) {
  const size_t first = !messages.empty() && messages[0].role == "system" ? 1 : 0;
  if (messages.size() < first + 3) return false;
  messages.erase(messages.begin() + static_cast<std::ptrdiff_t>(first),
                 messages.begin() + static_cast<std::ptrdiff_t>(first + 2));
  return true;
}

int chat(const ChatOptions& o) {
  runtime::Engine engine = o.model.load();
  o.sampling.load_draft(engine, o.model);
  std::vector<text::ChatMessage> messages;
  if (!o.system.empty()) messages.push_back({"system", o.system});
  std::fprintf(stderr, "kestrel chat: %s. Type a message; /reset starts over, /exit or Ctrl-D ends.\n",
               engine.model().info().name.c_str());
  if (!engine.has_chat_template()) {
    std::fprintf(stderr, "kestrel: warning: this model carries no chat template (a base model); "
                         "its answers to the Gemma chat format will be poor\n");
  }
  std::string line;
  for (;;) {
    std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/reset") {
      messages.resize(o.system.empty() ? 0 : 1);
      std::fprintf(stderr, "(conversation reset%s)\n", o.system.empty() ? "" : "; the system prompt is kept");
      continue;
    }
    if (line.starts_with("//")) {
      line.erase(0, 1);  // "//text": a message that starts with "/"
    } else if (line.starts_with("/")) {
      // A typo'd command is not sent to the model as a message.
      std::fprintf(stderr, "unknown command '%s' (commands: /reset, /exit; start a message with // to send "
                           "one that begins with /)\n", line.substr(0, line.find(' ')).c_str());
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({"user", line});
    // When the conversation outgrows the context, forget the oldest exchanges first.
    auto prompt = engine.tokenizer().encode(text::render_gemma3(messages, true), false, true);
    while (prompt.size() + 1 >= engine.n_ctx() && drop_oldest_exchange(messages)) {
      std::fprintf(stderr, "kestrel: the conversation outgrew the context; forgot the oldest exchange\n");
      prompt = engine.tokenizer().encode(text::render_gemma3(messages, true), false, true);
    }
    runtime::GenerateResult result;
    try {
      // Each turn resends the whole conversation; the KV cache already holds all of it but
      // the new message, which is all that is prefilled.
      auto options = o.sampling.generate_options();
      options.cache_prompt = true;
      result = engine.generate(prompt, options, [](std::string_view piece) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
        return true;
      });
    } catch (const Error& e) {
      std::fprintf(stderr, "\nkestrel: error: %s\n", e.what());
      messages.pop_back();
      continue;
    }
    std::printf("\n");
    std::fflush(stdout);
    messages.push_back({"assistant", result.text});
  }
  std::fprintf(stderr, "\n");
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
