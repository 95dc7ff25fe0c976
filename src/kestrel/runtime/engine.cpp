#include "kestrel/runtime/engine.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/kernels/gemv_w4_int8.h"
#include "kestrel/kernels/kernel_options.h"
#include "kestrel/image/image.h"

namespace kestrel::runtime {
namespace {

constexpr size_t kDefaultContext = 4096;

// Maps the file; a Kestrel image's content checksum is verified before anything uses it.
gguf::File open_model_file(const std::filesystem::path& path) {
  gguf::File file = gguf::File::open(path);
  if (image::read_image_info(file)) image::verify_content(file);
  return file;
}

}  // namespace

namespace {

[[noreturn]] void throw_vocabulary_mismatch(const std::string& draft_name, const std::string& what) {
  throw VocabularyMismatch("--draft " + draft_name + ": the draft model has another vocabulary than the model (" +
                           what + "): a draft model must use the same tokenizer, as a smaller model of the same "
                           "family");
}

}  // namespace

void check_same_vocabulary(const text::Tokenizer& target, size_t target_n_vocab, const text::Tokenizer& draft,
                           size_t draft_n_vocab, const std::string& draft_name) {
  const auto mismatch = [&](const std::string& what) { throw_vocabulary_mismatch(draft_name, what); };
  if (draft.n_vocab() != target.n_vocab()) {
    mismatch(std::to_string(draft.n_vocab()) + " tokens, not " + std::to_string(target.n_vocab()));
  }
  if (draft_n_vocab != target_n_vocab) {
    mismatch("its output head scores " + std::to_string(draft_n_vocab) + " tokens, not " +
             std::to_string(target_n_vocab));
  }
  for (size_t i = 0; i < target.n_vocab(); ++i) {
    const auto id = static_cast<TokenId>(i);
    if (draft.piece(id) != target.piece(id)) {
      mismatch("token " + std::to_string(i) + " is '" + draft.piece(id) + "' there, '" + target.piece(id) + "' here");
    }
  }
}

namespace {

// The vocabulary a model file's metadata names, and its embedding's rows (0 when absent).
struct FileVocabulary {
  const std::vector<std::string>* pieces = nullptr;
  size_t embedding_rows = 0;
};

FileVocabulary file_vocabulary(const gguf::File& file) {
  FileVocabulary v;
  if (file.has("tokenizer.ggml.tokens")) v.pieces = &file.get_string_array("tokenizer.ggml.tokens");
  const auto* embd = file.find_tensor("token_embd.weight");
  if (embd == nullptr) embd = file.find_tensor(std::string("token_embd.weight") + image::kQ4Suffix);
  if (embd != nullptr && embd->shape.size() == 2) v.embedding_rows = static_cast<size_t>(embd->shape[1]);
  return v;
}

}  // namespace

void check_draft_vocabulary(const std::filesystem::path& target_path, const std::filesystem::path& draft_path) {
  std::optional<gguf::File> target;
  try {
    target.emplace(gguf::File::open(target_path));
  } catch (const Error&) {
    return;  // the target's load says what is wrong with it
  }
  std::optional<gguf::File> draft;
  try {
    draft.emplace(gguf::File::open(draft_path));
  } catch (const Error& e) {
    throw Error("--draft " + draft_path.string() + ": " + e.what());
  }
  const FileVocabulary t = file_vocabulary(*target);
  const FileVocabulary d = file_vocabulary(*draft);
  if (t.pieces == nullptr || d.pieces == nullptr) return;  // not a model: the load says so
  const auto mismatch = [&](const std::string& what) { throw_vocabulary_mismatch(draft_path.string(), what); };
  if (d.pieces->size() != t.pieces->size()) {
    mismatch(std::to_string(d.pieces->size()) + " tokens, not " + std::to_string(t.pieces->size()));
  }
  if (t.embedding_rows != 0 && d.embedding_rows != 0 && d.embedding_rows != t.embedding_rows) {
    mismatch("its output head scores " + std::to_string(d.embedding_rows) + " tokens, not " +
             std::to_string(t.embedding_rows));
  }
  for (size_t i = 0; i < t.pieces->size(); ++i) {
    if ((*d.pieces)[i] != (*t.pieces)[i]) {
      mismatch("token " + std::to_string(i) + " is '" + (*d.pieces)[i] + "' there, '" + (*t.pieces)[i] + "' here");
    }
  }
}

namespace {

// Engine::kv_identity(): the file, the load options, the kernel switches, the CPU.
std::string kv_identity_of(const std::filesystem::path& path, const model::LoadOptions& load) {
  std::error_code ec;
  const auto canonical = std::filesystem::weakly_canonical(path, ec);
  std::string id = "kestrel " KESTREL_VERSION "\nfile " + (ec ? path.string() : canonical.string());
  const auto size = std::filesystem::file_size(path, ec);
  id += "\nsize " + std::to_string(ec ? 0 : size);
  const auto mtime = std::filesystem::last_write_time(path, ec);
  id += "\nmtime " + std::to_string(ec ? 0 : mtime.time_since_epoch().count());
  id += "\nload " + std::to_string(static_cast<int>(load.precision)) + " " + std::to_string(load.group_size) + " " +
        std::to_string(load.zero_points) + " " + std::to_string(load.scale_bits) + " " +
        std::to_string(kernels::w4_int8_chosen(load.decode_activations));
  id += "\nkv " + model::kv_types_name(load.kv_types);
  id += "\nkernels " + kernels::kernel_options_name(kernels::kernel_options());
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("flags", 0) == 0 || line.rfind("Features", 0) == 0) {
      id += "\n" + line;
      break;
    }
  }
  return id;
}

}  // namespace

