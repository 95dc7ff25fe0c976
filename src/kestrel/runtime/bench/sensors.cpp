#include "kestrel/runtime/bench/sensors.h"

#include <dlfcn.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>

namespace kestrel::runtime::bench {
namespace fs = std::filesystem;
namespace {

// The first line of a sysfs file, or nullopt with `why` set.
std::optional<std::string> read_line(const fs::path& path, std::string* why = nullptr) {
  std::ifstream in(path);
  if (!in) {
    if (why) *why = path.string() + ": " + std::strerror(errno);
    return std::nullopt;
  }
  std::string line;
  if (!std::getline(in, line)) {
    if (why) *why = path.string() + ": cannot read (" + std::strerror(errno) + ")";
    return std::nullopt;
  }
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ' || line.back() == '\r')) line.pop_back();
  return line;
}

std::optional<double> read_number(const fs::path& path, std::string* why = nullptr) {
  const auto line = read_line(path, why);
  if (!line) return std::nullopt;
  std::istringstream in(*line);
  double v = 0;
  if (!(in >> v)) {
    if (why) *why = path.string() + ": not a number";
    return std::nullopt;
  }
  return v;
}

std::vector<fs::path> sorted_entries(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// A sysfs file holding a cumulative counter or a power value, times `scale` to J or W; a
// second file's value may multiply it (INA3221 hwmon: millivolts times milliamps).
class FileSensor final : public Sensor {
 public:
  FileSensor(std::string what, fs::path file, double scale, bool cumulative, double wrap_j = 0,
             fs::path times = {})
      : what_(std::move(what)), file_(std::move(file)), times_(std::move(times)), scale_(scale),
        cumulative_(cumulative), wrap_j_(wrap_j) {}
  std::string describe() const override {
    return what_ + " (" + file_.string() + (times_.empty() ? "" : " x " + times_.filename().string()) + ")";
  }
  bool cumulative() const override { return cumulative_; }
  double wrap_j() const override { return wrap_j_; }
  std::optional<double> read() override {
    auto v = read_number(file_);
    if (!v) return std::nullopt;
    if (!times_.empty()) {
      const auto w = read_number(times_);
      if (!w) return std::nullopt;
      *v *= *w;
    }
    return *v * scale_;
  }

 private:
  std::string what_;
  fs::path file_, times_;
  double scale_;
  bool cumulative_;
  double wrap_j_;
};

void scan_powercap(const fs::path& root, SensorScan& scan) {
  const fs::path dir = root / "sys/class/powercap";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    scan.unavailable.push_back("powercap/RAPL: no " + dir.string() + " (no RAPL driver, or a virtual machine)");
    return;
  }
  static const std::regex top_level(R"([a-z]+-rapl:[0-9]+)");
  struct Zone { std::string name; fs::path dir; double wrap_j; };
  std::vector<Zone> packages, others;
  std::vector<std::string> why_not;
  for (const fs::path& zone : sorted_entries(dir)) {
    if (!std::regex_match(zone.filename().string(), top_level)) continue;
    std::string why;
    const auto name = read_line(zone / "name").value_or(zone.filename().string());
    if (!read_number(zone / "energy_uj", &why)) {
      why_not.push_back(why);
      continue;
    }
    const double wrap = read_number(zone / "max_energy_range_uj").value_or(0) * 1e-6;
    (name.rfind("package", 0) == 0 ? packages : others).push_back({name, zone, wrap});
  }
  std::vector<Zone>& use = packages.empty() ? others : packages;
  for (const Zone& z : use) {
    scan.sensors.push_back(std::make_unique<FileSensor>("RAPL " + z.name, z.dir / "energy_uj", 1e-6, true, z.wrap_j));
  }
  if (use.empty()) {
    std::string msg = "powercap/RAPL: no readable zone in " + dir.string() + " (";
    for (size_t i = 0; i < why_not.size(); ++i) msg += (i ? "; " : "") + why_not[i];
    scan.unavailable.push_back(msg + ")");
  }
}

void scan_hwmon(const fs::path& root, SensorScan& scan) {
  const fs::path dir = root / "sys/class/hwmon";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    scan.unavailable.push_back("hwmon: no " + dir.string() + " (amd_energy counters, Jetson INA3221 rails)");
    return;
  }
  static const std::regex energy_file(R"(energy([0-9]+)_input)");
  static const std::regex in_file(R"(in([0-9]+)_input)");
  static const std::regex power_file(R"(power([0-9]+)_input)");
  size_t found = 0;
  for (const fs::path& hw : sorted_entries(dir)) {
    const std::string chip = read_line(hw / "name").value_or("");
    const bool ina = chip.rfind("ina", 0) == 0;
    std::vector<std::unique_ptr<Sensor>> rails;
    std::unique_ptr<Sensor> vdd_in;
    for (const fs::path& f : sorted_entries(hw)) {
      const std::string file = f.filename().string();
      std::smatch m;
      if (std::regex_match(file, m, energy_file)) {
        const std::string label = read_line(hw / ("energy" + m[1].str() + "_label")).value_or("energy" + m[1].str());
        if (label.rfind("Ecore", 0) == 0) continue;  // amd_energy: per-core, inside the socket counter
        if (!read_number(f)) continue;
        scan.sensors.push_back(std::make_unique<FileSensor>("hwmon " + chip + " " + label, f, 1e-6, true));
        ++found;
      } else if (ina && std::regex_match(file, m, in_file)) {
        const fs::path curr = hw / ("curr" + m[1].str() + "_input");
        const std::string label = read_line(hw / ("in" + m[1].str() + "_label")).value_or("");
        if (label.empty() || label == "NC" || !read_number(f) || !read_number(curr)) continue;
        auto s = std::make_unique<FileSensor>("INA rail " + label + " (" + chip + ")", f, 1e-6, false, 0, curr);
        (label == "VDD_IN" ? vdd_in : rails.emplace_back()) = std::move(s);
      } else if (ina && std::regex_match(file, m, power_file)) {
        const std::string label = read_line(hw / ("power" + m[1].str() + "_label")).value_or(chip);
        if (!read_number(f)) continue;
        auto s = std::make_unique<FileSensor>("INA power " + label, f, 1e-6, false);
        (label == "VDD_IN" ? vdd_in : rails.emplace_back()) = std::move(s);
      }
    }
    if (vdd_in) {
      scan.sensors.push_back(std::move(vdd_in));
      ++found;
    } else {
      for (auto& r : rails) {
        scan.sensors.push_back(std::move(r));
        ++found;
      }
    }
  }
  if (found == 0) scan.unavailable.push_back("hwmon: no energy counter or INA rail readable in " + dir.string());
}

// L4T before r35: /sys/bus/i2c/drivers/ina3221x/<bus-addr>/iio:device<N>/in_power<K>_input (mW).
void scan_jetson_iio(const fs::path& root, SensorScan& scan) {
  const fs::path dir = root / "sys/bus/i2c/drivers/ina3221x";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;  // only on older Jetsons; hwmon covers the newer ones
  static const std::regex power_file(R"(in_power([0-9]+)_input)");
  std::vector<std::unique_ptr<Sensor>> rails;
  std::unique_ptr<Sensor> vdd_in;
  for (const fs::path& dev : sorted_entries(dir)) {
    for (const fs::path& iio : sorted_entries(dev)) {
      if (iio.filename().string().rfind("iio:device", 0) != 0) continue;
      for (const fs::path& f : sorted_entries(iio)) {
        std::smatch m;
        const std::string file = f.filename().string();
        if (!std::regex_match(file, m, power_file) || !read_number(f)) continue;
        const std::string rail = read_line(iio / ("rail_name_" + m[1].str())).value_or(file);
        if (rail == "NC") continue;
        auto s = std::make_unique<FileSensor>("INA rail " + rail, f, 1e-3, false);
        (rail == "VDD_IN" ? vdd_in : rails.emplace_back()) = std::move(s);
      }
    }
  }
  if (vdd_in) {
    scan.sensors.push_back(std::move(vdd_in));
  } else {
    for (auto& r : rails) scan.sensors.push_back(std::move(r));
  }
}

// NVML through dlopen: the few entry points used, declared by their documented signatures.
struct Nvml {
  using Device = void*;
  using InitFn = int (*)();
  using CountFn = int (*)(unsigned*);
  using HandleFn = int (*)(unsigned, Device*);
  using EnergyFn = int (*)(Device, unsigned long long*);
  using PowerFn = int (*)(Device, unsigned*);
  using NameFn = int (*)(Device, char*, unsigned);
  using ErrorFn = const char* (*)(int);
  void* lib = nullptr;
  InitFn shutdown = nullptr;
  EnergyFn energy = nullptr;
  PowerFn power = nullptr;
  ~Nvml() {
    if (shutdown) shutdown();
    if (lib) dlclose(lib);
  }
};

class NvmlSensor final : public Sensor {
 public:
  NvmlSensor(std::shared_ptr<Nvml> nvml, Nvml::Device device, std::string name, bool energy)
      : nvml_(std::move(nvml)), device_(device), name_(std::move(name)), energy_(energy) {}
  std::string describe() const override {
    return "NVML " + name_ + (energy_ ? " total energy" : " power");
  }
  bool cumulative() const override { return energy_; }
  std::optional<double> read() override {
    if (energy_) {
      unsigned long long mj = 0;
      if (nvml_->energy(device_, &mj) != 0) return std::nullopt;
      return static_cast<double>(mj) * 1e-3;
    }
    unsigned mw = 0;
    if (nvml_->power(device_, &mw) != 0) return std::nullopt;
    return static_cast<double>(mw) * 1e-3;
  }

