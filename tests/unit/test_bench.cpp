// kestrel bench's methodology (runtime/bench) driven by a tiny fake model and a fake clock:
// the card's request and warm-up counts, warm-ups excluded from the averages, exact prompt
// lengths, EOS ignored, the three formulas, energy per token; and the sensors on a fake sysfs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include "kestrel/base/error.h"
#include "kestrel/runtime/bench/memory.h"
#include "kestrel/runtime/bench/methodology.h"
#include "kestrel/runtime/bench/prompts.h"
#include "kestrel/runtime/bench/report.h"
#include "kestrel/runtime/bench/sensors.h"

namespace kestrel::runtime::bench {
namespace {

class FakeClock final : public Clock {
 public:
  double now_s() override { return t; }
  double t = 100.0;
};

// A model whose greedy continuation of any prompt is 5, 7, EOS(1), 9, 9, ...: it stops at the
// EOS unless told to ignore it. Prefill costs `prefill_s_per_token` per prompt token, then
// each further token `decode_s_per_token`, on the fake clock. The first `slow_calls` calls
// (the warm-ups) cost `slow_factor` times as much.
class FakeModel final : public Generator {
 public:
  static constexpr TokenId kEos = 1;
  explicit FakeModel(FakeClock& clock) : clock_(clock) {}

  std::vector<TokenId> generate(const GenerationRequest& request,
                                const std::function<void(TokenId)>& on_token) override {
    prompts.emplace_back(request.prompt.begin(), request.prompt.end());
    ignore_eos_seen.push_back(request.ignore_eos);
    greedy_seen.push_back(request.greedy);
    const double factor = prompts.size() <= slow_calls ? slow_factor : 1.0;
    std::vector<TokenId> out;
    clock_.t += factor * prefill_s_per_token * static_cast<double>(request.prompt.size());
    for (size_t i = 0; i < request.output_tokens; ++i) {
      if (i > 0) clock_.t += factor * decode_s_per_token;
      const TokenId token = i == 0 ? 5 : i == 1 ? 7 : i == 2 ? kEos : 9;
      on_token(token);
      out.push_back(token);
      if (token == kEos && !request.ignore_eos) break;
    }
    return out;
  }
  Drafts last_drafts() const override { return {3 * prompts.size(), 2 * prompts.size()}; }

  double prefill_s_per_token = 0.001;  // 1,000 tok/s
  double decode_s_per_token = 0.02;    // 50 tok/s
  size_t slow_calls = 0;
  double slow_factor = 1.0;
  std::vector<std::vector<TokenId>> prompts;
  std::vector<bool> ignore_eos_seen, greedy_seen;

 private:
  FakeClock& clock_;
};

// Energy grows at a constant power on the fake clock.
class FakeMeter final : public EnergyMeter {
 public:
  FakeMeter(FakeClock& clock, double watts) : clock_(clock), watts_(watts) {}
  std::optional<double> energy_j() override { return watts_ * clock_.t; }

