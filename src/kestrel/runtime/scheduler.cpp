#include "kestrel/runtime/scheduler.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <string>

#include "kestrel/base/error.h"
#include "kestrel/model/model.h"
#include "kestrel/runtime/generation.h"

namespace kestrel::runtime {
namespace {

constexpr size_t kShortRows = model::kPrefillMinRows;

// A waiting request holds back for a prefix being prefilled by another only when that saves it
// at least this many blocks of the prefix cache.
constexpr size_t kMinSharedBlocks = 2;

// Prompt positions a request may take from a cache: all but the last min(size, kShortRows),
// which it prefills itself (as Session::reuse_prefix keeps them).
size_t cacheable(std::span<const TokenId> prompt) { return prompt.size() - std::min(prompt.size(), kShortRows); }

}  // namespace

// One request, shared by the caller's thread (which drains `events`) and the scheduler thread
// (which owns `session` and `generation`).
struct Scheduler::Job {
  struct Event {
    bool is_token = false;
    TokenId token = 0;
    std::optional<StepLogprobs> logprobs;
    std::string text;
  };
  std::vector<TokenId> prompt;
  GenerateOptions options;  // on_token replaced by one that queues an event
  TextCallback on_text;     // queues an event
  std::atomic<bool> cancelled{false};
  // caller <-> scheduler, guarded by mu
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Event> events;
  bool finished = false;
  GenerateResult result;
  std::exception_ptr error;
  // scheduler thread only
  Session* session = nullptr;
  std::optional<Generation> generation;

  void push(Event e) {
    {
      std::lock_guard lock(mu);
      events.push_back(std::move(e));
    }
    cv.notify_one();
  }
};

Scheduler::Scheduler(Engine& engine, const SchedulerOptions& options, LoadCallback on_load)
    : engine_(engine), options_(options), on_load_(std::move(on_load)), pool_(engine, options.n_sessions) {
  if (options_.prefill_chunk == 0) throw Error("the prefill chunk must be at least 1 token");
  if (options_.cache_ram > 0) {
    prefix_cache_ = std::make_unique<PrefixCache>(engine.session().cache(), options_.cache_ram, options_.cache_dir,
                                                  engine.kv_identity());
  }
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

GenerateResult Scheduler::run(std::span<const TokenId> prompt, const GenerateOptions& options,
                              const TextCallback& on_text) {
  auto job = std::make_shared<Job>();
  job->prompt.assign(prompt.begin(), prompt.end());
  job->options = options;
  Job* j = job.get();
  job->options.on_token = [j](TokenId token, const StepLogprobs* lp) {
    Job::Event e;
    e.is_token = true;
    e.token = token;
    if (lp) e.logprobs = *lp;
    j->push(std::move(e));
    return !j->cancelled.load();
  };
  job->on_text = [j](std::string_view piece) {
    Job::Event e;
    e.text = std::string(piece);
    j->push(std::move(e));
    return !j->cancelled.load();
  };
  {
    std::lock_guard lock(mu_);
    if (stopping_) throw Error("the server is stopping");
    waiting_.push_back(job);
  }
  cv_.notify_all();

  // Deliver the events on this thread; a callback that returns false cancels the request.
  for (;;) {
    std::unique_lock lock(job->mu);
    if (!job->cv.wait_for(lock, std::chrono::seconds(1), [&] { return !job->events.empty() || job->finished; })) {
      lock.unlock();
      if (!job->cancelled && options.on_wait && !options.on_wait()) job->cancelled = true;
      continue;
    }
    if (job->events.empty()) break;  // finished, and everything delivered
    Job::Event e = std::move(job->events.front());
    job->events.pop_front();
    lock.unlock();
    if (job->cancelled) continue;
    const bool alive = e.is_token ? (!options.on_token || options.on_token(e.token, e.logprobs ? &*e.logprobs : nullptr))
                                  : (!on_text || on_text(e.text));
    if (!alive) job->cancelled = true;
  }
  if (job->error) std::rethrow_exception(job->error);
  if (job->cancelled) job->result.cancelled = true;
  return std::move(job->result);
}

void Scheduler::report_load() {
  if (!on_load_) return;
  size_t waiting = 0;
  {
    std::lock_guard lock(mu_);
    waiting = waiting_.size();
  }
  on_load_(waiting, running_.size());
}

void Scheduler::complete(const std::shared_ptr<Job>& job, std::exception_ptr error) {
  // finish() may emit the text it held back (the bytes of a character cut by max_tokens, a
  // partial stop string): its callback queues an event under job->mu, so not under that lock.
  GenerateResult result;
  if (!error && job->generation) result = job->generation->finish();
  if (job->session != nullptr) pool_.release(job->session);
  job->session = nullptr;
  {
    std::lock_guard lock(job->mu);
    if (error) {
      job->error = error;
    } else if (job->generation) {
      job->result = std::move(result);
    }
    job->finished = true;
  }
  job->cv.notify_one();
}

bool Scheduler::awaits_shared_prefix(const Job& job) {
  if (!prefix_cache_ || !job.options.cache_prompt || job.cancelled) return false;
  const size_t block = prefix_cache_->block_tokens(), limit = cacheable(job.prompt);
  size_t have = 0;
  bool checked = false;
  for (const auto& r : running_) {
    if (!r->generation->prefilling()) continue;
    const size_t shared = std::min(model::common_prefix(r->prompt, job.prompt), limit) / block * block;
    if (shared < kMinSharedBlocks * block || r->session->cache().prefilled() >= shared) continue;
    if (!checked) have = prefix_cache_->match(job.prompt, limit), checked = true;
    if (shared >= have + kMinSharedBlocks * block) return true;
  }
  return false;
}

void Scheduler::take_cached_prefix(Job& job) {
  if (!prefix_cache_ || !job.options.cache_prompt) return;
  const size_t limit = cacheable(job.prompt);
  if (prefix_cache_->match(job.prompt, limit) > job.session->reusable_prefix(job.prompt)) {
    prefix_cache_->restore(job.prompt, limit, job.session->cache());
  }
}

void Scheduler::admit() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::lock_guard lock(mu_);
      if (waiting_.empty() || pool_.n_free() == 0) return;
      // FIFO, but a request whose prompt shares a longer prefix with one prefilling now lets later
      // ones pass until that prefix is cached: it then copies the prefix instead of computing it.
      const auto it = std::find_if(waiting_.begin(), waiting_.end(),
                                   [&](const std::shared_ptr<Job>& j) { return !awaits_shared_prefix(*j); });
      if (it == waiting_.end()) return;
      job = std::move(*it);
      waiting_.erase(it);
    }
    if (job->cancelled) {
      complete(job, nullptr);
      continue;
    }
    job->session = pool_.acquire(job->prompt, job->options.cache_prompt).session;
    try {
      take_cached_prefix(*job);
      job->generation.emplace(*job->session, job->prompt, job->options, job->on_text);
    } catch (...) {
      complete(job, std::current_exception());
      continue;
    }
    running_.push_back(std::move(job));
  }
}