 private:
  std::shared_ptr<Nvml> nvml_;
  Nvml::Device device_;
  std::string name_;
  bool energy_;
};

template <class Fn>
Fn symbol(void* lib, const char* name) {
  return reinterpret_cast<Fn>(dlsym(lib, name));
}

void scan_nvml(SensorScan& scan) {
  auto nvml = std::make_shared<Nvml>();
  nvml->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!nvml->lib) {
    scan.unavailable.push_back("NVML: no libnvidia-ml.so.1 (no NVIDIA driver)");
    return;
  }
  auto init = symbol<Nvml::InitFn>(nvml->lib, "nvmlInit_v2");
  auto count = symbol<Nvml::CountFn>(nvml->lib, "nvmlDeviceGetCount_v2");
  auto handle = symbol<Nvml::HandleFn>(nvml->lib, "nvmlDeviceGetHandleByIndex_v2");
  auto name_of = symbol<Nvml::NameFn>(nvml->lib, "nvmlDeviceGetName");
  auto error = symbol<Nvml::ErrorFn>(nvml->lib, "nvmlErrorString");
  nvml->energy = symbol<Nvml::EnergyFn>(nvml->lib, "nvmlDeviceGetTotalEnergyConsumption");
  nvml->power = symbol<Nvml::PowerFn>(nvml->lib, "nvmlDeviceGetPowerUsage");
  if (!init || !count || !handle) {
    scan.unavailable.push_back("NVML: libnvidia-ml.so.1 lacks nvmlInit_v2 or nvmlDeviceGetCount_v2");
    return;
  }
  auto err = [&](int rc) { return error ? std::string(error(rc)) : "error " + std::to_string(rc); };
  if (const int rc = init(); rc != 0) {
    scan.unavailable.push_back("NVML: nvmlInit failed: " + err(rc));
    return;
  }
  nvml->shutdown = symbol<Nvml::InitFn>(nvml->lib, "nvmlShutdown");
  unsigned n = 0;
  if (const int rc = count(&n); rc != 0 || n == 0) {
    scan.unavailable.push_back(rc ? "NVML: nvmlDeviceGetCount failed: " + err(rc) : "NVML: no GPU");
    return;
  }
  for (unsigned i = 0; i < n; ++i) {
    Nvml::Device dev = nullptr;
    if (handle(i, &dev) != 0) continue;
    char buf[96] = {};
    std::string name = "GPU " + std::to_string(i);
    if (name_of && name_of(dev, buf, sizeof buf) == 0) name += " " + std::string(buf);
    unsigned long long mj = 0;
    unsigned mw = 0;
    if (nvml->energy && nvml->energy(dev, &mj) == 0) {
      scan.sensors.push_back(std::make_unique<NvmlSensor>(nvml, dev, name, true));
    } else if (nvml->power && nvml->power(dev, &mw) == 0) {
      scan.sensors.push_back(std::make_unique<NvmlSensor>(nvml, dev, name, false));
    } else {
      scan.unavailable.push_back("NVML: " + name + " reports neither energy nor power");
    }
  }
}

}  // namespace

