// Power and energy sensors for the benchmark: Linux powercap/RAPL (Intel and AMD), hwmon
// energy counters (amd_energy), the Jetson INA3221 rails that tegrastats reads (hwmon and the
// older iio driver), and NVIDIA GPUs through NVML (libnvidia-ml, loaded with dlopen when
// present). Nothing is estimated: where no sensor is readable, the reasons are reported.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kestrel/runtime/bench/methodology.h"

namespace kestrel::runtime::bench {

/// One source of energy or power readings.
class Sensor {
 public:
  virtual ~Sensor() = default;
  /// What it measures and where it is read, e.g. "RAPL package-0 (/sys/class/powercap/intel-rapl:0)".
  virtual std::string describe() const = 0;
  /// True: read() returns a cumulative energy counter in joules; false: power in watts.
  virtual bool cumulative() const = 0;
  /// For a counter: the value at which it wraps to 0 (joules), 0 when unknown/never.
  virtual double wrap_j() const { return 0; }
  /// The current reading; nullopt when it cannot be read now.
  virtual std::optional<double> read() = 0;
};

/// The sensors found and, for every kind that was looked for and not used, why.
struct SensorScan {
  std::vector<std::unique_ptr<Sensor>> sensors;
  std::vector<std::string> unavailable;  // e.g. "RAPL: /sys/class/powercap does not exist"
};

struct ScanOptions {
  std::filesystem::path root = "/";  // prefix of /sys (tests point it at a fake tree)
  bool nvml = true;                  // also try libnvidia-ml
};

/// Looks for every supported sensor. Rules (docs/benchmarks.md#power-and-energy): powercap
/// top-level zones only (package-N; psys only when there is no package zone), so sub-zones are
/// not counted twice; amd_energy socket counters, not its per-core ones; INA3221 rails, VDD_IN
/// alone when the board has that total-input rail; NVML per-GPU total energy, else its power.
SensorScan scan_sensors(const ScanOptions& options = {});

/// Sums the sensors into one cumulative energy counter: counters are differenced (with their
/// wrap-around), power readings integrated by the trapezoid rule between samples. A background
/// thread samples every `interval_s` so that power rails are integrated and wraps are seen
/// between calls; energy_j() also takes a sample, so a reading at a request boundary is exact
/// for counters.
class PowerMonitor final : public EnergyMeter {
 public:
  /// `clock` must outlive the monitor. With no sensors, energy_j() is always nullopt and no
  /// thread runs.
  PowerMonitor(std::vector<std::unique_ptr<Sensor>> sensors, Clock& clock, double interval_s = 0.1);
  ~PowerMonitor() override;
  PowerMonitor(const PowerMonitor&) = delete;
  PowerMonitor& operator=(const PowerMonitor&) = delete;

  bool available() const { return !sensors_.empty(); }
  /// Descriptions of the sensors summed.
  std::vector<std::string> sources() const;
  /// Joules since the monitor started; nullopt without sensors or when every read failed.
  std::optional<double> energy_j() override;
  /// Takes one sample now (also what the thread does).
  void sample();

 private:
  struct State {
    std::optional<double> last;  // last reading (J for counters, W for power)
    double last_t = 0;
  };
  void loop();

  std::vector<std::unique_ptr<Sensor>> sensors_;
  Clock& clock_;
  double interval_s_;
  std::mutex mutex_;
  std::vector<State> state_;
  double total_j_ = 0;
  bool any_reading_ = false;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kestrel::runtime::bench
