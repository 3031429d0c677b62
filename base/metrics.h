// Prometheus metrics: counters, gauges and histograms with labels, and the
// text exposition format that /metrics serves. A thin layer over
// prometheus-cpp: one prometheus::Registry per MetricsRegistry, a family per
// name, TextSerializer for the text; the series are prometheus-cpp's own.
//
//   Counter* c = MetricsRegistry::Default().GetCounter(
//       "duet_kv_transfer_bytes_total", "KV bytes moved", {{"transport", "ucx"}});
//   c->Increment(bytes);
//
// Get* returns the same object for the same name and labels, so callers look
// a series up once and keep the pointer; series live as long as the registry.
// Everything is thread-safe (prometheus-cpp's series update atomically,
// histograms under their own lock).
#ifndef DUET_BASE_METRICS_H_
#define DUET_BASE_METRICS_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace duet {

// Label names and values, in any order (the text lists them by name).
using Labels = std::vector<std::pair<std::string, std::string>>;

// Increment(v), Value() (prometheus/counter.h).
using Counter = prometheus::Counter;
// Set(v), Increment(v), Decrement(v), Value() (prometheus/gauge.h).
using Gauge = prometheus::Gauge;
// Observe(v) (prometheus/histogram.h).
using Histogram = prometheus::Histogram;

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // The process-wide registry that /metrics serves.
  static MetricsRegistry& Default();

  // A name used with two types, or a name or label prometheus-cpp refuses,
  // is a bug: CHECK-fails. The help text is the first call's for a name.
  Counter* GetCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge* GetGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  // Buckets (strictly increasing) are fixed by the first call for a name.
  Histogram* GetHistogram(const std::string& name, const std::string& help, const Labels& labels,
                          const std::vector<double>& upper_bounds);

  // The Prometheus text exposition format (version 0.0.4).
  std::string RenderText() const;

 private:
  std::unique_ptr<prometheus::Registry> registry_;
  absl::Mutex mu_;
  std::map<std::string, std::vector<double>> bounds_ ABSL_GUARDED_BY(mu_);  // Per histogram name.
};

// Bucket sets that suit what duet measures.
std::vector<double> LatencyBucketsSeconds();   // 1 ms .. 60 s (TTFT, e2e, queue time)
std::vector<double> TokenBucketsSeconds();     // 1 ms .. 5 s (TPOT, ITL)
std::vector<double> TransferBucketsSeconds();  // 10 us .. 10 s (KV transfers)

}  // namespace duet

#endif  // DUET_BASE_METRICS_H_
