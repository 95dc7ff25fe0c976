// Forced tool calls: with tool_choice "required" or a named function, the reply must be one
// call (or, "required" with parallel_tool_calls: true, up to kMaxParallelToolCalls calls) in the model's
// tool-call format, its arguments valid for the function's parameters. The grammar is
// enforced while sampling (runtime::GrammarCompiler); docs/serving.md#forced-tool-calls.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kestrel/runtime/grammar.h"
#include "kestrel/server/chat_prompt.h"
#include "kestrel/server/request.h"
#include "kestrel/text/chat_tools.h"
#include "kestrel/text/tokenizer.h"

namespace kestrel::server {

/// At most this many calls in one forced reply with parallel_tool_calls: true.
inline constexpr size_t kMaxParallelToolCalls = 8;

/// Which calls a forced reply may make.
struct ForcedToolChoice {
  const std::vector<text::ToolDefinition>& tools;
  std::string name;       // the named function; empty: any of `tools` ("required")
  bool parallel = true;   // 1 to kMaxParallelToolCalls calls instead of exactly 1
};

/// Gemma 3 (Kestrel's format): an xgrammar structural tag for
///   <tool_call>{"name": "NAME", "arguments": ARGS}</tool_call>
/// (calls separated by "\n"), ARGS matching the function's parameters as a JSON Schema
/// (xgrammar's converter, strict: no properties beyond those listed unless
/// additionalProperties says so; at most one whitespace character between tokens). Absent or
/// empty parameters: any JSON object. Throws runtime::InvalidGrammar naming the tool for a
/// parameters schema check_json_schema refuses or that is not an object schema.
std::string gemma3_tool_structural_tag(const ForcedToolChoice& choice);

/// The control tokens a Gemma 4 call is written with.
struct Gemma4ToolTokens {
  runtime::TokenId call_open = -1;   // <|tool_call>
  runtime::TokenId call_close = -1;  // <tool_call|>
  runtime::TokenId quote = -1;       // <|"|>
};

/// Gemma 4 (native format): GBNF-style grammar text (xgrammar EBNF, root rule "root") for
///   <|tool_call>call:NAME{key:value,...}<tool_call|>
/// (parallel calls follow each other directly, as render_gemma4 writes them), the markers and
/// string quotes matched as the control tokens themselves (xgrammar's Token(id); compile with
/// GrammarSpec::control_tokens_as_text). Keys bare and sorted, optional ones omittable; string
/// bodies never contain "<|" or "|>" (which would read as a marker). Supported keywords: type
/// (one or a list), properties, required, additionalProperties false, items, minItems,
/// maxItems, enum, const (scalars), maxLength, nullable, minimum 0/1 alone or an integer
/// minimum..maximum range of at most 256 values; annotations (description, title, default,
/// examples, $comment, format-free metadata) are ignored. Anything else throws
/// runtime::InvalidGrammar naming the tool and the keyword.
std::string gemma4_tool_grammar(const ForcedToolChoice& choice, const Gemma4ToolTokens& tokens);

/// True when the chat request forces a call: tools given and tool_choice "required" or named.
bool forces_tool_call(const GenerationRequest& request);

/// The GrammarSpec of a forced reply for the chat template (Gemma 4's needs the tokenizer's
/// marker tokens). Throws runtime::InvalidGrammar as the functions above.
runtime::GrammarSpec forced_tool_grammar(ChatTemplate chat_template, const GenerationRequest& request,
                                         const text::Tokenizer& tokenizer);

}  // namespace kestrel::server
