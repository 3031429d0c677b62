#include "base/metrics.h"

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <sstream>
#include <stdexcept>

#include "base/logging.h"

namespace duet {
namespace {

prometheus::Labels ToMap(const Labels& labels) { return prometheus::Labels(labels.begin(), labels.end()); }

// prometheus-cpp reports misuse (a name of two types, a bad name) by
// throwing; duet's names are fixed in code, so that is a bug.
template <typename F>
auto OrDie(const std::string& name, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    LOG(FATAL) << "metric " << name << ": " << e.what();
    throw;  // Not reached.
  }
}

// The text format escapes a help text's backslashes and line breaks; this
// prometheus-cpp's serializer writes it as given.
std::string EscapeHelp(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

}  // namespace

MetricsRegistry::MetricsRegistry() : registry_(std::make_unique<prometheus::Registry>()) {}

MetricsRegistry::~MetricsRegistry() = default;

MetricsRegistry& MetricsRegistry::Default() {
  static MetricsRegistry* r = new MetricsRegistry();
  return *r;
}

Counter* MetricsRegistry::GetCounter(const std::string& name, const std::string& help, const Labels& labels) {
  return OrDie(name, [&] {
    return &prometheus::BuildCounter().Name(name).Help(EscapeHelp(help)).Register(*registry_).Add(ToMap(labels));
  });
}

Gauge* MetricsRegistry::GetGauge(const std::string& name, const std::string& help, const Labels& labels) {
  return OrDie(name, [&] {
    return &prometheus::BuildGauge().Name(name).Help(EscapeHelp(help)).Register(*registry_).Add(ToMap(labels));
  });
}

Histogram* MetricsRegistry::GetHistogram(const std::string& name, const std::string& help, const Labels& labels,
                                         const std::vector<double>& upper_bounds) {
  std::vector<double> bounds;
  {
    absl::MutexLock lock(&mu_);
    bounds = bounds_.try_emplace(name, upper_bounds).first->second;
  }
  return OrDie(name, [&] {
    return &prometheus::BuildHistogram()
                .Name(name)
                .Help(EscapeHelp(help))
                .Register(*registry_)
                .Add(ToMap(labels), prometheus::Histogram::BucketBoundaries(bounds));
  });
}

std::string MetricsRegistry::RenderText() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
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
