// A generation advanced token by token from Python (kestrel.Model.generate(stream=True)): each
// next() runs forward passes until the generation emits text or ends.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core.h"

namespace kestrel::python {

class TokenStream {
 public:
  /// Marks the stream as being advanced for its lifetime; a second thread at the same time is
  /// refused (kestrel::Error). The binding makes one with the GIL held, before next().
  class Executing {
   public:
    explicit Executing(TokenStream& s) : flag_(s.executing_) {
      if (flag_.exchange(true)) throw Error("this stream is being advanced by another thread");
    }
    ~Executing() { flag_ = false; }
    Executing(const Executing&) = delete;
    Executing& operator=(const Executing&) = delete;

   private:
    std::atomic<bool>& flag_;
  };

  TokenStream(std::shared_ptr<Sequence> seq, Request request);
  ~TokenStream();
  TokenStream(const TokenStream&) = delete;
  TokenStream& operator=(const TokenStream&) = delete;

  /// The next piece of text (at least one token's worth once it is final UTF-8 and clear of
  /// stop strings), or nothing when the generation ended. Call without the GIL. The first call
  /// takes the model's turn and holds it until the end (or close()). Throws kestrel::Error for
  /// a failing step (the turn is released). Call inside an Executing.
  std::optional<std::string> next();
  /// Ends the generation where it is (finish_reason "length", cancelled) and gives back the
  /// model's turn. Idempotent. Call with the GIL held or without; not during next().
  void close();
  Sequence& sequence() { return *seq_; }
  /// True once the generation ended (or was closed).
  bool finished() const { return finished_; }
  /// The result (result_json) once finished; null before.
  const nlohmann::json& result() const { return result_; }

 private:
  void finish_generation(bool cancel);

  std::shared_ptr<Sequence> seq_;
  Request request_;
  std::unique_ptr<runtime::Generation> gen_;
  std::string pending_;
  bool holds_turn_ = false;
  bool finished_ = false;
  std::atomic<bool> executing_{false};
  nlohmann::json result_;
};

}  // namespace kestrel::python
