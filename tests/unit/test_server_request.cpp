// Request validation and OpenAI response/stream shaping of the server layer.
#include <gtest/gtest.h>

#include <cmath>

#include "kestrel/runtime/logprobs.h"
#include "kestrel/runtime/sampler.h"
#include "kestrel/server/api_error.h"
#include "kestrel/server/metrics.h"
#include "kestrel/server/openai_format.h"
#include "kestrel/server/request.h"

using nlohmann::json;
using namespace kestrel::server;

namespace {

// The 400's param for a chat body, or "" when it is accepted.
std::string chat_error(const std::string& body) {
  try {
    parse_chat_request(json::parse(body));
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.body()["error"]["type"], "invalid_request_error");
    return e.body()["error"]["param"].is_null() ? "(none)" : e.body()["error"]["param"].get<std::string>();
  }
  return "";
}

const char* kMsgs = R"("messages":[{"role":"user","content":"hi"}])";

std::string with(const std::string& field) { return std::string("{") + kMsgs + "," + field + "}"; }

}  // namespace

TEST(ChatRequest, DefaultsAndFields) {
  const auto r = parse_chat_request(json::parse(with(
      R"("model":"m","max_tokens":5,"max_completion_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":3,"min_p":0.1,
         "seed":-1,"stop":"x","stream":true,"stream_options":{"include_usage":true},"ignore_eos":true,"min_tokens":2,
         "cache_prompt":false,"logprobs":true,"top_logprobs":4,"presence_penalty":0.5,"frequency_penalty":-1,"user":"u","extra":[1])")));
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(*r.max_tokens, 7u);  // max_completion_tokens wins
  EXPECT_FLOAT_EQ(r.sampler.temperature, 0.5f);
  EXPECT_EQ(r.sampler.top_k, 3);
  EXPECT_EQ(*r.seed, UINT64_MAX);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(r.stream && r.include_usage && r.ignore_eos);
  EXPECT_EQ(r.min_tokens, 2u);
  EXPECT_FALSE(r.cache_prompt);
  EXPECT_EQ(r.top_logprobs, 4);
  EXPECT_FLOAT_EQ(r.sampler.frequency_penalty, -1.0f);
  const auto d = parse_chat_request(json::parse(std::string("{") + kMsgs + "}"));
  EXPECT_FLOAT_EQ(d.sampler.temperature, 1.0f);  // OpenAI's defaults
  EXPECT_FLOAT_EQ(d.sampler.top_p, 1.0f);
  EXPECT_EQ(d.sampler.top_k, 0);
  EXPECT_FALSE(d.max_tokens.has_value());
  EXPECT_EQ(d.top_logprobs, -1);
  EXPECT_TRUE(d.cache_prompt);  // llama-server's default
  EXPECT_NE(chat_error(with(R"("cache_prompt":1)")), "");
  // null is absent
  EXPECT_EQ(chat_error(with(R"("temperature":null,"stop":null,"tools":null)")), "");
}

TEST(ChatRequest, WrongTypesAndRangesNameTheField) {
  EXPECT_EQ(chat_error(with(R"("temperature":"hot")")), "temperature");
  EXPECT_EQ(chat_error(with(R"("temperature":3)")), "temperature");
  EXPECT_EQ(chat_error(with(R"("max_tokens":1.5)")), "max_tokens");
  EXPECT_EQ(chat_error(with(R"("max_tokens":-1)")), "max_tokens");
  EXPECT_EQ(chat_error(with(R"("max_tokens":5.0)")), "");  // integral floats are integers
  EXPECT_EQ(chat_error(with(R"("seed":18446744073709551615)")), "seed");
  EXPECT_EQ(chat_error(with(R"("stream":"yes")")), "stream");
  EXPECT_EQ(chat_error(with(R"("stop":[1])")), "stop");
  EXPECT_EQ(chat_error(with(R"("stop":[""])")), "stop");
  EXPECT_EQ(chat_error(with(R"("n":2)")), "");
  EXPECT_EQ(chat_error(with(R"("n":17)")), "n");
  EXPECT_EQ(chat_error(with(R"("n":2,"stream":true)")), "n");
  EXPECT_EQ(chat_error(with(R"("best_of":2)")), "best_of");  // completions only
  EXPECT_EQ(chat_error(with(R"("top_logprobs":2)")), "top_logprobs");  // needs logprobs
  EXPECT_EQ(chat_error(with(R"("logprobs":true,"top_logprobs":21)")), "top_logprobs");
  EXPECT_EQ(chat_error(with(R"("response_format":{"type":"json_schema"})")), "response_format.json_schema");
  EXPECT_EQ(chat_error(with(R"("response_format":{"type":"json_schema","json_schema":{"name":"x"}})")),
            "response_format.json_schema.schema");
  EXPECT_EQ(chat_error(with(R"("response_format":{"type":"json_schema","json_schema":{"schema":{},"strict":1}})")),
            "response_format.json_schema.strict");
  EXPECT_EQ(chat_error(with(R"("response_format":{"type":"json_schema","json_schema":{"schema":{}}})")), "");
  EXPECT_EQ(chat_error(with(R"("response_format":{"type":"json_object"})")), "");
  EXPECT_EQ(chat_error(with(R"("response_format":{"type":"yaml"})")), "response_format.type");
  EXPECT_EQ(chat_error(with(R"("grammar":5)")), "grammar");
  EXPECT_EQ(chat_error(with(R"("grammar":"")")), "grammar");
  EXPECT_EQ(chat_error(with(R"("json_schema":"{}")")), "json_schema");
  // one constraint at a time
  EXPECT_EQ(chat_error(with(R"("grammar":"root ::= \"a\"","json_schema":{})")), "grammar");
  EXPECT_EQ(chat_error(with(R"("response_format":{"type":"json_object"},"grammar":"root ::= \"a\"")")), "grammar");
  EXPECT_EQ(chat_error(with(R"("structured_outputs":{"choice":[]})")), "structured_outputs.choice");
  EXPECT_EQ(chat_error(with(R"("guided_regex":"")")), "guided_regex");
  EXPECT_EQ(chat_error(with(R"("guided_json":{},"guided_regex":"a")")), "guided_regex");
}

TEST(ChatRequest, VllmStructuredOutputs) {
  const auto choice = parse_chat_request(json::parse(with(R"x("guided_choice":["a.b","c|d","(e)"])x")));
  ASSERT_TRUE(choice.grammar);
  EXPECT_EQ(choice.grammar->kind, kestrel::runtime::GrammarSpec::Kind::kRegex);
  EXPECT_EQ(choice.grammar->text, R"((a\.b|c\|d|\(e\)))");
  const auto so = parse_chat_request(json::parse(with(R"("structured_outputs":{"json":{"type":"object","b":1,"a":2}})")));
  ASSERT_TRUE(so.grammar);
  EXPECT_EQ(so.grammar->kind, kestrel::runtime::GrammarSpec::Kind::kJsonSchema);
  EXPECT_EQ(so.schema_pointer, "/structured_outputs/json");
  // Every JSON Schema is compiled closed (xgrammar's strict_mode), "strict" or not.
  EXPECT_TRUE(so.grammar->strict);
  for (const char* f : {R"("json_schema":{"type":"object"})", R"("guided_json":{"type":"object"})",
                        R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}})",
                        R"("response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object"},"strict":false}})"}) {
    const auto r = parse_chat_request(json::parse(with(f)));
    ASSERT_TRUE(r.grammar) << f;
    EXPECT_TRUE(r.grammar->strict) << f;
  }
  // The schema re-read in the client's key order
  EXPECT_EQ(schema_in_client_order(with(R"("structured_outputs":{"json":{"type":"object","b":1,"a":2}})"),
                                   so.schema_pointer),
            R"({"type":"object","b":1,"a":2})");
  EXPECT_EQ(chat_error(with(R"("tools":{})")), "tools");
  EXPECT_EQ(chat_error(with(R"("tool_choice":"sometimes")")), "tool_choice");
  EXPECT_EQ(chat_error(with(R"("tool_choice":"required")")), "tool_choice");  // without tools
  EXPECT_EQ(chat_error(R"({"messages":[]})"), "messages");
  EXPECT_EQ(chat_error(R"({"messages":[{"content":"x"}]})"), "messages[0].role");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})"), "messages[0].content");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":5}]})"), "messages[0].content");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{bad"}}]}]})"),
            "messages[0].tool_calls[0]");
  EXPECT_EQ(chat_error("[1,2]"), "(none)");
}