 private:
  FakeClock& clock_;
  double watts_;
};

std::vector<std::vector<TokenId>> distinct_prompts(size_t n, size_t count) {
  std::vector<TokenId> stream(n * count + 10);
  std::iota(stream.begin(), stream.end(), 10);
  return cut_prompts(stream, TokenId{2}, n, count);
}

TEST(BenchMethodology, SuitesAreTheModelCards) {
  const SuiteSpec t = throughput_suite();
  EXPECT_EQ(t.name, "throughput");
  EXPECT_EQ(t.prompt_tokens, 2048u);
  EXPECT_EQ(t.output_tokens, 128u);
  EXPECT_EQ(t.warmup, 3u);
  EXPECT_EQ(t.requests, 20u);
  EXPECT_FALSE(t.same_prompt);
  EXPECT_EQ(t.prompts_needed(), 23u);
  const SuiteSpec d = decode_suite();
  EXPECT_EQ(d.name, "decode");
  EXPECT_EQ(d.prompt_tokens, 3072u);
  EXPECT_EQ(d.output_tokens, 50u);
  EXPECT_EQ(d.warmup, 2u);
  EXPECT_EQ(d.requests, 10u);
  EXPECT_TRUE(d.same_prompt);
  EXPECT_EQ(d.prompts_needed(), 1u);
}

TEST(BenchMethodology, DraftCountsOfMeasuredRequestsAreSummed) {
  FakeClock clock;
  FakeModel model(clock);  // the k-th call reports 3k drafted, 2k accepted
  const SuiteSpec spec = decode_suite();  // 2 warm-ups, then calls 3..12
  const SuiteResult r = run_suite(spec, distinct_prompts(3072, 1), model, clock, nullptr, nullptr);
  ASSERT_EQ(r.requests.size(), 12u);
  EXPECT_EQ(r.requests[0].drafted_tokens, 3u);
  EXPECT_EQ(r.requests[11].accepted_tokens, 24u);
  EXPECT_EQ(r.drafted_tokens, 3u * (3 + 4 + 5 + 6 + 7 + 8 + 9 + 10 + 11 + 12));
  EXPECT_EQ(r.accepted_tokens, 2u * (3 + 4 + 5 + 6 + 7 + 8 + 9 + 10 + 11 + 12));
  const auto j = suite_json(r);
  EXPECT_EQ(j.at("summary").at("drafted_tokens"), r.drafted_tokens);
  EXPECT_EQ(j.at("requests")[0].at("accepted_tokens"), 2u);
}

TEST(BenchMethodology, ThroughputCountsPromptsAndFormulas) {
  FakeClock clock;
  FakeModel model(clock);
  const SuiteSpec spec = throughput_suite();
  const auto prompts = distinct_prompts(2048, 23);
  std::vector<std::pair<size_t, bool>> progress;
  const SuiteResult r = run_suite(spec, prompts, model, clock, nullptr,
                                  [&](const SuiteSpec&, size_t i, size_t total, bool warmup) {
                                    EXPECT_EQ(total, 23u);
                                    progress.emplace_back(i, warmup);
                                  });
  // 3 warm-ups then 20 measured requests, each a different prompt of exactly 2,048 tokens.
  ASSERT_EQ(model.prompts.size(), 23u);
  ASSERT_EQ(r.requests.size(), 23u);
  ASSERT_EQ(progress.size(), 23u);
  std::set<std::vector<TokenId>> seen;
  std::set<TokenId> body_tokens;
  for (size_t i = 0; i < 23; ++i) {
    EXPECT_EQ(r.requests[i].warmup, i < 3) << i;
    EXPECT_EQ(progress[i], std::make_pair(i, i < 3));
    EXPECT_EQ(r.requests[i].prompt_index, i);
    EXPECT_EQ(model.prompts[i], prompts[i]);
    EXPECT_EQ(model.prompts[i].size(), 2048u);
    EXPECT_EQ(model.prompts[i][0], 2);  // BOS
    for (size_t k = 1; k < model.prompts[i].size(); ++k) {
      EXPECT_TRUE(body_tokens.insert(model.prompts[i][k]).second) << "text shared between prompts";
    }
    seen.insert(model.prompts[i]);
    EXPECT_TRUE(model.ignore_eos_seen[i]);
    EXPECT_TRUE(model.greedy_seen[i]);
    // EOS (the 3rd token) ignored: exactly 128 tokens every time.
    EXPECT_EQ(r.requests[i].output_tokens, 128u);
  }
  EXPECT_EQ(seen.size(), 23u);
  // The formulas, on the fake clock: TTFT = 2,048 x 1 ms; 127 further tokens x 20 ms.
  for (const RequestResult& q : r.requests) {
    EXPECT_NEAR(q.ttft_s, 2.048, 1e-9);
    EXPECT_NEAR(q.decode_s, 127 * 0.02, 1e-9);
    EXPECT_NEAR(q.e2e_s, 2.048 + 127 * 0.02, 1e-9);
    EXPECT_NEAR(q.prefill_tok_s, 2048 / 2.048, 1e-6);
    EXPECT_NEAR(q.decode_tok_s, 127 / (127 * 0.02), 1e-6);
    EXPECT_NEAR(q.itl_max_s, 0.02, 1e-9);
    EXPECT_FALSE(q.energy_j);
  }
  EXPECT_NEAR(r.prefill_tok_s.mean, 1000.0, 1e-6);
  EXPECT_NEAR(r.decode_tok_s.mean, 50.0, 1e-6);
  EXPECT_NEAR(r.e2e_s.mean, 4.588, 1e-9);
  EXPECT_EQ(r.generated_tokens, 20u * 128u);
  EXPECT_NEAR(r.wall_s, 20 * 4.588, 1e-6);
  EXPECT_FALSE(r.energy_j);
  EXPECT_FALSE(r.energy_per_token_j);
}

TEST(BenchMethodology, WarmupsAreExcludedFromTheAverages) {
  FakeClock clock;
  FakeModel model(clock);
  model.slow_calls = 2;     // both warm-ups of the decode suite ten times slower
  model.slow_factor = 10.0;
  const SuiteSpec spec = decode_suite();
  const auto prompts = distinct_prompts(3072, 1);
  const SuiteResult r = run_suite(spec, prompts, model, clock);
  ASSERT_EQ(r.requests.size(), 12u);
  EXPECT_NEAR(r.requests[0].decode_tok_s, 5.0, 1e-9);  // the slow warm-ups were measured...
  EXPECT_NEAR(r.requests[1].prefill_tok_s, 100.0, 1e-9);
  // ...but the averages are the 10 measured requests only.
  EXPECT_NEAR(r.decode_tok_s.mean, 50.0, 1e-9);
  EXPECT_NEAR(r.decode_tok_s.min, 50.0, 1e-9);
  EXPECT_NEAR(r.prefill_tok_s.mean, 1000.0, 1e-9);
  EXPECT_NEAR(r.ttft_s.mean, 3.072, 1e-9);
  EXPECT_NEAR(r.e2e_s.mean, 3.072 + 49 * 0.02, 1e-9);
  EXPECT_EQ(r.generated_tokens, 10u * 50u);
}

TEST(BenchMethodology, DecodeSuiteUsesTheSamePromptEveryTime) {
  FakeClock clock;
  FakeModel model(clock);
  const auto prompts = distinct_prompts(3072, 3);
  const SuiteResult r = run_suite(decode_suite(), prompts, model, clock);
  ASSERT_EQ(model.prompts.size(), 12u);
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(model.prompts[i], prompts[0]);
    EXPECT_EQ(r.requests[i].prompt_index, 0u);
    EXPECT_EQ(r.requests[i].prompt_tokens, 3072u);
    EXPECT_EQ(r.requests[i].output_tokens, 50u);  // exactly 50, past the EOS
    EXPECT_EQ(r.requests[i].warmup, i < 2);
  }
}

TEST(BenchMethodology, MeanOfVaryingRequestsIsArithmetic) {
  // Decode cost grows by 10 ms per call: measured requests 3..5 of a 1-warm-up, 3-request suite.
  FakeClock clock;
  struct Growing final : Generator {
    FakeClock& clock;
    size_t calls = 0;
    explicit Growing(FakeClock& c) : clock(c) {}
    std::vector<TokenId> generate(const GenerationRequest& req, const std::function<void(TokenId)>& on_token) override {
      ++calls;
      clock.t += 0.5;  // TTFT 0.5 s
      std::vector<TokenId> out;
      for (size_t i = 0; i < req.output_tokens; ++i) {
        if (i > 0) clock.t += 0.01 * static_cast<double>(calls);
        on_token(3);
        out.push_back(3);
      }
      return out;
    }
  } model(clock);
  SuiteSpec spec{.name = "t", .prompt_tokens = 4, .output_tokens = 11, .warmup = 1, .requests = 3, .same_prompt = false};
  const SuiteResult r = run_suite(spec, distinct_prompts(4, 4), model, clock);
  // Measured calls 2, 3, 4: decode 10 tokens at 20, 30, 40 ms -> 50, 33.33, 25 tok/s.
  EXPECT_NEAR(r.decode_tok_s.mean, (50.0 + 100.0 / 3 + 25.0) / 3, 1e-9);
  EXPECT_NEAR(r.decode_tok_s.median, 100.0 / 3, 1e-9);
  EXPECT_NEAR(r.e2e_s.mean, 0.5 + 0.3, 1e-9);
  EXPECT_NEAR(r.e2e_s.max, 0.9, 1e-9);
  EXPECT_NEAR(r.e2e_s.stdev, 0.1, 1e-9);
  EXPECT_NEAR(r.prefill_tok_s.mean, 8.0, 1e-9);
}

TEST(BenchMethodology, EnergyPerTokenIsRunEnergyOverGeneratedTokens) {
  FakeClock clock;
  FakeModel model(clock);
  FakeMeter meter(clock, 12.5);  // 12.5 W throughout
  const SuiteResult r = run_suite(decode_suite(), distinct_prompts(3072, 1), model, clock, &meter);
  const double request_s = 3.072 + 49 * 0.02;
  ASSERT_TRUE(r.energy_j && r.energy_per_token_j && r.avg_power_w);
  EXPECT_NEAR(*r.energy_j, 12.5 * 10 * request_s, 1e-6);       // warm-ups not counted
  EXPECT_NEAR(*r.energy_per_token_j, 12.5 * 10 * request_s / 500, 1e-9);
  EXPECT_NEAR(*r.avg_power_w, 12.5, 1e-9);
  for (const RequestResult& q : r.requests) {
    ASSERT_TRUE(q.energy_j);
    EXPECT_NEAR(*q.energy_j, 12.5 * request_s, 1e-6);
  }
}

TEST(BenchMethodology, GeneratorThatStopsEarlyIsAnError) {
  // A generator that honours EOS (as the engine does without ignore_eos) stops after 3 tokens.
  FakeClock clock;
  struct StopsAtEos final : Generator {
    FakeModel inner;
    explicit StopsAtEos(FakeClock& c) : inner(c) {}
    std::vector<TokenId> generate(const GenerationRequest& req, const std::function<void(TokenId)>& on_token) override {
      GenerationRequest r = req;
      r.ignore_eos = false;
      return inner.generate(r, on_token);
    }
  } model(clock);
  try {
    run_suite(decode_suite(), distinct_prompts(3072, 1), model, clock);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("produced 3 tokens"), std::string::npos) << e.what();
  }
}

