#include "stream.h"

#include <utility>

namespace kestrel::python {

TokenStream::TokenStream(std::shared_ptr<Sequence> seq, Request request)
    : seq_(std::move(seq)), request_(std::move(request)) {}

TokenStream::~TokenStream() { close(); }

std::optional<std::string> TokenStream::next() {
  if (finished_) return std::nullopt;
  ModelLock& lock = seq_->core->lock;
  try {
    if (!holds_turn_) {
      lock.acquire(this);
      holds_turn_ = true;
      gen_ = std::make_unique<runtime::Generation>(seq_->session(), request_.prompt, request_.options,
                                                   [this](std::string_view piece) {
                                                     pending_.append(piece);
                                                     return true;
                                                   });
    } else {
      lock.set_owner_thread();
    }
    pending_.clear();
    while (pending_.empty() && !gen_->done()) step(*gen_, seq_->session(), request_.prompt.size());
  } catch (...) {
    gen_.reset();
    finished_ = true;
    if (std::exchange(holds_turn_, false)) lock.release();
    throw;
  }
  if (!pending_.empty()) return std::exchange(pending_, std::string());
  finish_generation(false);
  return std::nullopt;
}

void TokenStream::finish_generation(bool cancel) {
  if (gen_) {
    if (cancel) gen_->cancel();
    result_ = result_json(*seq_->core, request_, gen_->finish());
    gen_.reset();
  }
  finished_ = true;
  if (std::exchange(holds_turn_, false)) seq_->core->lock.release();
}

void TokenStream::close() {
  if (finished_ || executing_) return;
  finish_generation(true);
}

}  // namespace kestrel::python
