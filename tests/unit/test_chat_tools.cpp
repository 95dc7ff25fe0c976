// Gemma 4 and Gemma 3 tool rendering, and parsing replies into content, thinking and calls.
// Expected Gemma 4 strings were written by hand from Google's published Gemma 4 chat template
// (google/gemma-4-*-it chat_template.jinja), not produced by this code.
#include <gtest/gtest.h>

#include "kestrel/base/error.h"
#include "kestrel/text/chat_template.h"
#include "kestrel/text/chat_tools.h"
#include "kestrel/text/reply_parser.h"

using nlohmann::json;
using namespace kestrel::text;

namespace {

ToolDefinition weather() {
  return {"get_weather", "Current weather",
          json::parse(R"({"type":"object","properties":{"city":{"type":"string","description":"City name"},
                          "unit":{"type":"string","enum":["C","F"]}},"required":["city"]})")};
}

Message msg(std::string role, std::string content) {
  Message m;
  m.role = std::move(role);
  m.content = std::move(content);
  return m;
}

}  // namespace

TEST(Gemma4Template, SystemAndUser) {
  EXPECT_EQ(render_gemma4({msg("system", " Be brief. "), msg("user", "Hi\n")}, {}, true, false),
            "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n");
  // no system turn at all without system, tools or thinking
  EXPECT_EQ(render_gemma4({msg("user", "Hi")}, {}, false, false), "<bos><|turn>user\nHi<turn|>\n");
  EXPECT_EQ(render_gemma4({msg("user", "Hi")}, {}, true, true),
            "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n");
}

TEST(Gemma4Template, ToolDeclarationCallAndResponse) {
  Message call = msg("assistant", "");
  call.tool_calls.push_back({"c1", "get_weather", json{{"city", "Paris"}, {"days", 2}}});
  Message result = msg("tool", "18 C");
  result.tool_call_id = "c1";
  const std::string out =
      render_gemma4({msg("user", "Weather?"), call, result, msg("assistant", "It is 18 C.")}, {weather()}, true, false);
  EXPECT_EQ(out,
            "<bos><|turn>system\n"
            "<|tool>declaration:get_weather{description:<|\"|>Current weather<|\"|>,parameters:{properties:{"
            "city:{description:<|\"|>City name<|\"|>,type:<|\"|>STRING<|\"|>},"
            "unit:{enum:[<|\"|>C<|\"|>,<|\"|>F<|\"|>],type:<|\"|>STRING<|\"|>}},"
            "required:[<|\"|>city<|\"|>],type:<|\"|>OBJECT<|\"|>}}<tool|><turn|>\n"
            "<|turn>user\nWeather?<turn|>\n"
            "<|turn>model\n<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:2}<tool_call|>"
            "<|tool_response>response:get_weather{value:<|\"|>18 C<|\"|>}<tool_response|>"
            "It is 18 C.<turn|>\n<|turn>model\n");
  // A pending call (no response yet) ends with <|tool_response> and gets no generation prompt.
  EXPECT_EQ(render_gemma4({msg("user", "Weather?"), call}, {}, true, false),
            "<bos><|turn>user\nWeather?<turn|>\n<|turn>model\n"
            "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:2}<tool_call|><|tool_response>");
}

TEST(Gemma4Template, ReasoningOnlyAfterTheLastUserTurnAndThinkingStripped) {
  Message old = msg("assistant", "A<|channel>thought\nx<channel|>B");
  old.reasoning = "old thoughts";
  Message latest = msg("assistant", "C");
  latest.reasoning = "new thoughts";
  const std::string out = render_gemma4({msg("user", "q1"), old, msg("user", "q2"), latest}, {}, false, false);
  EXPECT_EQ(out,
            "<bos><|turn>user\nq1<turn|>\n<|turn>model\nAB<turn|>\n<|turn>user\nq2<turn|>\n"
            "<|turn>model\n<|channel>thought\nnew thoughts\n<channel|>C<turn|>\n");
}