TEST(BenchMethodology, PromptsOfTheWrongLengthOrTooFewAreErrors) {
  FakeClock clock;
  FakeModel model(clock);
  EXPECT_THROW(run_suite(throughput_suite(), distinct_prompts(2048, 22), model, clock), Error);
  EXPECT_THROW(run_suite(decode_suite(), distinct_prompts(3071, 1), model, clock), Error);
  SuiteSpec none = decode_suite();
  none.requests = 0;
  EXPECT_THROW(run_suite(none, distinct_prompts(3072, 1), model, clock), Error);
  EXPECT_TRUE(model.prompts.empty());
}

TEST(BenchPrompts, ConsecutiveWindowsOfExactlyNTokens) {
  std::vector<TokenId> stream(100);
  std::iota(stream.begin(), stream.end(), 1000);
  const auto with_bos = cut_prompts(stream, TokenId{2}, 10, 11);
  ASSERT_EQ(with_bos.size(), 11u);
  for (size_t k = 0; k < 11; ++k) {
    ASSERT_EQ(with_bos[k].size(), 10u);
    EXPECT_EQ(with_bos[k][0], 2);
    for (size_t j = 1; j < 10; ++j) EXPECT_EQ(with_bos[k][j], static_cast<TokenId>(1000 + 9 * k + j - 1));
  }
  const auto plain = cut_prompts(stream, std::nullopt, 25, 4);
  ASSERT_EQ(plain.size(), 4u);
  EXPECT_EQ(plain[3].front(), 1075);
  EXPECT_EQ(plain[3].back(), 1099);
  EXPECT_THROW(cut_prompts(stream, TokenId{2}, 10, 12), Error);  // 12 x 9 > 100
  EXPECT_THROW(cut_prompts(stream, TokenId{2}, 1, 1), Error);
  EXPECT_THROW(cut_prompts(stream, std::nullopt, 0, 1), Error);
}

