// kestrel run: one prompt in, the answer streamed out.
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "kestrel/base/error.h"
#include "kestrel/head/flashhead.h"
#include "kestrel/kernels/gemm_w4_amx_bf16.h"
#include "kestrel/kernels/int8_isa.h"
#include "kestrel/runtime/grammar.h"
#include "kestrel/runtime/kernels_report.h"
#include "kestrel/text/chat_template.h"

namespace kestrel::tools {
namespace {

struct RunOptions {
  ModelOptions model;
  SamplingOptions sampling;
  std::string prompt;
  std::string file;
  std::string token_ids_file;
  std::string system;
  bool raw = false;
  bool chat = false;
  bool json = false;
  std::string json_schema_file;  // structured output: a JSON Schema,
  std::string grammar_file;      // a GBNF/EBNF grammar (Lark when the name ends in .lark),
  std::string regex;             // or a regular expression
};

constexpr uintmax_t kMaxPromptFileBytes = 64u << 20;

// A prompt, token id, schema or grammar file ("-": standard input), at most kMaxPromptFileBytes.
std::string read_file(const std::string& path) { return read_input_file(path, kMaxPromptFileBytes, "prompt files"); }

std::vector<runtime::TokenId> read_token_ids(const std::string& path) {
  std::istringstream in(read_file(path));
  std::vector<runtime::TokenId> ids;
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(word.c_str(), &end, 10);
    if (*end != '\0' || errno != 0 || v < 0 || v > INT32_MAX) {
      throw Error(path + ": '" + word + "' is not a token id (expected whitespace-separated "
                  "integers from 0)");
    }
    ids.push_back(static_cast<runtime::TokenId>(v));
  }
  return ids;
}

std::optional<runtime::GrammarSpec> grammar_spec(const RunOptions& o) {
  using Kind = runtime::GrammarSpec::Kind;
  if (!o.json_schema_file.empty()) return runtime::GrammarSpec{Kind::kJsonSchema, read_file(o.json_schema_file)};
  if (!o.grammar_file.empty()) {
    const bool lark = std::filesystem::path(o.grammar_file).extension() == ".lark";
    return runtime::GrammarSpec{lark ? Kind::kLark : Kind::kEbnf, read_file(o.grammar_file)};
  }
  if (!o.regex.empty()) return runtime::GrammarSpec{Kind::kRegex, o.regex};
  return std::nullopt;
}

int run(const RunOptions& o) {
  const auto load_start = std::chrono::steady_clock::now();
  runtime::Engine engine = o.model.load();
  const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - load_start).count();
  o.sampling.load_draft(engine, o.model);
  std::vector<runtime::TokenId> prompt;
  if (!o.token_ids_file.empty()) {
    prompt = read_token_ids(o.token_ids_file);
  } else {
    const std::string text = o.file.empty() ? o.prompt : read_file(o.file);
    // As llama.cpp's tools do: the chat template for models that carry one (instruction-tuned),
    // plain continuation for base models such as the default Gemma 3 270M.
    const bool use_template = !o.raw && (o.chat || engine.has_chat_template());
    if (!use_template) {
      if (!o.system.empty()) {
        std::fprintf(stderr, "kestrel: warning: --system is ignored without the chat template (add --chat)\n");
      }
      // Allowed, as llama.cpp allows it (a base model generates unconditionally), but said.
      if (text.empty()) std::fprintf(stderr, "kestrel: note: the prompt is empty; generating from BOS alone\n");
      prompt = engine.encode(text, /*special=*/false);
    } else {
      std::vector<text::ChatMessage> messages;
      if (!o.system.empty()) messages.push_back({"system", o.system});
      messages.push_back({"user", text});
      prompt = engine.tokenizer().encode(text::render_gemma3(messages, true), false, true);
    }
  }
  auto options = o.sampling.generate_options();
  if (auto spec = grammar_spec(o)) {
    try {
      options.grammar = engine.grammars().compile(*spec);
    } catch (const runtime::InvalidGrammar& e) {
      // Name the file ("the JSON schema is not valid JSON" alone does not say which).
      const std::string& file = !o.json_schema_file.empty() ? o.json_schema_file : o.grammar_file;
      if (file.empty()) throw;
      throw runtime::InvalidGrammar((file == "-" ? std::string("standard input (-)") : file) + ": " + e.what(),
                                    e.where());
    }
  }
  runtime::GenerateResult result;
  if (o.json) {
    const head::FlashHead* flash = engine.flashhead();
    const head::ProofStats before = flash != nullptr ? flash->proof_stats() : head::ProofStats{};
    result = engine.generate(prompt, options);
    nlohmann::json j = {{"prompt_tokens", result.prompt_tokens},
                        {"cached_tokens", result.cached_tokens},
                        {"tokens", result.tokens},
                        {"text", result.text},
                        {"finish_reason", result.finish_reason},
                        {"ttft_ms", result.ttft_ms},
                        {"prefill_tok_s", result.prefill_tok_s},
                        {"decode_tok_s", result.decode_tok_s},
                        {"drafted_tokens", result.drafted_tokens},
                        {"accepted_tokens", result.accepted_tokens},
                        {"grammar_exact_steps", result.grammar_exact_steps},
                        {"grammar_dense_steps", result.grammar_dense_steps}};
    // What one decode step reads (weights, head, KV cache at the last position) and, without
    // drafts (one step a token), the read rate that decode_tok_s implies.
    const size_t read_bytes = engine.decode_read_bytes(engine.cache());
    j["decode_read_bytes"] = read_bytes;
    // Opening the model file to a ready engine (mmap, load copies, tokenizer), milliseconds.
    j["load_ms"] = load_ms;
    // A GGUF at --precision auto: its cached image mapped ("hit"), written by this run
    // ("written", load_ms then includes the conversion), or not used ("off").
    j["image_cache"] = o.model.image_cache;
    // The KV cache: its element types (--cache-type-k / -v), the bytes it holds for the whole
    // context, and the part of decode_read_bytes it is.
    j["kv_cache_type"] = model::kv_types_name(engine.cache().types());
    j["kv_cache_bytes"] = engine.cache().bytes();
    j["kv_read_bytes"] = engine.cache().read_bytes();
    j["decode_read_gb_s"] = result.drafted_tokens == 0 && result.decode_tok_s > 0
                                ? nlohmann::json(static_cast<double>(read_bytes) * result.decode_tok_s / 1e9)
                                : nlohmann::json(nullptr);
    // Which products ran on int8 activations, and on which kernel (--decode-act).
    const size_t int8 = engine.model().info().int8_matrices;
    j["int8_matrices"] = int8;
    // Memory beyond the file: the copies made at load (kernel layouts, conversions; issue 43).
    j["load_copies_bytes"] =
        engine.model().info().load_copy_bytes + (flash != nullptr ? flash->load_copy_bytes() : 0);
    j["int8_kernel"] = int8 > 0 ? nlohmann::json(kernels::int8_isa_name(kernels::best_int8_isa())) : nlohmann::json(nullptr);
    // The INT4 layers' prefill products (8+ tokens): "amx-bf16" with KESTREL_AMX=1 on a CPU that
    // has it (gemm_w4_amx_bf16.h), else the decode kernels' activations ("int8" or "bf16").
    j["prefill_kernel"] = int8 == 0 ? "bf16" : kernels::amx_prefill_enabled() ? "amx-bf16" : "int8";
    // Each product's kernel, as kernels/registry.h chose it (docs/kernels.md).
    j["kernels"] = runtime::kernels_json(engine.model().info());
    // FlashHead's greedy proof over this run's searches (docs/flashhead.md): null with the dense head.
    if (flash != nullptr) {
      const head::ProofStats p = flash->proof_stats() - before;
      j["flashhead"] = {{"proof", flash->proof_status()},
                        {"searches", p.searches},
                        {"mean_probes", p.mean_clusters()},
                        {"proven_at_floor_pct", p.pct(p.floor)},
                        {"extra_probes_pct", p.pct(p.extra)},
                        {"dense_fallback_pct", p.pct(p.dense)},
                        {"unproven_pct", p.pct(p.none)}};
    } else {
      j["flashhead"] = nullptr;
    }
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return 0;
  }
  result = engine.generate(prompt, options, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::printf("\n");
  std::fflush(stdout);
  // Decode is timed after the first token: with fewer than two there is no rate to print.
  char decode[48] = "decode n/a";
  if (result.tokens.size() >= 2) std::snprintf(decode, sizeof decode, "decode %.1f tok/s", result.decode_tok_s);
  std::fprintf(stderr, "[%zu prompt tokens, %zu generated, prefill %.1f tok/s, %s, drafted %zu, accepted %zu]\n",
               result.prompt_tokens, result.tokens.size(), result.prefill_tok_s, decode, result.drafted_tokens,
               result.accepted_tokens);
  return 0;
}

}  // namespace