// Only an assistant message may leave out content (a turn of tool calls); a user, system or tool
// message without it, or with null, is a 400 naming messages[i].content.
TEST(ChatRequest, ContentIsRequiredButForAssistants) {
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user"}]})"), "messages[0].content");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":null}]})"), "messages[0].content");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"system","content":"s"},{"role":"user","content":null}]})"),
            "messages[1].content");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"system"},{"role":"user","content":"x"}]})"), "messages[0].content");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"developer","content":null},{"role":"user","content":"x"}]})"),
            "messages[0].content");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,
      "tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c"}]})"),
            "messages[2].content");
  try {
    parse_chat_request(json::parse(R"({"messages":[{"role":"user","content":null}]})"));
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_NE(std::string(e.what()).find("messages[0].content is required"), std::string::npos) << e.what();
  }
  // still valid: an empty string, an assistant turn of tool calls with null or no content
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":""}]})"), "");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,
      "tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}]})"),
            "");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":"x"},{"role":"assistant",
      "tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}]})"),
            "");
}

TEST(ChatRequest, ContentPartsToolsAndToolMessages) {
  const auto r = parse_chat_request(json::parse(R"({
    "messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
                {"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function",
                   "function":{"name":"f","arguments":"{\"x\":1}"}}]},
                {"role":"tool","tool_call_id":"c","content":"r"}],
    "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],
    "tool_choice":{"type":"function","function":{"name":"f"}}})"));
  EXPECT_EQ(r.messages[0].content, "ab");
  EXPECT_EQ(r.messages[1].tool_calls[0].arguments, json({{"x", 1}}));
  EXPECT_EQ(r.messages[2].tool_call_id, "c");
  EXPECT_EQ(r.tool_choice, "f");
  EXPECT_EQ(r.tools.size(), 1u);
  const auto none = parse_chat_request(json::parse(
      std::string("{") + kMsgs + R"(,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none"})"));
  EXPECT_TRUE(none.tools.empty());
  // OpenAI: omitting parameters defines a function with an empty parameter list; {} stays the
  // schema that admits anything.
  const auto absent = parse_chat_request(json::parse(
      std::string("{") + kMsgs + R"(,"tools":[{"type":"function","function":{"name":"f"}},
        {"type":"function","function":{"name":"g","parameters":{}}}],"tool_choice":"required"})"));
  ASSERT_EQ(absent.tools.size(), 2u);
  EXPECT_EQ(absent.tools[0].parameters, json::parse(R"({"type":"object","properties":{}})"));
  EXPECT_EQ(absent.tools[1].parameters, json::object());
}

