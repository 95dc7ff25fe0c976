// FlashHead's offline clustering at full vocabulary size: how long `kestrel build --flashhead`
// spends clustering the head of Gemma 3 270M (d_model 640) and of an E4B-shaped model
// (d_model 2,560), on random rows (no early convergence: every iteration runs, the worst case).
//   build/bench/kestrel_flashhead_bench --benchmark_filter=Clustering/262144/2560
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kestrel/head/clustering.h"

namespace {

void Clustering(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)), d = static_cast<size_t>(state.range(1));
  std::vector<float> rows(n * d);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> g;
  for (auto& v : rows) v = g(rng);
  kestrel::ThreadPool pool(0);
  kestrel::head::ClusteringOptions o;
  o.cluster_size = 16;
  for (auto _ : state) {
    const auto c = kestrel::head::cluster_rows(rows.data(), n, d, o, pool);
    benchmark::DoNotOptimize(c.order.data());
  }
  state.counters["threads"] = pool.size();
}
BENCHMARK(Clustering)->Args({262144, 640})->Args({262144, 2560})->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
