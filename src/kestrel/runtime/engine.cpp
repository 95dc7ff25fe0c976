#include "kestrel/runtime/engine.h"

#include <algorithm>

#include "kestrel/base/error.h"
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

Engine::Engine(const std::filesystem::path& model_path, const EngineOptions& options)
    : file_(open_model_file(model_path)),
      pool_(options.n_threads),
      model_(model::load_model(file_, options.load, pool_)),
      tokenizer_(text::Tokenizer::from_gguf(file_)) {
  const size_t max_ctx = model_->info().context_length;
  const size_t n_ctx = !options.n_ctx ? std::min<size_t>(kDefaultContext, max_ctx)
                       : *options.n_ctx == 0 ? max_ctx
                                             : *options.n_ctx;
  n_ctx_ = n_ctx;
  if (n_ctx_ == 0 || n_ctx_ > max_ctx) {
    throw Error("context size " + std::to_string(n_ctx_) + " is outside 1.." + std::to_string(max_ctx) +
                " for this model");
  }
  const bool has_flash = head::FlashHead::present(file_);
  if (options.head == HeadMode::kFlash && !has_flash) {
    throw Error("this model has no FlashHead; build an image with `kestrel build --flashhead`");
  }
  if (options.head != HeadMode::kDense && has_flash) {
    flash_ = std::make_unique<head::FlashHead>(file_, model_->output_head());
    probes_ = options.probes ? options.probes : flash_->default_probes();
    if (probes_ > flash_->n_clusters()) {
      throw Error("--probes " + std::to_string(probes_) + " exceeds the image's " +
                  std::to_string(flash_->n_clusters()) + " FlashHead clusters");
    }
  } else if (options.probes != 0) {
    throw Error(options.head == HeadMode::kDense ? "--probes applies to FlashHead, not to --head dense"
                                                 : "--probes applies to images built with --flashhead only");
  }
  if (model::MtpAssistant::in_file(file_)) {
    if (const auto* gemma = dynamic_cast<const model::GemmaDecoder*>(model_.get())) {
      mtp_ = std::make_unique<model::MtpAssistant>(file_, *gemma, options.load, pool_);
    }
  }
  stop_tokens_ = tokenizer_.stop_tokens();
  session_ = std::make_unique<Session>(*this);  // its KV cache: a memory error surfaces here
}

std::vector<TokenId> Engine::encode(std::string_view text, bool special) const {
  return tokenizer_.encode(text, /*add_special=*/true, special);
}

Engine::~Engine() = default;

Session& Engine::session() { return *session_; }

GrammarCompiler& Engine::grammars() {
  std::call_once(grammars_once_, [&] {
    grammars_ = std::make_unique<GrammarCompiler>(tokenizer_, stop_tokens_, static_cast<int>(pool_.size()));
  });
  return *grammars_;
}

}  // namespace kestrel::runtime
