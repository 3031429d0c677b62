// What an autoscaler sees of a serving cluster each interval, and what it
// decides: the one interface the SLA planner (planner.h) and the
// queue-threshold autoscaler implement. The simulator drives it
// (SimulateAutoscaled, `duet sim --autoscale`); so does `duet planner`
// (autoscale/), from the router's live figures (its GET /figures, in the
// JSON FiguresToJson writes).
//
//   LoadFigures f = ...;            // the last interval, as measured
//   ScaleDecision d = scaler.Decide(f);
//   // start or drain instances until each pool has d.prefill / d.decode,
//   // switching d.to_prefill decode instances (d.to_decode prefill ones)
//   // to the other role first.
#ifndef DUET_PLACEMENT_AUTOSCALE_H_
#define DUET_PLACEMENT_AUTOSCALE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace duet::placement {

// One pool as the actuator sees it: instances serving (`ready`), started and
// not yet serving (`starting`), taking nothing new while their requests end
// (`draining`, switching roles included), and the requests it holds.
struct PoolFigures {
  int ready = 0;
  int starting = 0;
  int draining = 0;
  int64_t waiting = 0;  // prefill: queued prompts; decode: admitted, waiting for KV room or their pull
  int64_t running = 0;  // decode: requests in its continuous batches
  double kv_used = 0;   // KV tokens held (decode)
  double kv_capacity = 0;
  // The instances the pool will have once starts and drains settle: what a
  // decision is measured against.
  int planned() const { return ready + starting; }
};

// The last interval's load. Latency figures are of the requests whose first
// token (TTFT) or last token (TPOT) came in the interval; -1 when none did.
struct LoadFigures {
  double now = 0;         // seconds since the cluster (or the simulation) started
  double interval_s = 0;  // the span these figures cover
  int64_t arrivals = 0;
  std::vector<int64_t> prompt_lens;  // of the interval's arrivals (a sample)
  std::vector<int64_t> output_lens;  // of the requests finished in it (a sample)
  int64_t prompt_tokens = 0, cached_tokens = 0;
  int64_t first_tokens = 0, finished = 0;
  double ttft_p50 = -1, ttft_p90 = -1, tpot_p50 = -1, tpot_p90 = -1;
  PoolFigures prefill, decode;
  double arrival_rate() const { return interval_s > 0 ? static_cast<double>(arrivals) / interval_s : 0; }
  double cached_share() const {
    return prompt_tokens > 0 ? static_cast<double>(cached_tokens) / static_cast<double>(prompt_tokens) : 0;
  }
};

// The pools' sizes to reach. `to_prefill` decode instances (or `to_decode`
// prefill ones) switch roles first, counted in the targets; the rest is
// starts and drains. A target below a pool's instances drains the
// difference (starting ones first).
struct ScaleDecision {
  int prefill = 0;
  int decode = 0;
  int to_prefill = 0;
  int to_decode = 0;
  std::string why;  // one line for the log
};

class Autoscaler {
 public:
  virtual ~Autoscaler() = default;
  virtual ScaleDecision Decide(const LoadFigures& figures) = 0;
  // Between intervals, with the figures of the last few seconds (their
  // lengths and latencies may be empty): a decision when the load already
  // needs more instances than the pools have (a burst), else none. Only
  // ever grows a pool.
  virtual std::optional<ScaleDecision> Check(const LoadFigures& recent) { return std::nullopt; }
};

// The q-quantile of `v` (nearest rank; reorders it). `v` is not empty.
double Quantile(std::vector<double>& v, double q);
// Sets the figures' TTFT and TPOT medians and 90th percentiles from those
// samples (-1 for an empty one), reordering them.
void SetLatencyQuantiles(LoadFigures& f, std::vector<double>& ttft, std::vector<double>& tpot);

// The router's GET /figures body and what `duet planner` reads back: every
// field by its name here, pools as objects. FiguresFromJson refuses a
// document without "interval_s" or with a field of the wrong type.
nlohmann::json FiguresToJson(const LoadFigures& f);
absl::StatusOr<LoadFigures> FiguresFromJson(const nlohmann::json& j);

}  // namespace duet::placement

#endif  // DUET_PLACEMENT_AUTOSCALE_H_