TEST(Gemma4Template, Errors) {
  EXPECT_THROW(render_gemma4({msg("wizard", "x")}, {}, true, false), kestrel::Error);
  EXPECT_THROW(render_gemma4({msg("tool", "x")}, {}, true, false), kestrel::Error);
}

TEST(Gemma4Value, RoundTrip) {
  const json v = json::parse(R"({"a":"x, y","b":[1,2.5,true,null],"c":{"d":"<>"}})");
  const std::string text = gemma4_value(v, false);
  EXPECT_EQ(text, "{a:<|\"|>x, y<|\"|>,b:[1,2.5,true,null],c:{d:<|\"|><><|\"|>}}");
  EXPECT_EQ(parse_gemma4_value(text), v);
  EXPECT_EQ(parse_gemma4_value(gemma4_value(v, true)), v);
  EXPECT_TRUE(parse_gemma4_value("{a:<|\"|>unterminated}").is_discarded());
  EXPECT_TRUE(parse_gemma4_value("{a:1").is_discarded());
  EXPECT_TRUE(parse_gemma4_value(std::string(200, '[')).is_discarded());  // depth limit, no crash
}

TEST(Gemma3Tools, WithoutToolsEqualsGemma3Template) {
  const std::vector<Message> m = {msg("system", "S "), msg("user", " u "), msg("assistant", "a"), msg("user", "v")};
  const std::vector<ChatMessage> plain = {{"system", "S "}, {"user", " u "}, {"assistant", "a"}, {"user", "v"}};
  EXPECT_EQ(render_gemma3_tools(m, {}, true), render_gemma3(plain, true));
}

// A system message alone (no user turn to fold it into) is the user turn, with the tools too; the
// fresh-user trial found its text dropped.
TEST(Gemma3Tools, SystemAloneIsTheUserTurn) {
  EXPECT_EQ(render_gemma3_tools({msg("system", " Be brief. ")}, {}, true),
            "<bos><start_of_turn>user\nBe brief.<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(render_gemma3_tools({msg("developer", "Be brief.")}, {}, false),
            "<bos><start_of_turn>user\nBe brief.<end_of_turn>\n");
  const std::string with_tools = render_gemma3_tools({msg("system", "S")}, {weather()}, true);
  EXPECT_EQ(with_tools.rfind("<bos><start_of_turn>user\nS\n\nYou can call these functions", 0), 0u) << with_tools;
  EXPECT_NE(with_tools.find("get_weather"), std::string::npos);
  EXPECT_EQ(with_tools.substr(with_tools.size() - 52), "</tool_response>.<end_of_turn>\n<start_of_turn>model\n");
  // nothing to say: no turn
  EXPECT_EQ(render_gemma3_tools({msg("system", " ")}, {}, true), "<bos><start_of_turn>model\n");
  const std::vector<ChatMessage> plain = {{"system", " Be brief. "}};
  EXPECT_EQ(render_gemma3_tools({msg("system", " Be brief. ")}, {}, true), render_gemma3(plain, true));
}

TEST(Gemma3Tools, CallsAndResponses) {
  Message call = msg("assistant", "");
  call.tool_calls.push_back({"c1", "get_weather", json{{"city", "Paris"}}});
  Message r1 = msg("tool", "18 C");
  r1.tool_call_id = "c1";
  Message r2 = msg("tool", "windy");
  r2.name = "get_wind";
  const std::string out = render_gemma3_tools({msg("user", "W?"), call, r1, r2}, {}, true);
  EXPECT_EQ(out,
            "<bos><start_of_turn>user\nW?<end_of_turn>\n"
            "<start_of_turn>model\n<tool_call>{\"arguments\":{\"city\":\"Paris\"},\"name\":\"get_weather\"}</tool_call>"
            "<end_of_turn>\n<start_of_turn>user\n<tool_response name=\"get_weather\">18 C</tool_response>\n"
            "<tool_response name=\"get_wind\">windy</tool_response><end_of_turn>\n<start_of_turn>model\n");
  EXPECT_THROW(render_gemma3_tools({msg("user", "a"), msg("user", "b")}, {}, true), kestrel::Error);
}