TEST(BenchStats, MeanMedianStdev) {
  const std::vector<double> v = {4, 1, 3, 2};
  const Stat s = stat_of(v);
  EXPECT_DOUBLE_EQ(s.mean, 2.5);
  EXPECT_DOUBLE_EQ(s.median, 2.5);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 4);
  EXPECT_NEAR(s.stdev, std::sqrt(5.0 / 3.0), 1e-12);
  EXPECT_THROW(stat_of(std::vector<double>{}), Error);
}

TEST(BenchMemory, ParsesProcStatus) {
  const std::string status = "Name:\tkestrel\nVmHWM:\t  731402 kB\nVmRSS:\t  551809 kB\nThreads:\t2\n";
  EXPECT_EQ(parse_status_kib(status, "VmRSS"), size_t{551809} * 1024);
  EXPECT_EQ(parse_status_kib(status, "VmHWM"), size_t{731402} * 1024);
  EXPECT_FALSE(parse_status_kib(status, "VmSwap"));
  EXPECT_FALSE(parse_status_kib("VmRSS:\tlots\n", "VmRSS"));
  const RssReading self = read_rss();
  ASSERT_TRUE(self.rss_bytes && self.peak_bytes);
  EXPECT_GE(*self.peak_bytes, *self.rss_bytes);
}

// A fake /sys tree.
class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("kestrel_sysfs_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void put(const std::string& rel, const std::string& text) {
    const auto p = root_ / rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text << "\n";
  }
  std::filesystem::path root_;
};

