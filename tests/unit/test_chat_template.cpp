#include <gtest/gtest.h>

#include "kestrel/base/error.h"
#include "kestrel/text/chat_template.h"

using kestrel::text::ChatMessage;
using kestrel::text::render_gemma3;

// Expected strings follow the chat_template of google/gemma-3-270m-it (tokenizer_config.json).
TEST(ChatTemplate, SystemFoldedIntoFirstUserTurn) {
  const std::vector<ChatMessage> messages = {
      {"system", "You are terse."}, {"user", "  Hi there \n"}, {"assistant", "Hello."},
      {"user", "Bye"}};
  EXPECT_EQ(render_gemma3(messages, true),
            "<bos><start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n"
            "<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n"
            "<start_of_turn>model\n");
}

// Google's template only prefixes the first user turn with the system text, so a system message
// alone would vanish; it is the user turn instead.
TEST(ChatTemplate, SystemAloneIsTheUserTurn) {
  EXPECT_EQ(render_gemma3({{"system", " You are terse.\n"}}, true),
            "<bos><start_of_turn>user\nYou are terse.<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(render_gemma3({{"system", ""}}, true), "<bos><start_of_turn>model\n");
}

TEST(ChatTemplate, NoGenerationPrompt) {
  EXPECT_EQ(render_gemma3({{"user", "x"}}, false), "<bos><start_of_turn>user\nx<end_of_turn>\n");
}

TEST(ChatTemplate, RolesMustAlternate) {
  EXPECT_THROW(render_gemma3({{"user", "a"}, {"user", "b"}}, true), kestrel::Error);
  EXPECT_THROW(render_gemma3({{"assistant", "a"}}, true), kestrel::Error);
  EXPECT_THROW(render_gemma3({{"user", "a"}, {"system", "s"}}, true), kestrel::Error);
  EXPECT_THROW(render_gemma3({{"tool", "a"}}, true), kestrel::Error);
}