SensorScan scan_sensors(const ScanOptions& options) {
  SensorScan scan;
  scan_powercap(options.root, scan);
  scan_hwmon(options.root, scan);
  scan_jetson_iio(options.root, scan);
  if (options.nvml) scan_nvml(scan);
  return scan;
}

PowerMonitor::PowerMonitor(std::vector<std::unique_ptr<Sensor>> sensors, Clock& clock, double interval_s)
    : sensors_(std::move(sensors)), clock_(clock), interval_s_(interval_s), state_(sensors_.size()) {
  if (sensors_.empty()) return;
  sample();
  thread_ = std::thread([this] { loop(); });
}

PowerMonitor::~PowerMonitor() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::vector<std::string> PowerMonitor::sources() const {
  std::vector<std::string> out;
  for (const auto& s : sensors_) out.push_back(s->describe());
  return out;
}

void PowerMonitor::sample() {
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < sensors_.size(); ++i) {
    const std::optional<double> v = sensors_[i]->read();
    const double t = clock_.now_s();
    if (!v) continue;
    State& s = state_[i];
    if (s.last) {
      if (sensors_[i]->cumulative()) {
        double d = *v - *s.last;
        if (d < 0) d += sensors_[i]->wrap_j();  // the counter wrapped
        if (d > 0) total_j_ += d;
      } else {
        total_j_ += 0.5 * (*v + *s.last) * (t - s.last_t);
      }
    }
    s.last = v;
    s.last_t = t;
    any_reading_ = true;
  }
}

std::optional<double> PowerMonitor::energy_j() {
  if (sensors_.empty()) return std::nullopt;
  sample();
  std::lock_guard lock(mutex_);
  if (!any_reading_) return std::nullopt;
  return total_j_;
}

void PowerMonitor::loop() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, std::chrono::duration<double>(interval_s_));
    if (stop_) break;
    lock.unlock();
    sample();
    lock.lock();
  }
}

}  // namespace kestrel::runtime::bench