Command add_run_command(CLI::App& app) {
  auto opts = std::make_shared<RunOptions>();
  auto* cmd = app.add_subcommand("run", "Generate a continuation of one prompt, streamed to stdout");
  // The prompt first in --help, then -m and -n (the shared options add those two ahead of their groups).
  auto* p = cmd->add_option("-p,--prompt", opts->prompt, "Prompt text");
  auto* f = cmd->add_option("-f,--file", opts->file, "Read the prompt from a file (-: standard input)");
  auto* ids = cmd->add_option("--token-ids", opts->token_ids_file,
                              "Read the prompt as whitespace-separated token ids, used as they are "
                              "(no BOS is added; used by benchmarks)");
  p->excludes(f)->excludes(ids);
  f->excludes(ids);
  opts->model.add_to(*cmd);
  opts->sampling.add_to(*cmd);
  cmd->add_option("-s,--system", opts->system, "System prompt (chat template only)");
  auto* raw = cmd->add_flag("--raw", opts->raw, "Continue the text as is, without the chat template");
  auto* chat = cmd->add_flag("--chat", opts->chat,
                             "Apply the Gemma chat template (default when the model file has one)");
  raw->excludes(chat);
  cmd->add_flag("--json", opts->json, "Print one JSON object with tokens, text and timings");
  auto* schema = cmd->add_option("--json-schema", opts->json_schema_file,
                                 "Structured output: the answer is JSON that matches this JSON Schema file "
                                 "(enforced while sampling; docs/structured-output.md)");
  auto* grammar = cmd->add_option("--grammar", opts->grammar_file,
                                  "Structured output: the answer matches this grammar file (GBNF/EBNF with "
                                  "root rule 'root', or Lark with rule 'start' when the name ends in .lark)");
  auto* regex = cmd->add_option("--regex", opts->regex, "Structured output: the answer matches this regular expression");
  schema->excludes(grammar)->excludes(regex);
  grammar->excludes(regex);
  cmd->callback([cmd] {
    if (cmd->count("--prompt") + cmd->count("--file") + cmd->count("--token-ids") == 0) {
      throw CLI::RequiredError("one of --prompt, --file or --token-ids");
    }
  });
  return [opts] { return run(*opts); };
}

}  // namespace kestrel::tools