TEST(CompletionRequest, PromptForms) {
  EXPECT_EQ(parse_completion_request(json::parse(R"({"prompt":"a"})")).prompt_texts, std::vector<std::string>{"a"});
  EXPECT_EQ(parse_completion_request(json::parse(R"({"prompt":["a","b"]})")).prompt_texts.size(), 2u);
  EXPECT_EQ(parse_completion_request(json::parse(R"({"prompt":[2,3]})")).prompt_ids,
            (std::vector<std::vector<int32_t>>{{2, 3}}));
  EXPECT_EQ(parse_completion_request(json::parse(R"({"prompt":[[2],[3,4]]})")).prompt_ids.size(), 2u);
  EXPECT_EQ(parse_completion_request(json::parse(R"({"prompt":"a","logprobs":3})")).top_logprobs, 3);
  const auto scoring = parse_completion_request(json::parse(R"({"prompt":"a","echo":true,"prompt_logprobs":2})"));
  EXPECT_TRUE(scoring.echo);
  EXPECT_EQ(scoring.prompt_logprobs, 2);
  for (const char* bad : {R"({})", R"({"prompt":[]})", R"({"prompt":5})", R"({"prompt":[-1]})", R"({"prompt":["a",1]})",
                          R"({"prompt":[[]]})", R"({"prompt":"a","echo":true,"stream":true})", R"({"prompt":"a","logprobs":true})",
                          R"({"prompt":"a","prompt_logprobs":21})"}) {
    EXPECT_THROW(parse_completion_request(json::parse(bad)), ApiError) << bad;
  }
}

