#include "base/metrics.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "base/logging.h"

namespace duet {
namespace {

void AtomicAdd(std::atomic<double>& a, double v) {
  double cur = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {
  }
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Shortest text that reads back as v (Prometheus's own clients print
  // bucket bounds this way: le="0.1", not le="0.10000000000000001").
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

std::string EscapeLabel(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string EscapeHelp(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string LabelText(const Labels& labels, const std::string& extra_key = "",
                      const std::string& extra_value = "") {
  if (labels.empty() && extra_key.empty()) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    absl::StrAppend(&out, first ? "" : ",", k, "=\"", EscapeLabel(v), "\"");
    first = false;
  }
  if (!extra_key.empty()) absl::StrAppend(&out, first ? "" : ",", extra_key, "=\"", extra_value, "\"");
  return out + "}";
}

}  // namespace

void Counter::Increment(double v) {
  CHECK(v >= 0) << "counters only go up";
  AtomicAdd(value_, v);
}

void Gauge::Add(double v) { AtomicAdd(value_, v); }

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  absl::MutexLock lock(&mu_);
  ++counts_[i];
  sum_ += v;
  ++count_;
}

Histogram::Snapshot Histogram::Read() const {
  absl::MutexLock lock(&mu_);
  Snapshot s;
  s.upper_bounds = bounds_;
  uint64_t acc = 0;
  for (uint64_t c : counts_) s.cumulative.push_back(acc += c);
  s.sum = sum_;
  s.count = count_;
  return s;
}

MetricsRegistry& MetricsRegistry::Default() {
  static MetricsRegistry* r = new MetricsRegistry();
  return *r;
}

MetricsRegistry::Family& MetricsRegistry::FamilyFor(const std::string& name, Type type,
                                                    const std::string& help) {
  auto [it, inserted] = families_.try_emplace(name);
  if (inserted) {
    it->second.type = type;
    it->second.help = help;
  }
  CHECK(it->second.type == type) << "metric " << name << " registered with two types";
  return it->second;
}

Counter* MetricsRegistry::GetCounter(const std::string& name, const std::string& help,
                                     const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = FamilyFor(name, Type::kCounter, help).counters[labels];
  if (!slot) slot = std::make_unique<Counter>();
  return slot.get();
}

Gauge* MetricsRegistry::GetGauge(const std::string& name, const std::string& help,
                                 const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = FamilyFor(name, Type::kGauge, help).gauges[labels];
  if (!slot) slot = std::make_unique<Gauge>();
  return slot.get();
}

Histogram* MetricsRegistry::GetHistogram(const std::string& name, const std::string& help,
                                         const Labels& labels, const std::vector<double>& bounds) {
  absl::MutexLock lock(&mu_);
  Family& f = FamilyFor(name, Type::kHistogram, help);
  if (f.bounds.empty()) f.bounds = bounds;
  auto& slot = f.histograms[labels];
  if (!slot) slot = std::make_unique<Histogram>(f.bounds);
  return slot.get();
}

std::string MetricsRegistry::RenderText() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    const char* type = f.type == Type::kCounter ? "counter" : f.type == Type::kGauge ? "gauge" : "histogram";
    absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(f.help), "\n# TYPE ", name, " ", type, "\n");
    for (const auto& [labels, c] : f.counters) {
      absl::StrAppend(&out, name, LabelText(labels), " ", FormatValue(c->value()), "\n");
    }
    for (const auto& [labels, g] : f.gauges) {
      absl::StrAppend(&out, name, LabelText(labels), " ", FormatValue(g->value()), "\n");
    }
    for (const auto& [labels, h] : f.histograms) {
      Histogram::Snapshot s = h->Read();
      for (size_t i = 0; i < s.upper_bounds.size(); ++i) {
        absl::StrAppend(&out, name, "_bucket", LabelText(labels, "le", FormatValue(s.upper_bounds[i])), " ",
                        s.cumulative[i], "\n");
      }
      absl::StrAppend(&out, name, "_bucket", LabelText(labels, "le", "+Inf"), " ", s.cumulative.back(), "\n");
      absl::StrAppend(&out, name, "_sum", LabelText(labels), " ", FormatValue(s.sum), "\n");
      absl::StrAppend(&out, name, "_count", LabelText(labels), " ", s.count, "\n");
    }
  }
  return out;
}

std::vector<double> LatencyBucketsSeconds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
          2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 60.0};
}

std::vector<double> TokenBucketsSeconds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
          0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0};
}

std::vector<double> TransferBucketsSeconds() {
  return {1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1,
          0.25, 0.5, 1.0, 2.5, 5.0, 10.0};
}

}  // namespace duet