void Scheduler::step() {
  // Cancelled requests leave first.
  std::erase_if(running_, [&](const std::shared_ptr<Job>& job) {
    if (!job->cancelled) return false;
    job->generation->cancel();
    complete(job, nullptr);
    return true;
  });
  if (running_.empty()) return;
  // A request decoding alone verifies its draft (speculative decoding) in a step of its own;
  // with others running, every request feeds one token per step (batching already fills it).
  if (running_.size() == 1 && !running_[0]->generation->prefilling()) {
    const auto& job = running_[0];
    Generation& g = *job->generation;
    std::span<const TokenId> in;
    try {
      g.draft();
      in = g.input(kMaxDraft + 1);
    } catch (...) {
      complete(job, std::current_exception());
      running_.clear();
      return;
    }
    if (in.size() > 1) {
      try {
        g.advance_rows(in.size(), job->session->step_rows(in));
      } catch (...) {
        complete(job, std::current_exception());
        running_.clear();
        return;
      }
      if (g.done()) {
        complete(job, nullptr);
        running_.clear();
      }
      return;
    }
  }
  // The rows of this step: every decoding request's token, then prompt chunks in arrival order
  // (limited to prefill_chunk while others decode, so that their streams keep flowing).
  struct Row {
    Job* job;
    std::span<const TokenId> tokens;
  };
  std::vector<Row> rows;
  size_t budget = engine_.model().max_batch_tokens();
  bool decoding = false;
  for (auto& job : running_) {
    if (job->generation->prefilling() || budget == 0) continue;
    rows.push_back({job.get(), job->generation->input(1)});
    budget -= 1;
    decoding = true;
  }
  for (auto& job : running_) {
    if (!job->generation->prefilling() || budget == 0) continue;
    size_t chunk = std::min(budget, decoding ? std::max(options_.prefill_chunk, kShortRows) : budget);
    // No piece and no remainder shorter than kShortRows: they would take the other kernel path
    // (see below). A budget left under kShortRows waits for the next step.
    const size_t remaining = job->generation->input(SIZE_MAX).size();
    if (chunk < std::min(remaining, kShortRows)) continue;
    if (remaining > chunk && remaining - chunk < kShortRows) {
      chunk = remaining <= budget ? remaining : (chunk > kShortRows ? chunk - kShortRows : chunk);
    }
    rows.push_back({job.get(), job->generation->input(chunk)});
    budget -= rows.back().tokens.size();
  }
  // The model's batching promise decides the passes (Model::batch_exactness): where every product
  // computes a row the same whatever the rows beside it (the int8 kernels), all rows share one
  // pass, reading the weights once; else products of kShortRows rows or more take tiles that
  // round otherwise, so sequences of fewer rows (decode steps, short prompt tails) go in passes
  // under kShortRows rows and longer ones together. Either way each row is computed as in its
  // sequence's own forward, and batching does not change answers.
  const bool any_rows = engine_.model().batch_exactness() == model::BatchExactness::kAnyRows;
  std::vector<std::vector<model::BatchSequence>> groups(1);
  std::vector<model::BatchSequence> long_rows;
  // Embeddings: every row's hidden state, for the generation to pool (one buffer per such row).
  std::vector<std::vector<float>> pooled_rows(rows.size());
  const size_t d_model = engine_.model().info().d_model;
  size_t in_group = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    model::BatchSequence seq{r.tokens, &r.job->session->cache(), r.job->session->hidden()};
    if (r.job->generation->pools()) {
      pooled_rows[i].resize(r.tokens.size() * d_model);
      seq.hidden = pooled_rows[i].data();
      seq.all_rows = true;
    }
    if (any_rows || r.tokens.size() >= kShortRows) {
      long_rows.push_back(seq);
      continue;
    }
    if (in_group + r.tokens.size() >= kShortRows) {
      groups.emplace_back();
      in_group = 0;
    }
    groups.back().push_back(seq);
    in_group += r.tokens.size();
  }
  groups.push_back(std::move(long_rows));
  try {
    for (const auto& group : groups) {
      if (!group.empty()) engine_.model().forward_batch(group, engine_.pool());
    }
  } catch (...) {
    // Not expected (every request was validated when admitted): fail the requests of the step.
    const auto error = std::current_exception();
    std::erase_if(running_, [&](const std::shared_ptr<Job>& job) {
      const bool in_step = std::any_of(rows.begin(), rows.end(), [&](const Row& r) { return r.job == job.get(); });
      if (in_step) complete(job, error);
      return in_step;
    });
    return;
  }
  // Prompt chunks just written go to the prefix cache, for every conversation that starts alike.
  if (prefix_cache_) {
    for (const Row& r : rows) {
      if (r.tokens.size() >= kShortRows) prefix_cache_->publish(r.job->session->cache());
    }
  }
  // Every row that samples a token is scored in one call (FlashHead reads shared data once).
  std::vector<Session*> scored;
  for (const Row& r : rows) {
    if (r.job->generation->needs_scores(r.tokens.size())) scored.push_back(r.job->session);
  }
  std::vector<TokenScores> scores(scored.size());
  Session::score_batch(scored, scores);
  // A request whose step throws (e.g. a grammar that allows no token) ends with that error;
  // the others go on.
  std::vector<std::pair<const Job*, std::exception_ptr>> failed;
  for (size_t i = 0, k = 0; i < rows.size(); ++i) {
    Generation& g = *rows[i].job->generation;
    const size_t n = rows[i].tokens.size();
    const TokenScores s = g.needs_scores(n) ? scores[k++] : TokenScores{};
    try {
      if (g.pools()) g.pool_rows(pooled_rows[i].data(), n);
      g.advance(n, s);
    } catch (...) {
      failed.emplace_back(rows[i].job, std::current_exception());
    }
  }
  std::erase_if(running_, [&](const std::shared_ptr<Job>& job) {
    for (const auto& [j, error] : failed) {
      if (j == job.get()) {
        complete(job, error);
        return true;
      }
    }
    if (!job->generation->done()) return false;
    complete(job, nullptr);
    return true;
  });
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !waiting_.empty() || !running_.empty(); });
      if (stopping_) break;
    }
    admit();
    report_load();
    step();
    report_load();
  }
  const auto error = std::make_exception_ptr(Error("the server is stopping"));
  for (auto& job : running_) complete(job, error);
  running_.clear();
  std::deque<std::shared_ptr<Job>> waiting;
  {
    std::lock_guard lock(mu_);
    waiting.swap(waiting_);
  }
  for (auto& job : waiting) complete(job, error);
}

}  // namespace kestrel::runtime
