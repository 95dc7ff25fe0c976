// Forced tool calls: the grammar text for Gemma 4 and the structural tag for Gemma 3
// (server/tool_grammar.h). Whether xgrammar compiles and enforces them is tested end to end in
// tests/python/test_serve_tools_forced.py.
#include <gtest/gtest.h>

#include "kestrel/runtime/grammar.h"
#include "kestrel/server/chat_prompt.h"
#include "kestrel/server/request.h"
#include "kestrel/server/tool_grammar.h"

using nlohmann::json;
using namespace kestrel;
using namespace kestrel::server;

namespace {

text::ToolDefinition tool(std::string name, const char* parameters) {
  return {std::move(name), "", parameters ? json::parse(parameters) : json::object()};
}

const Gemma4ToolTokens kTokens{7, 8, 11};

std::string throws_where(const std::function<void()>& f) {
  try {
    f();
  } catch (const runtime::InvalidGrammar& e) {
    return std::string(e.what()) + " @" + e.where();
  }
  return "no error";
}

}  // namespace

TEST(ToolGrammar, Gemma4OneToolExactText) {
  std::vector<text::ToolDefinition> tools = {
      tool("get_weather", R"({"type":"object","properties":{"city":{"type":"string","description":"City"},
            "unit":{"type":"string","enum":["C","F"]}},"required":["city"]})")};
  const std::string g = gemma4_tool_grammar({tools, "", false}, kTokens);
  // One call, no repetition; markers and quotes as token ids.
  EXPECT_NE(g.find("root ::= g4_call\n"), std::string::npos) << g;
  EXPECT_NE(g.find("g4_call ::= g4_call0\n"), std::string::npos) << g;
  EXPECT_NE(g.find("g4_q ::= Token(11)\n"), std::string::npos) << g;
  EXPECT_NE(g.find("g4_call0 ::= Token(7) \"call:get_weather\" t0_obj0 Token(8)\n"), std::string::npos) << g;
  // Sorted keys; city required, unit optional (an enum of quoted strings).
  EXPECT_NE(g.find("t0_obj0 ::= \"{\" t0_obj0_f0 \"}\"\n"), std::string::npos) << g;
  EXPECT_NE(g.find("t0_obj0_f0 ::= \"city:\" g4_str t0_obj0_a1\n"), std::string::npos) << g;
  EXPECT_NE(g.find("t0_obj0_a1 ::= \",\" \"unit:\" ((Token(11) \"C\" Token(11)) | (Token(11) \"F\" Token(11))) \"\" | "
                   "\"\"\n"),
            std::string::npos)
      << g;
}

TEST(ToolGrammar, Gemma4RequiredParallelAndTypes) {
  std::vector<text::ToolDefinition> tools = {
      tool("search", R"({"type":"object","properties":{"q":{"type":"string","maxLength":40},
            "n":{"type":"integer","minimum":1,"maximum":3},"tags":{"type":"array","items":{"type":"string"},"maxItems":4},
            "exact":{"type":"boolean"},"score":{"type":"number","minimum":0},
            "where":{"type":"object","properties":{"lat":{"type":"number"}},"required":["lat"]}},
            "required":["q","n"]})"),
      tool("ping", nullptr)};
  const std::string g = gemma4_tool_grammar({tools, "", true}, kTokens);
  EXPECT_NE(g.find("root ::= (g4_call){1,8}\n"), std::string::npos) << g;
  EXPECT_NE(g.find("g4_call ::= g4_call0 | g4_call1\n"), std::string::npos) << g;
  EXPECT_NE(g.find("[max_chars=40] ::= g4_chars"), std::string::npos) << g;
  EXPECT_NE(g.find("(\"1\" | \"2\" | \"3\")"), std::string::npos) << g;
  EXPECT_NE(g.find("(\"[\" (g4_str (\",\" g4_str){0,3})? \"]\")"), std::string::npos) << g;
  EXPECT_NE(g.find("(\"true\" | \"false\")"), std::string::npos) << g;
  EXPECT_NE(g.find("(g4_uint (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?)"), std::string::npos) << g;
  // Absent parameters: any object.
  EXPECT_NE(g.find("g4_call1 ::= Token(7) \"call:ping\" g4_obj Token(8)\n"), std::string::npos) << g;
  // Named: only that function.
  const std::string named = gemma4_tool_grammar({tools, "ping", false}, kTokens);
  EXPECT_EQ(named.find("call:search"), std::string::npos) << named;
  EXPECT_NE(named.find("call:ping"), std::string::npos) << named;
}

TEST(ToolGrammar, Gemma4RefusesWhatItCannotExpress) {
  auto refuse = [](const char* parameters) {
    std::vector<text::ToolDefinition> tools = {tool("f", parameters)};
    return throws_where([&] { gemma4_tool_grammar({tools, "", false}, kTokens); });
  };
  EXPECT_EQ(refuse(R"({"type":"object","properties":{"a":{"type":"string","pattern":"^x$"}}})"),
            "tools[0] (f): 'pattern' at parameters/properties/a is not supported in the Gemma 4 tool format @pattern");
  EXPECT_EQ(refuse(R"({"type":"object","properties":{"a":{"anyOf":[{"type":"string"}]}}})"),
            "tools[0] (f): 'anyOf' at parameters/properties/a is not supported in the Gemma 4 tool format @anyOf");
  EXPECT_NE(refuse(R"({"type":"object","properties":{"a":{"type":"integer","minimum":5}}})").find("@minimum"),
            std::string::npos);
  EXPECT_NE(refuse(R"({"type":"object","properties":{"a b":{"type":"integer"}}})").find("bare Gemma 4 key"),
            std::string::npos);
  EXPECT_NE(refuse(R"({"type":"object","properties":{"a":{"type":"string"}},"required":["b"]})").find("@required"),
            std::string::npos);
  EXPECT_NE(refuse(R"({"type":"array"})").find("must be an object schema"), std::string::npos);
}

