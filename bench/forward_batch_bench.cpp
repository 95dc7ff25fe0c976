// Decode of n sequences (each with 100 tokens of history, one new token each): one
// Model::forward_batch of n rows against n separate forward_hidden calls, on the default model
// (Gemma 3 270M) loaded as W4A16 with 2 threads. Each iteration's caches are truncated back to
// their history outside the timing. DecodeStep adds what the scheduler does after the forward:
// the rows' FlashHead search_batch (needs KESTREL_BENCH_IMAGE, an image built with --flashhead).
//   build/bench/kestrel_forward_batch_bench
//   KESTREL_BENCH_IMAGE=fh.kimg KESTREL_BENCH_THREADS=1 build/bench/kestrel_forward_batch_bench
// With one thread the CPU time per step does not depend on what else the machine runs.
// Measured (2-core AVX512-BF16 VM, fastest of 10 runs, ms per step of n tokens):
//   n                       1     2     4     8    16
//   n x forward_hidden     2.8   5.5  11.4  22.4  45.5
//   forward_batch          2.7   3.8   7.0  13.2  19.6   (2-7 rows: W4 GEMV over the tokens; 8+: bf16 tiles)
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "kestrel/formats/gguf.h"
#include "kestrel/head/flashhead.h"
#include "kestrel/model/model.h"
#include "kestrel/runtime/model_path.h"

namespace {

using namespace kestrel;

constexpr size_t kHistory = 100;

const char* image_path() { return std::getenv("KESTREL_BENCH_IMAGE"); }

int bench_threads() {
  const char* t = std::getenv("KESTREL_BENCH_THREADS");
  return t != nullptr ? std::atoi(t) : 2;
}

struct Fixture {
  gguf::File file;
  ThreadPool pool{bench_threads()};
  std::unique_ptr<model::Model> model;
  std::unique_ptr<head::FlashHead> flash;
  Fixture() : file(gguf::File::open(image_path() != nullptr ? image_path() : runtime::default_model_path())) {
    model::LoadOptions options;
    if (image_path() == nullptr) options.precision = model::Precision::kW4A16;
    model = model::load_model(file, options, pool);
    if (head::FlashHead::present(file)) flash = std::make_unique<head::FlashHead>(file, model->output_head());
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

std::vector<model::TokenId> random_tokens(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<model::TokenId> id(3, 4095);
  std::vector<model::TokenId> t(n);
  for (auto& x : t) x = id(rng);
  return t;
}

enum class Mode { kBatched, kSeparate, kStep, kSearch, kSearchCold };

// Reads 64 MiB (twice a 32 MiB L3) so that the next search finds none of the head's rows or
// centroids in the caches, as in a real step, where the layers' weights pass through them.
void evict_caches() {
  static std::vector<uint64_t> buffer(64 << 17, 1);
  uint64_t sum = 0;
  for (size_t i = 0; i < buffer.size(); i += 8) sum += buffer[i];
  benchmark::DoNotOptimize(sum);
}

void Decode(benchmark::State& state, Mode mode) {
  Fixture& f = fixture();
  const bool search = mode == Mode::kSearch || mode == Mode::kSearchCold;
  if ((mode == Mode::kStep || search) && f.flash == nullptr) {
    state.SkipWithError("DecodeStep and HeadSearch need KESTREL_BENCH_IMAGE, an image built with --flashhead");
    return;
  }
  std::vector<head::Candidates> candidates(static_cast<size_t>(state.range(0)));
  const size_t n = static_cast<size_t>(state.range(0)), d = f.model->info().d_model;
  std::vector<model::KvCache> caches;
  std::vector<std::vector<model::TokenId>> next;
  std::vector<float> hidden(n * d);
  for (size_t i = 0; i < n; ++i) {
    caches.push_back(f.model->new_cache(512));
    f.model->forward_hidden(random_tokens(kHistory, i), caches.back(), model::Logits::kLast, hidden.data(), f.pool);
    next.push_back(random_tokens(1, 100 + i));
  }
  std::vector<model::BatchSequence> seqs(n);
  for (size_t i = 0; i < n; ++i) seqs[i] = {next[i], &caches[i], &hidden[i * d]};
  if (search) {  // the head alone, on the hidden states of one real step
    f.model->forward_batch(seqs, f.pool);
    std::vector<const float*> rows(n);
    std::vector<head::Candidates*> outs(n);
    for (size_t i = 0; i < n; ++i) rows[i] = &hidden[i * d], outs[i] = &candidates[i];
    for (auto _ : state) {
      if (mode == Mode::kSearchCold) {
        state.PauseTiming();
        evict_caches();
        state.ResumeTiming();
      }
      f.flash->search_batch(rows, f.flash->default_probes(), outs, f.pool);
    }
    state.counters["rows/s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
    return;
  }
  for (auto _ : state) {
    if (mode != Mode::kSeparate) {
      f.model->forward_batch(seqs, f.pool);
      if (mode == Mode::kStep) {
        std::vector<const float*> rows(n);
        std::vector<head::Candidates*> outs(n);
        for (size_t i = 0; i < n; ++i) rows[i] = &hidden[i * d], outs[i] = &candidates[i];
        f.flash->search_batch(rows, f.flash->default_probes(), outs, f.pool);
      }
    } else {
      for (size_t i = 0; i < n; ++i) {
        f.model->forward_hidden(next[i], caches[i], model::Logits::kLast, &hidden[i * d], f.pool);
      }
    }
    benchmark::DoNotOptimize(hidden.data());
    state.PauseTiming();
    for (auto& c : caches) c.truncate(kHistory);
    state.ResumeTiming();
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}

void ForwardBatch(benchmark::State& state) { Decode(state, Mode::kBatched); }
void SeparateForwardHidden(benchmark::State& state) { Decode(state, Mode::kSeparate); }
void DecodeStep(benchmark::State& state) { Decode(state, Mode::kStep); }
void HeadSearch(benchmark::State& state) { Decode(state, Mode::kSearch); }
void HeadSearchCold(benchmark::State& state) { Decode(state, Mode::kSearchCold); }
BENCHMARK(ForwardBatch)->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(DecodeStep)->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(HeadSearch)->Arg(1)->Arg(4)->Arg(8)->Arg(16)->Unit(benchmark::kMicrosecond)->UseRealTime();
// The same with the caches emptied before each search (L3-resident above: one row's centroids
// and probed clusters, 22 MB, fit a 32 MiB L3), as the head runs after the layers in a step.
BENCHMARK(HeadSearchCold)->Arg(1)->Arg(4)->Arg(16)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(SeparateForwardHidden)->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