TEST_F(FakeSysfs, NothingReadableGivesReasons) {
  std::filesystem::create_directories(root_);
  const SensorScan scan = scan_sensors({.root = root_, .nvml = false});
  EXPECT_TRUE(scan.sensors.empty());
  ASSERT_EQ(scan.unavailable.size(), 2u);
  EXPECT_NE(scan.unavailable[0].find("powercap/RAPL: no "), std::string::npos);
  EXPECT_NE(scan.unavailable[1].find("hwmon: no "), std::string::npos);
  FakeClock clock;
  PowerMonitor monitor({}, clock);
  EXPECT_FALSE(monitor.available());
  EXPECT_FALSE(monitor.energy_j());
  EXPECT_EQ(no_sensor_text(scan.unavailable).rfind("n/a (no sensor readable: powercap/RAPL: no ", 0), 0u);
}

TEST_F(FakeSysfs, RaplPackagesOnlyWithWrapAround) {
  put("sys/class/powercap/intel-rapl:0/name", "package-0");
  put("sys/class/powercap/intel-rapl:0/energy_uj", "1000000");
  put("sys/class/powercap/intel-rapl:0/max_energy_range_uj", "10000000");
  put("sys/class/powercap/intel-rapl:0:0/name", "core");  // a sub-zone: inside package-0
  put("sys/class/powercap/intel-rapl:0:0/energy_uj", "5");
  put("sys/class/powercap/intel-rapl:1/name", "psys");    // overlaps the packages
  put("sys/class/powercap/intel-rapl:1/energy_uj", "7");
  SensorScan scan = scan_sensors({.root = root_, .nvml = false});
  ASSERT_EQ(scan.sensors.size(), 1u);
  EXPECT_NE(scan.sensors[0]->describe().find("RAPL package-0"), std::string::npos);
  FakeClock clock;
  PowerMonitor monitor(std::move(scan.sensors), clock, /*interval_s=*/3600);
  EXPECT_DOUBLE_EQ(*monitor.energy_j(), 0.0);
  put("sys/class/powercap/intel-rapl:0/energy_uj", "3500000");
  EXPECT_NEAR(*monitor.energy_j(), 2.5, 1e-9);
  put("sys/class/powercap/intel-rapl:0/energy_uj", "500000");  // wrapped at 10 J
  EXPECT_NEAR(*monitor.energy_j(), 2.5 + 7.0, 1e-9);
}

TEST_F(FakeSysfs, AmdEnergySocketsAndJetsonRailsIntegrated) {
  put("sys/class/hwmon/hwmon0/name", "amd_energy");
  put("sys/class/hwmon/hwmon0/energy1_label", "Ecore000");
  put("sys/class/hwmon/hwmon0/energy1_input", "100");
  put("sys/class/hwmon/hwmon0/energy17_label", "Esocket0");
  put("sys/class/hwmon/hwmon0/energy17_input", "2000000");
  put("sys/class/hwmon/hwmon1/name", "ina3221");
  put("sys/class/hwmon/hwmon1/in1_label", "VDD_GPU_SOC");
  put("sys/class/hwmon/hwmon1/in1_input", "5000");   // mV
  put("sys/class/hwmon/hwmon1/curr1_input", "1000");  // mA: 5 W
  put("sys/class/hwmon/hwmon1/in2_label", "VDD_CPU_CV");
  put("sys/class/hwmon/hwmon1/in2_input", "5000");
  put("sys/class/hwmon/hwmon1/curr1_input", "1000");
  put("sys/class/hwmon/hwmon1/curr2_input", "400");   // 2 W
  put("sys/class/hwmon/hwmon1/in3_label", "NC");
  put("sys/class/hwmon/hwmon1/in3_input", "0");
  put("sys/class/hwmon/hwmon1/curr3_input", "0");
  SensorScan scan = scan_sensors({.root = root_, .nvml = false});
  ASSERT_EQ(scan.sensors.size(), 3u);  // Esocket0, VDD_GPU_SOC, VDD_CPU_CV
  EXPECT_TRUE(scan.sensors[0]->cumulative());
  EXPECT_NE(scan.sensors[0]->describe().find("Esocket0"), std::string::npos);
  EXPECT_FALSE(scan.sensors[1]->cumulative());
  EXPECT_NEAR(*scan.sensors[1]->read(), 5.0, 1e-12);
  EXPECT_NEAR(*scan.sensors[2]->read(), 2.0, 1e-12);
  FakeClock clock;
  PowerMonitor monitor(std::move(scan.sensors), clock, 3600);
  clock.t += 2.0;  // 2 s at 5 W + 2 W, and 1 J more on the socket counter
  put("sys/class/hwmon/hwmon0/energy17_input", "3000000");
  EXPECT_NEAR(*monitor.energy_j(), 14.0 + 1.0, 1e-9);
  put("sys/class/hwmon/hwmon1/curr1_input", "3000");  // GPU rail now 15 W
  clock.t += 1.0;  // trapezoid: (5 + 15) / 2 + 2 = 12 J
  EXPECT_NEAR(*monitor.energy_j(), 15.0 + 12.0, 1e-9);
}