namespace {

// Feeds `text` in pieces of `step` bytes; returns the events with same-kind neighbours merged.
std::vector<ReplyEvent> feed_in_pieces(ReplyFormat f, const std::string& text, size_t step) {
  ReplyParser p(f, true);
  std::vector<ReplyEvent> all;
  auto add = [&](std::vector<ReplyEvent> ev) {
    for (auto& e : ev) {
      if (!all.empty() && all.back().kind == e.kind && e.kind != ReplyEvent::Kind::kToolCall) {
        all.back().text += e.text;
      } else {
        all.push_back(e);
      }
    }
  };
  for (size_t i = 0; i < text.size(); i += step) add(p.feed(text.substr(i, step)));
  add(p.finish());
  return all;
}

}  // namespace

TEST(ReplyParser, Gemma4CallsAndThinkingAnyChunking) {
  const std::string reply =
      "<|channel>thought\nplan<channel|>Let me check.<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,"
      "opts:{days:2}}<tool_call|>";
  for (size_t step : {1, 2, 3, 7, 1000}) {
    const auto ev = feed_in_pieces(ReplyFormat::kGemma4, reply, step);
    ASSERT_EQ(ev.size(), 3u) << step;
    EXPECT_EQ(ev[0].kind, ReplyEvent::Kind::kReasoning);
    EXPECT_EQ(ev[0].text, "plan");
    EXPECT_EQ(ev[1].text, "Let me check.");
    EXPECT_EQ(ev[2].kind, ReplyEvent::Kind::kToolCall);
    EXPECT_EQ(ev[2].call.name, "get_weather");
    EXPECT_EQ(ev[2].call.arguments, json::parse(R"({"city":"Paris","opts":{"days":2}})"));
  }
}

TEST(ReplyParser, Gemma3CallsAndBrokenCallsStayContent) {
  auto ev = parse_reply(ReplyFormat::kGemma3, true,
                        "Sure. <tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>");
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].text, "Sure. ");
  EXPECT_EQ(ev[1].call.name, "f");
  EXPECT_EQ(ev[1].call.arguments, json({{"x", 1}}));
  ev = parse_reply(ReplyFormat::kGemma3, true, "a <tool_call>{not json}</tool_call> b <tool_ca");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].text, "a <tool_call>{not json}</tool_call> b <tool_ca");
  // without tools, markers are plain text
  ev = parse_reply(ReplyFormat::kGemma3, false, "<tool_call>{\"name\":\"f\"}</tool_call>");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, ReplyEvent::Kind::kContent);
}

TEST(ReplyParser, Gemma3ClosingTagInsideAStringArgument) {
  // A free-form string argument may hold the closing tag (found in CI: a forced call of a
  // function without parameters); the call ends at the tag after its JSON body, in any chunking.
  const std::string reply =
      "<tool_call>{\"name\": \"ping\", \"arguments\": {\"desc\": \"a \\\"q\\\" </tool_call>\", "
      "\"n\": {}}}</tool_call> after";
  for (size_t step : {1, 2, 5, 1000}) {
    const auto ev = feed_in_pieces(ReplyFormat::kGemma3, reply, step);
    ASSERT_EQ(ev.size(), 2u) << step;
    EXPECT_EQ(ev[0].kind, ReplyEvent::Kind::kToolCall);
    EXPECT_EQ(ev[0].call.name, "ping");
    EXPECT_EQ(ev[0].call.arguments, json::parse(R"({"desc": "a \"q\" </tool_call>", "n": {}})"));
    EXPECT_EQ(ev[1].text, " after");
  }
  // An unterminated string holds the call open to the end, then it is content, verbatim.
  const auto ev = parse_reply(ReplyFormat::kGemma3, true, "<tool_call>{\"name\": \"f</tool_call> b");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].text, "<tool_call>{\"name\": \"f</tool_call> b");
}

TEST(ReplyParser, HoldsBackOnlyPossibleMarkers) {
  ReplyParser p(ReplyFormat::kGemma3, true);
  auto ev = p.feed("abc <tool");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].text, "abc ");
  ev = p.feed("box>");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].text, "<toolbox>");
}
