#include "kestrel/runtime/bench/report.h"

#include <cstdio>
#include <sstream>

#include "kestrel/base/error.h"

namespace kestrel::runtime::bench {
namespace {

using json = nlohmann::json;

template <class T>
json opt(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

std::string format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// The number at j[a][b]...; nullopt when absent or null.
std::optional<double> number_at(const json& j, std::initializer_list<const char*> path) {
  const json* p = &j;
  for (const char* key : path) {
    if (!p->is_object() || !p->contains(key)) return std::nullopt;
    p = &(*p)[key];
  }
  if (!p->is_number()) return std::nullopt;
  return p->get<double>();
}

std::string bytes_text(std::optional<double> b) {
  if (!b) return "n/a";
  if (*b >= 1024.0 * 1024 * 1024) return format("%.2f GiB", *b / (1024.0 * 1024 * 1024));
  return format("%.1f MiB", *b / (1024.0 * 1024));
}

std::string string_at(const json& v, const char* key, const char* fallback = "") {
  return v.contains(key) && v[key].is_string() ? v[key].get<std::string>() : fallback;
}

std::vector<std::string> strings_at(const json& v, const char* key) {
  std::vector<std::string> out;
  if (v.contains(key) && v[key].is_array()) {
    for (const auto& s : v[key]) {
      if (s.is_string()) out.push_back(s.get<std::string>());
    }
  }
  return out;
}

// An energy cell: the figure, or why there is none.
// `why`: say why there is no sensor (else just that there is none).
std::string energy_text(const json& variant, std::optional<double> joules, const char* fmt, bool why = true) {
  if (joules) return format(fmt, *joules);
  const json power = variant.value("power", json::object());
  if (strings_at(power, "sources").empty()) {
    return why ? no_sensor_text(strings_at(power, "unavailable")) : "n/a (no sensor readable)";
  }
  return "n/a (sensor not read)";
}

// 3072 -> "3,072".
std::string thousands(size_t n) {
  const std::string digits = std::to_string(n);
  std::string s;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s.push_back(',');
    s.push_back(digits[i]);
  }
  return s;
}

// The shape of `suite` as the first variant that ran it has it ("3,072 in / 50 out"), or the
// card's shape when no variant ran it.
std::string shape_of(const json& report, const char* suite, bool with_out = true) {
  const SuiteSpec card = std::string(suite) == "decode" ? decode_suite() : throughput_suite();
  size_t in = card.prompt_tokens, out = card.output_tokens;
  for (const json& v : report["variants"]) {
    const auto p = number_at(v, {"suites", suite, "prompt_tokens"});
    const auto o = number_at(v, {"suites", suite, "output_tokens"});
    if (p && o) {
      in = static_cast<size_t>(*p);
      out = static_cast<size_t>(*o);
      break;
    }
  }
  return thousands(in) + " in" + (with_out ? " / " + thousands(out) + " out" : "");
}

}  // namespace

nlohmann::json stat_json(const Stat& s) {
  return {{"mean", s.mean}, {"median", s.median}, {"min", s.min}, {"max", s.max}, {"stdev", s.stdev}};
}

nlohmann::json suite_json(const SuiteResult& suite) {
  json requests = json::array();
  for (const RequestResult& r : suite.requests) {
    requests.push_back({{"index", r.index},
                        {"warmup", r.warmup},
                        {"prompt_index", r.prompt_index},
                        {"prompt_tokens", r.prompt_tokens},
                        {"output_tokens", r.output_tokens},
                        {"ttft_s", r.ttft_s},
                        {"e2e_s", r.e2e_s},
                        {"decode_s", r.decode_s},
                        {"prefill_tok_s", r.prefill_tok_s},
                        {"decode_tok_s", r.decode_tok_s},
                        {"itl_max_s", r.itl_max_s},
                        {"energy_j", opt(r.energy_j)},
                        {"drafted_tokens", r.drafted_tokens},
                        {"accepted_tokens", r.accepted_tokens}});
  }
  const SuiteSpec& s = suite.spec;
  return {{"prompt_tokens", s.prompt_tokens},
          {"output_tokens", s.output_tokens},
          {"warmup_requests", s.warmup},
          {"measured_requests", s.requests},
          {"same_prompt", s.same_prompt},
          {"summary",
           {{"e2e_s", stat_json(suite.e2e_s)},
            {"ttft_s", stat_json(suite.ttft_s)},
            {"prefill_tok_s", stat_json(suite.prefill_tok_s)},
            {"decode_tok_s", stat_json(suite.decode_tok_s)},
            {"generated_tokens", suite.generated_tokens},
            {"drafted_tokens", suite.drafted_tokens},
            {"accepted_tokens", suite.accepted_tokens},
            {"wall_s", suite.wall_s},
            {"energy_j", opt(suite.energy_j)},
            {"energy_per_token_j", opt(suite.energy_per_token_j)},
            {"avg_power_w", opt(suite.avg_power_w)}}},
          {"requests", requests}};
}

nlohmann::json variant_json(const VariantResult& v) {
  json suites = json::object();
  for (const SuiteResult& s : v.suites) suites[s.spec.name] = suite_json(s);
  return {{"variant", v.variant},
          {"precision", v.precision},
          {"runtime", v.runtime},
          {"model", v.model_path},
          {"size_bytes", opt(v.size_bytes)},
          {"threads", v.threads},
          {"n_ctx", v.n_ctx},
          {"memory",
           {{"rss_idle_bytes", opt(v.rss_idle_bytes)},
            {"peak_rss_bytes", opt(v.peak_rss_bytes)},
            {"peak_since", v.peak_since},
            {"kv_cache_bytes", opt(v.kv_cache_bytes)}}},
          {"power",
           {{"sources", v.power_sources},
            {"unavailable", v.power_unavailable},
            {"idle_power_w", opt(v.idle_power_w)},
            {"idle_seconds", v.idle_seconds}}},
          {"suites", suites}};
}

std::string no_sensor_text(const std::vector<std::string>& unavailable) {
  std::string reasons;
  for (const std::string& u : unavailable) {
    if (!reasons.empty()) reasons += "; ";
    reasons += u.substr(0, u.find(" ("));  // without the explanation: "hwmon: no /sys/class/hwmon"
  }
  return "n/a (no sensor readable" + (reasons.empty() ? std::string() : ": " + reasons) + ")";
}

std::string markdown_report(const nlohmann::json& report) {
  if (!report.is_object() || report.value("schema", "") != kSchema || !report.contains("variants") ||
      !report["variants"].is_array()) {
    throw Error(std::string("not a benchmark report (expected an object with \"schema\": \"") + kSchema +
                "\" and \"variants\")");
  }
  std::ostringstream md;
  const auto cell = [](std::optional<double> v, const char* fmt) { return v ? format(fmt, *v) : "—"; };
  const std::string dec = shape_of(report, "decode"), thr = shape_of(report, "throughput");
  md << "| variant | precision | runtime | decode tok/s (" << dec << ") | prefill tok/s ("
     << shape_of(report, "throughput", false) << ") | decode tok/s (" << thr << ") | end-to-end s (" << thr
     << ") | energy / token | peak memory | size |\n"
     << "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const json& v : report["variants"]) {
    const json suites = v.value("suites", json::object());
    const bool has_decode = suites.contains("decode");
    const auto ept = number_at(suites, {has_decode ? "decode" : "throughput", "summary", "energy_per_token_j"});
    md << "| " << string_at(v, "variant") << " | " << string_at(v, "precision") << " | "
       << string_at(v, "runtime") << " | "
       << cell(number_at(suites, {"decode", "summary", "decode_tok_s", "mean"}), "%.1f") << " | "
       << cell(number_at(suites, {"throughput", "summary", "prefill_tok_s", "mean"}), "%.1f") << " | "
       << cell(number_at(suites, {"throughput", "summary", "decode_tok_s", "mean"}), "%.1f") << " | "
       << cell(number_at(suites, {"throughput", "summary", "e2e_s", "mean"}), "%.3f") << " | "
       << energy_text(v, ept, "%.3g J") << " | "
       << bytes_text(number_at(v, {"memory", "peak_rss_bytes"})) << " | "
       << bytes_text(number_at(v, {"size_bytes"})) << " |\n";
  }
  md << "\nMemory and power:\n\n"
     << "| variant | RSS at rest, model loaded | peak RSS | KV cache | idle power | power, decode run "
        "| energy / token, throughput | energy / token, decode | TTFT s ("
     << shape_of(report, "throughput", false) << ") | TTFT s (" << shape_of(report, "decode", false) << ") |\n"
     << "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const json& v : report["variants"]) {
    const json suites = v.value("suites", json::object());
    const auto power_cell = [&](std::optional<double> w, bool applies) {
      return applies ? energy_text(v, w, "%.2f W", false) : std::string("—");
    };
    const auto energy_cell = [&](const char* suite) {
      return suites.contains(suite)
                 ? energy_text(v, number_at(suites, {suite, "summary", "energy_per_token_j"}), "%.3g J", false)
                 : std::string("—");
    };
    md << "| " << string_at(v, "variant") << " | " << bytes_text(number_at(v, {"memory", "rss_idle_bytes"}))
       << " | " << bytes_text(number_at(v, {"memory", "peak_rss_bytes"})) << " | "
       << bytes_text(number_at(v, {"memory", "kv_cache_bytes"})) << " | "
       << power_cell(number_at(v, {"power", "idle_power_w"}), true) << " | "
       << power_cell(number_at(suites, {"decode", "summary", "avg_power_w"}), suites.contains("decode")) << " | "
       << energy_cell("throughput") << " | " << energy_cell("decode") << " | "
       << cell(number_at(suites, {"throughput", "summary", "ttft_s", "mean"}), "%.3f") << " | "
       << cell(number_at(suites, {"decode", "summary", "ttft_s", "mean"}), "%.3f") << " |\n";
  }
  md << "\n";
  for (const json& v : report["variants"]) {
    const json power = v.value("power", json::object());
    const auto sources = strings_at(power, "sources");
    md << "- " << string_at(v, "variant") << ": " << string_at(v, "model") << "; "
       << v.value("threads", 0) << " threads, context " << v.value("n_ctx", 0) << "; peak RSS since "
       << string_at(v.value("memory", json::object()), "peak_since", "?") << "; energy: ";
    if (sources.empty()) {
      md << "no sensor readable (";
      const auto why = strings_at(power, "unavailable");
      for (size_t i = 0; i < why.size(); ++i) md << (i ? "; " : "") << why[i];
      md << ")";
    } else {
      for (size_t i = 0; i < sources.size(); ++i) md << (i ? " + " : "") << sources[i];
    }
    md << ".\n";
  }
  if (report.contains("machine") && report["machine"].is_object()) {
    const json& m = report["machine"];
    md << "- Machine: " << string_at(m, "cpu", "?") << ", " << m.value("logical_cpus", 0) << " logical CPUs, "
       << bytes_text(number_at(m, {"memory_bytes"})) << " memory, " << string_at(m, "os", "?")
       << ", kernel switches: " << string_at(m, "kernel_switches", "default") << ".\n";
  }
  md << "- Method (the model card's): averages (arithmetic means) over the measured requests, warm-ups "
        "excluded; one user, greedy, end of sequence ignored, a fresh KV cache per request; prefill = "
        "prompt tokens / time to first token; decode = (output tokens - 1) / time after the first token; "
        "end-to-end = the whole request; energy / token = the run's energy / its generated tokens "
        "(energy column of the first table: the decode suite's, else the throughput suite's).\n";
  return md.str();
}

}  // namespace kestrel::runtime::bench