TEST_F(FakeSysfs, JetsonTotalInputRailAloneWhenPresent) {
  put("sys/class/hwmon/hwmon2/name", "ina3221");
  put("sys/class/hwmon/hwmon2/in1_label", "VDD_IN");
  put("sys/class/hwmon/hwmon2/in1_input", "19000");
  put("sys/class/hwmon/hwmon2/curr1_input", "500");
  put("sys/class/hwmon/hwmon2/in2_label", "VDD_CPU_GPU_CV");
  put("sys/class/hwmon/hwmon2/in2_input", "19000");
  put("sys/class/hwmon/hwmon2/curr2_input", "200");
  put("sys/bus/i2c/drivers/ina3221x/1-0040/iio:device0/rail_name_0", "VDD_SYS_GPU");
  put("sys/bus/i2c/drivers/ina3221x/1-0040/iio:device0/in_power0_input", "1500");  // mW
  const SensorScan scan = scan_sensors({.root = root_, .nvml = false});
  ASSERT_EQ(scan.sensors.size(), 2u);
  EXPECT_NE(scan.sensors[0]->describe().find("VDD_IN"), std::string::npos);
  EXPECT_NEAR(*scan.sensors[0]->read(), 9.5, 1e-12);
  EXPECT_NE(scan.sensors[1]->describe().find("VDD_SYS_GPU"), std::string::npos);
  EXPECT_NEAR(*scan.sensors[1]->read(), 1.5, 1e-12);
}

TEST(BenchReport, MarkdownRowsAndNoSensorText) {
  FakeClock clock;
  FakeModel model(clock);
  VariantResult with;
  with.variant = "w4a16";
  with.precision = "W4A16 image";
  with.runtime = "Kestrel";
  with.size_bytes = 3u << 20;
  with.peak_rss_bytes = 512u << 20;
  with.power_sources = {"RAPL package-0"};
  FakeMeter meter(clock, 10.0);
  with.suites.push_back(run_suite(decode_suite(), distinct_prompts(3072, 1), model, clock, &meter));
  VariantResult without = with;
  without.variant = "bf16";
  without.power_sources.clear();
  without.power_unavailable = {"powercap/RAPL: no /sys/class/powercap (no RAPL driver, or a virtual machine)"};
  without.suites[0].energy_j.reset();
  without.suites[0].energy_per_token_j.reset();
  without.suites[0].avg_power_w.reset();
  const nlohmann::json report = {{"schema", kSchema},
                                 {"variants", {variant_json(with), variant_json(without)}}};
  const std::string md = markdown_report(report);
  const double ept = 10.0 * (3.072 + 49 * 0.02) / 50;  // J per token
  char expect[128];
  std::snprintf(expect, sizeof expect, "| w4a16 | W4A16 image | Kestrel | 50.0 | — | — | — | %.3g J | 512.0 MiB | 3.0 MiB |", ept);
  EXPECT_NE(md.find(expect), std::string::npos) << md;
  EXPECT_NE(md.find("| bf16 | W4A16 image | Kestrel | 50.0 | — | — | — | n/a (no sensor readable: powercap/RAPL: "
                    "no /sys/class/powercap) |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("decode tok/s (3,072 in / 50 out)"), std::string::npos);
  EXPECT_THROW(markdown_report(nlohmann::json::object()), Error);
  EXPECT_THROW(markdown_report({{"schema", "other"}, {"variants", nlohmann::json::array()}}), Error);
  // Every per-request figure is in the JSON.
  const nlohmann::json j = variant_json(with);
  ASSERT_EQ(j["suites"]["decode"]["requests"].size(), 12u);
  EXPECT_EQ(j["suites"]["decode"]["requests"][0]["warmup"], true);
  EXPECT_NEAR(j["suites"]["decode"]["requests"][5]["decode_tok_s"].get<double>(), 50.0, 1e-9);
}

}  // namespace
}  // namespace kestrel::runtime::bench