TEST(OpenAIFormat, SseFramingAndChunks) {
  const ResponseMeta meta{"chatcmpl-1", 1700000000, "m"};
  const json chunk = chat_chunk(meta, {{"content", "hé"}}, "", nullptr, true);
  const std::string event = sse_event(chunk);
  EXPECT_EQ(event.rfind("data: {", 0), 0u);
  EXPECT_EQ(event.substr(event.size() - 2), "\n\n");
  EXPECT_EQ(event.find('\n'), event.size() - 2);  // one line
  EXPECT_EQ(event.find('\r'), std::string::npos);
  const json back = json::parse(event.substr(6));
  EXPECT_EQ(back["object"], "chat.completion.chunk");
  EXPECT_EQ(back["choices"][0]["delta"]["content"], "hé");
  EXPECT_TRUE(back["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(back.contains("usage") && back["usage"].is_null());
  EXPECT_FALSE(chat_chunk(meta, json::object(), "stop", nullptr, false).contains("usage"));
  const json last = usage_chunk(meta, "chat.completion.chunk", usage_json(3, 4, 2));
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["total_tokens"], 7);
  EXPECT_EQ(last["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  // invalid UTF-8 (a token cut inside a character) never throws
  EXPECT_EQ(dump(json("a\xff")), "\"a\xEF\xBF\xBD\"");  // U+FFFD
}

TEST(Logprobs, LogSoftmaxTopN) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f};
  const auto lp = kestrel::runtime::compute_logprobs(logits, 2, 3);
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  EXPECT_NEAR(lp.chosen.logprob, 2.0 - std::log(z), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].token, 1);  // ties to the lower id
  EXPECT_EQ(lp.top[1].token, 3);
  EXPECT_EQ(lp.top[2].token, 2);
  EXPECT_NEAR(lp.top[0].logprob, 3.0 - std::log(z), 1e-6);
  EXPECT_TRUE(kestrel::runtime::compute_logprobs(logits, 0, 0).top.empty());
  EXPECT_EQ(kestrel::runtime::compute_logprobs(logits, 0, 99).top.size(), 4u);
  EXPECT_THROW(kestrel::runtime::compute_logprobs(logits, 4, 1), kestrel::Error);
}

TEST(Sampler, PresenceAndFrequencyPenalties) {
  kestrel::runtime::SamplerConfig c;
  c.temperature = 0;
  c.presence_penalty = 0.5f;
  c.frequency_penalty = 1.0f;
  kestrel::runtime::Sampler s(c);
  // token 0 seen twice: 10 - 2*1 - 0.5 = 7.5; token 1 once: 9 - 1 - 0.5 = 7.5; token 2 unseen: 8
  std::vector<float> logits = {10.0f, 9.0f, 8.0f};
  const std::vector<kestrel::runtime::TokenId> history = {0, 1, 0};
  EXPECT_EQ(s.sample(logits, history), 2);
  EXPECT_FLOAT_EQ(logits[0], 7.5f);
  EXPECT_FLOAT_EQ(logits[1], 7.5f);
}

TEST(Metrics, PrometheusText) {
  Metrics m;
  m.request("chat", 200);
  m.request("chat", 400);
  m.response(404);
  m.response(404);
  m.response(200);
  m.tokens(10, 5);
  m.ttft(0.03);
  m.load(1, 3);
  m.prompt_cache(7);
  m.prompt_cache(0);
  m.sessions(4, 1024);
  const std::string t = m.render();
  EXPECT_NE(t.find("kestrel_requests_total{endpoint=\"chat\",status=\"400\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("kestrel_http_responses_total{status=\"404\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("kestrel_http_responses_total{status=\"200\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("kestrel_generation_tokens_total 5\n"), std::string::npos);
  EXPECT_NE(t.find("kestrel_queue_depth 1\n"), std::string::npos);
  EXPECT_NE(t.find("kestrel_requests_running 3\n"), std::string::npos);
  EXPECT_NE(t.find("kestrel_prompt_cache_requests_total{result=\"hit\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("kestrel_prompt_cache_requests_total{result=\"miss\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("kestrel_prompt_tokens_cached_total 7\n"), std::string::npos);
  EXPECT_NE(t.find("kestrel_sessions 4\n"), std::string::npos);
  EXPECT_NE(t.find("kestrel_time_to_first_token_seconds_bucket{le=\"0.025\"} 0\n"), std::string::npos);
  EXPECT_NE(t.find("kestrel_time_to_first_token_seconds_bucket{le=\"0.05\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("kestrel_time_to_first_token_seconds_count 1\n"), std::string::npos);
  // The process's resident memory, read from /proc: a running test holds some.
  const size_t rss = t.find("\nprocess_resident_memory_bytes ");
  ASSERT_NE(rss, std::string::npos);
  EXPECT_GT(std::stoull(t.substr(rss + 31)), 1000000u);
}

TEST(ChatRequest, NestingDepth) {
  EXPECT_EQ(json_nesting_depth(R"({"a":[1,{"b":"[[[{"}]]})"), 3u);
  EXPECT_EQ(json_nesting_depth(R"("\"[")"), 0u);
  EXPECT_EQ(json_nesting_depth(std::string(100000, '[')), 100000u);
}