Engine::Engine(const std::filesystem::path& model_path, const EngineOptions& options)
    : Engine(model_path, options, nullptr) {}

Engine::Engine(const std::filesystem::path& model_path, const EngineOptions& options, ThreadPool& shared_pool)
    : Engine(model_path, options, &shared_pool) {}

Engine::Engine(const std::filesystem::path& model_path, const EngineOptions& options, ThreadPool* shared_pool)
    : file_(open_model_file(model_path)),
      own_pool_(shared_pool ? nullptr : std::make_unique<ThreadPool>(options.n_threads)),
      pool_(shared_pool ? shared_pool : own_pool_.get()),
      model_(model::load_model(file_, options.load, *pool_)),
      tokenizer_(text::Tokenizer::from_gguf(file_)) {
  const size_t max_ctx = model_->info().context_length;
  const size_t n_ctx = !options.n_ctx ? std::min<size_t>(kDefaultContext, max_ctx)
                       : *options.n_ctx == 0 ? max_ctx
                                             : *options.n_ctx;
  n_ctx_ = n_ctx;
  if (n_ctx_ > max_ctx && max_ctx > 0) {
    throw OptionMismatch("context size " + std::to_string(n_ctx_) + " exceeds this model's maximum context of " +
                std::to_string(max_ctx) + " tokens (lower --ctx, or 0 for the maximum)");
  }
  if (n_ctx_ == 0 || n_ctx_ > max_ctx) {
    throw OptionMismatch("context size " + std::to_string(n_ctx_) + " is outside 1.." + std::to_string(max_ctx) +
                " for this model");
  }
  kv_identity_ = kv_identity_of(model_path, options.load);
  const bool has_flash = head::FlashHead::present(file_);
  if (options.head == HeadMode::kFlash && !has_flash) {
    throw OptionMismatch("this model has no FlashHead; build an image with `kestrel build --flashhead`");
  }
  if (options.head != HeadMode::kDense && has_flash) {
    flash_ = std::make_unique<head::FlashHead>(file_, model_->output_head());
    flash_->set_proof(options.flashhead_proof);
    probes_ = options.probes ? options.probes : flash_->default_probes();
    if (probes_ > flash_->n_clusters()) {
      throw OptionMismatch("--probes " + std::to_string(probes_) + " exceeds the image's " +
                  std::to_string(flash_->n_clusters()) + " FlashHead clusters");
    }
  } else if (options.probes != 0) {
    throw OptionMismatch(options.head == HeadMode::kDense ? "--probes applies to FlashHead, not to --head dense"
                                                 : "--probes applies to images built with --flashhead only");
  }
  if (model::MtpAssistant::in_file(file_)) {
    if (const auto* gemma = dynamic_cast<const model::GemmaDecoder*>(model_.get())) {
      mtp_ = std::make_unique<model::MtpAssistant>(file_, *gemma, options.load, *pool_);
    }
  }
  stop_tokens_ = tokenizer_.stop_tokens();
  session_ = std::make_unique<Session>(*this);  // its KV cache: a memory error surfaces here
}

std::vector<TokenId> Engine::encode(std::string_view text, bool special) const {
  return tokenizer_.encode(text, /*add_special=*/true, special);
}

Engine::~Engine() = default;

void Engine::load_draft_model(const std::filesystem::path& path, const EngineOptions& options) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw Error("--draft " + path.string() + ": no such model file (expected none, ngram, auto or a draft model image)");
  }
  EngineOptions o = options;
  // The draft model's cache holds the target's sequence (plus a draft): this context, or the
  // draft model's maximum when smaller (it then drafts while the sequence fits).
  size_t n_ctx = n_ctx_;
  std::unique_ptr<Engine> draft;
  try {
    {
      const gguf::File probe = gguf::File::open(path);
      if (const auto arch = probe.find_string("general.architecture")) {
        if (const auto max = probe.find_uint(*arch + ".context_length"); max && *max > 0) {
          n_ctx = std::min<size_t>(n_ctx, *max);
        }
      }
    }
    o.n_ctx = n_ctx;
    draft = std::make_unique<Engine>(path, o, *pool_);
  } catch (const Error& e) {  // a file that is not a model: say which option named it
    throw Error("--draft " + path.string() + ": " + e.what());
  }
  check_same_vocabulary(tokenizer_, model_->info().n_vocab, draft->tokenizer(), draft->model().info().n_vocab,
                        path.string());
  draft_ = std::move(draft);
}

Session& Engine::session() { return *session_; }

GrammarCompiler& Engine::grammars() {
  std::call_once(grammars_once_, [&] {
    grammars_ = std::make_unique<GrammarCompiler>(tokenizer_, stop_tokens_, static_cast<int>(pool_->size()));
  });
  return *grammars_;
}

size_t Engine::decode_read_bytes(const model::KvCache& cache) const {
  const size_t head = flash_ ? flash_->search_bytes(probes_) : model_->output_head().weight.bytes();
  return model_->info().decode_weight_bytes + head + cache.read_bytes();
}

size_t Engine::decode_row_bytes(const model::KvCache& cache) const {
  return (flash_ ? flash_->search_row_bytes(probes_) : 0) + cache.read_bytes();
}

}  // namespace kestrel::runtime