TEST(ToolGrammar, Gemma3StructuralTag) {
  std::vector<text::ToolDefinition> tools = {
      tool("get_weather", R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})"),
      tool("ping", nullptr)};
  const json one = json::parse(gemma3_tool_structural_tag({tools, "get_weather", false}));
  EXPECT_EQ(one["type"], "structural_tag");
  const json& tag = one["format"];
  EXPECT_EQ(tag["type"], "tag");
  EXPECT_EQ(tag["begin"], "<tool_call>{\"name\": \"get_weather\", \"arguments\": ");
  EXPECT_EQ(tag["end"], "}</tool_call>");
  EXPECT_EQ(tag["content"]["json_schema"]["required"], json::array({"city"}));
  EXPECT_EQ(tag["content"]["max_whitespace_cnt"], 1);

  const json any = json::parse(gemma3_tool_structural_tag({tools, "", true}));
  const json& seq = any["format"];
  EXPECT_EQ(seq["type"], "sequence");
  EXPECT_EQ(seq["elements"][0]["type"], "or");
  EXPECT_EQ(seq["elements"][0]["elements"].size(), 2u);
  EXPECT_EQ(seq["elements"][0]["elements"][1]["content"]["json_schema"],
            json::parse(R"({"type":"object","additionalProperties":true})"));
  EXPECT_EQ(seq["elements"][1]["type"], "repeat");
  EXPECT_EQ(seq["elements"][1]["max"], static_cast<int>(kMaxParallelToolCalls) - 1);
  EXPECT_EQ(seq["elements"][1]["content"]["elements"][0]["value"], "\n");

  std::vector<text::ToolDefinition> bad = {tool("ok", nullptr),
                                           tool("f", R"({"type":"object","properties":{"a":{"not":{}}}})")};
  const std::string err = throws_where([&] { gemma3_tool_structural_tag({bad, "", false}); });
  EXPECT_EQ(err.rfind("tools[1] (f): parameters: ", 0), 0u) << err;
  EXPECT_NE(err.find("not"), std::string::npos) << err;
}

TEST(ToolGrammar, OneCallUnlessParallelToolCallsIsTrue) {
  // OpenAI's meaning as llama-server serves it: one call by default, several only with
  // parallel_tool_calls: true, and exactly one for a named function whatever it says.
  const char* tools =
      R"("tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
         "properties":{"city":{"type":"string"}},"required":["city"]}}}])";
  auto spec = [&](const std::string& extra) {
    const GenerationRequest r = parse_chat_request(json::parse(
        std::string(R"({"messages":[{"role":"user","content":"hi"}],)") + tools + "," + extra + "}"));
    const json tag = json::parse(gemma3_tool_structural_tag(
        {r.tools, r.tool_choice_named ? r.tool_choice : std::string(), r.parallel_tool_calls && !r.tool_choice_named}));
    return tag["format"]["type"].get<std::string>();  // "tag": one call; "sequence": 1 to 8
  };
  const std::string named = R"("tool_choice":{"type":"function","function":{"name":"get_weather"}})";
  EXPECT_EQ(spec(R"("tool_choice":"required")"), "tag");
  EXPECT_EQ(spec(R"("tool_choice":"required","parallel_tool_calls":false)"), "tag");
  EXPECT_EQ(spec(R"("tool_choice":"required","parallel_tool_calls":true)"), "sequence");
  EXPECT_EQ(spec(named), "tag");
  EXPECT_EQ(spec(named + R"(,"parallel_tool_calls":true)"), "tag");
  // forced_tool_grammar makes the same choice from the request.
  const GenerationRequest r = parse_chat_request(json::parse(
      std::string(R"({"messages":[{"role":"user","content":"hi"}],)") + tools + "," + named +
      R"(,"parallel_tool_calls":true})"));
  EXPECT_FALSE(r.parallel_tool_calls && !r.tool_choice_named);
  // ChatPrompt's bound on returned calls (tool_choice auto drops the calls past it).
  EXPECT_EQ(build_chat_prompt(ChatTemplate::kGemma3, r).max_tool_calls, 1u);
  const GenerationRequest p = parse_chat_request(json::parse(
      std::string(R"({"messages":[{"role":"user","content":"hi"}],)") + tools + R"(,"parallel_tool_calls":true})"));
  EXPECT_EQ(build_chat_prompt(ChatTemplate::kGemma3, p).max_tool_calls, SIZE_MAX);
  const GenerationRequest a = parse_chat_request(json::parse(
      std::string(R"({"messages":[{"role":"user","content":"hi"}],)") + tools + "}"));
  EXPECT_EQ(build_chat_prompt(ChatTemplate::kGemma3, a).max_tool_calls, 1u);
}
