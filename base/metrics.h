// Prometheus metrics: counters, gauges and histograms with labels, and the
// text exposition format that /metrics serves.
//
//   Counter* c = MetricsRegistry::Default().GetCounter(
//       "duet_kv_transfer_bytes_total", "KV bytes moved", {{"transport", "ucx"}});
//   c->Increment(bytes);
//
// Get* returns the same object for the same name and labels, so callers look
// a series up once and keep the pointer; series live as long as the registry.
// Updates are lock-free (atomics) except histogram observations, which take
// a per-series mutex. Everything is thread-safe.
#ifndef DUET_BASE_METRICS_H_
#define DUET_BASE_METRICS_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace duet {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Increment(double v = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double v);
  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative;  // Per bound, then +Inf last.
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Read() const;

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // Per bucket, +Inf last (not cumulative).
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // The process-wide registry that /metrics serves.
  static MetricsRegistry& Default();

  Counter* GetCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge* GetGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  // Buckets are fixed by the first call for a name.
  Histogram* GetHistogram(const std::string& name, const std::string& help, const Labels& labels,
                          const std::vector<double>& upper_bounds);

  // The Prometheus text exposition format (version 0.0.4).
  std::string RenderText() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family {
    Type type;
    std::string help;
    std::vector<double> bounds;
    std::map<Labels, std::unique_ptr<Counter>> counters;
    std::map<Labels, std::unique_ptr<Gauge>> gauges;
    std::map<Labels, std::unique_ptr<Histogram>> histograms;
  };
  Family& FamilyFor(const std::string& name, Type type, const std::string& help)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
};

// Bucket sets that suit what duet measures.
std::vector<double> LatencyBucketsSeconds();   // 1 ms .. 60 s (TTFT, e2e, queue time)
std::vector<double> TokenBucketsSeconds();     // 1 ms .. 5 s (TPOT, ITL)
std::vector<double> TransferBucketsSeconds();  // 10 us .. 10 s (KV transfers)

}  // namespace duet

#endif  // DUET_BASE_METRICS_H_
