// A discrete-event simulator of a serving cluster, deterministic for a given
// workload (and latency model seed), fast enough to search placements.
//
//   ClusterSpec c = ...;   // instances, link bandwidth, policy
//   SimResult r = Simulate(c, model, *latency, workload.requests);
//   double a = r.Attainment({.ttft = 0.25, .tpot = 0.1});
//
// Disaggregated instances: prefill runs FCFS batches under a token budget
// (and optionally at most max_prefill_batch requests). With pp pipeline
// stages a batch takes the latency model's time through all of them, and
// stage 1 takes the next batch time / pp after it took this one, so up to
// pp batches are in flight; decode runs its requests as up to pp
// micro-batches (at most max_batch_size each) that each pass every stage
// once per cycle, a cycle lasting the slowest one's time through the stages. Colocated instances run one step at a time
// whatever their pp (their PP throughput is not modelled). When a batch ends its requests have their first token (TTFT); each moves to a
// decode instance (least loaded or round robin) after its KV transfer
// (prompt x KV bytes per token / the link bandwidth), and waits there until
// its whole context (prompt + output) fits in the KV capacity; decode steps
// batch every running request (continuous batching, at most max_batch_size).
// Colocated instances run vLLM's loop: a prefill batch whenever requests wait
// and fit (prefill first), else a decode step; with chunked_prefill each step
// is the running requests' decode plus up to chunk_tokens of prompts, one
// forward pass: the rows ride in the chunks' prefill as one token each and
// add their attention over their context (ForwardPassSeconds).
// A batch or step that starts after the whole cluster sat idle also pays
// the latency model's IdlePenalty (duet profile measures it; 0 elsewhere).
// Output tokens count the first; TPOT is (last token - first) / (output - 1).
#ifndef DUET_PLACEMENT_SIM_H_
#define DUET_PLACEMENT_SIM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "base/serving_defaults.h"
#include "kvcache/prefix_tree.h"
#include "placement/autoscale.h"
#include "placement/latency.h"
#include "placement/model.h"
#include "placement/workload.h"

namespace duet::placement {

enum class InstanceRole { kPrefill, kDecode, kColocated };
const char* InstanceRoleName(InstanceRole r);

struct InstanceSpec {
  InstanceRole role = InstanceRole::kColocated;
  Parallel par;
  // KV tokens the instance holds; 0: what its GPUs' memory leaves after the
  // weights (needs gpu_memory_bytes), else unlimited.
  double kv_capacity_tokens = 0;
  int64_t max_batch_tokens = kDefaultMaxBatchTokens;  // prefill budget per batch (per step when chunked)
  int64_t max_prefill_batch = 0;     // requests per prefill batch; 0: any
  int64_t max_batch_size = 256;      // decode batch (per micro-batch with pp stages)
  // This instance's latency model (a heterogeneous cluster: another GPU
  // type); nullptr: the one Simulate is given. Not owned.
  LatencyModel* latency = nullptr;
};

// The knowledge tree in each prefill instance (kvcache/, the code the
// workers run): requests with token ids (the RAG workload) start from their
// longest cached block-aligned prefix, their prefill charged only for the
// tokens after it (at least the last), and a host hit first pays its blocks'
// copy at host_link_bytes_per_s. device_blocks 0: no cache.
struct PrefixCacheSpec {
  int64_t device_blocks = 0;
  int64_t host_blocks = 0;
  int64_t block_size = 16;
  kvcache::Policy policy = kvcache::Policy::kPgdsf;
  double host_link_bytes_per_s = 25e9;  // PCIe 4 x16, one way
};

struct ClusterSpec {
  std::vector<InstanceSpec> instances;
  PrefixCacheSpec cache;  // prefill instances
  double kv_link_bytes_per_s = 0;  // prefill -> decode; 0: instantaneous
  std::string policy = "least_loaded";  // least_loaded | round_robin | cache_aware (prefill, by the caches)
  CacheAwareWeights cache_aware_weights;  // the router's default
  bool chunked_prefill = false;         // colocated
  int64_t chunk_tokens = 512;
  // Instances sharing one host's memory bandwidth (CPU workers on one
  // machine): a prefill batch or decode step that starts while another
  // instance computes takes (1 + this) times as long. 0: independent
  // instances (GPUs).
  double interference_prefill = 0;
  double interference_decode = 0;
  int gpus() const;
};

struct RequestOutcome {
  double arrival = 0;
  double prefill_start = -1;  // when its prefill batch started
  double first_token = -1;
  double finish = -1;
  int64_t output = 1;
  int64_t cached = 0;  // prompt tokens its prefill instance's prefix cache supplied
  double ttft() const { return first_token - arrival; }
  double tpot() const { return output > 1 ? (finish - first_token) / static_cast<double>(output - 1) : 0.0; }
  double queue_wait() const { return prefill_start - arrival; }
};

struct Slo {
  double ttft = 1.0;
  double tpot = 0.1;
};

// One autoscaler tick of an autoscaled run: the pools' planned instances
// (ready + starting, switches counted in their new role), those serving,
// the GPUs held (draining and starting instances included) and the
// interval's arrival rate.
struct FleetSample {
  double t = 0;
  int prefill = 0, decode = 0;
  int prefill_ready = 0, decode_ready = 0;
  int gpus = 0;
  double arrival_rate = 0;
};

struct SimResult {
  std::vector<RequestOutcome> requests;  // in arrival order
  double makespan = 0;
  int64_t events = 0;
  // GPUs held x seconds, from 0 to the makespan: a fixed cluster's GPUs
  // times its makespan; an autoscaled one's instances from the decision
  // that started them to the end of their drain.
  double gpu_seconds = 0;
  std::vector<FleetSample> timeline;  // autoscaled runs: one per tick
  int64_t started = 0, drained = 0, switched = 0;  // autoscaled runs: instances
  // The prefix caches, summed over instances: prompt tokens looked up and
  // found (on device, on host), the documents' share, and blocks copied in.
  struct Cache {
    int64_t query_tokens = 0, hit_device = 0, hit_host = 0;
    int64_t doc_tokens = 0, doc_hits = 0;
    int64_t swap_in_blocks = 0;
    double hit_rate() const { return query_tokens > 0 ? static_cast<double>(hit_device + hit_host) / query_tokens : 0; }
    double doc_hit_rate() const { return doc_tokens > 0 ? static_cast<double>(doc_hits) / doc_tokens : 0; }
  } cache;
  // Fraction of requests meeting both targets (and each one alone).
  double Attainment(const Slo& slo) const;
  // These two and Percentile count the requests from index `from` on
  // (an autoscaler's window leaves out the backlog it starts with).
  double TtftAttainment(double ttft, size_t from = 0) const;
  double TpotAttainment(double tpot, size_t from = 0) const;
  // Mean and a 99% confidence interval of the mean queue wait by the method
  // of batch means (after dropping the first `warmup` fraction).
  struct Interval {
    double mean = 0, lo = 0, hi = 0;
    int batches = 0;
  };
  Interval QueueWaitBatchMeans(int batches = 50, double warmup = 0.05) const;
  double Percentile(double p, bool tpot, size_t from = 0) const;
};

SimResult Simulate(const ClusterSpec& cluster, const ModelSpec& model, LatencyModel& latency,
                   const std::vector<SimRequest>& requests);

// An autoscaled run (`duet sim --autoscale`): every `interval_s` the
// scaler gets the last interval's LoadFigures, measured as a live cluster
// measures them, and its decision takes effect as an actuator's would: a
// started instance (`prefill` or `decode`, as new instances are built)
// serves `startup_s` after the decision, as a pod loads its model; one
// scaled down stops taking work and leaves once its requests have ended
// (a starting one leaves at once); one switching roles drains, then serves
// in the other role `switch_s` after its last request ended, its weights
// kept. Dispatch sees the instances that serve. Ticks go on until every
// request has ended. The scaler is not owned.
struct AutoscaleOptions {
  Autoscaler* scaler = nullptr;
  InstanceSpec prefill, decode;
  double interval_s = 30;
  // Between intervals, the scaler's Check every `check_s` on the arrivals
  // since the last check (0: none).
  double check_s = 5;
  double startup_s = 120;
  double switch_s = 5;
  size_t sample = 4096;  // lengths kept per interval for the figures
};
SimResult SimulateAutoscaled(const ClusterSpec& initial, const ModelSpec& model, LatencyModel& latency,
                             const std::vector<SimRequest>& requests, const AutoscaleOptions& autoscale);

// The highest arrival rate (requests/s, the workload's arrivals compressed or
// stretched in time) at which attainment of `slo` is at least `target`, by
// bisection to `rel_tol`; 0 when even a tenth of the base rate misses.
struct Goodput {
  double rate = 0;          // requests/s
  double per_gpu = 0;       // rate / GPUs
  double attainment = 0;    // at `rate`
  int simulations = 0;
};
// `hint`: a rate near the answer (0: none); the search brackets around it
// first, which saves simulations.
Goodput FindGoodput(const ClusterSpec& cluster, const ModelSpec& model, LatencyModel& latency,
                    const std::vector<SimRequest>& base, const Slo& slo, double target, double rel_tol = 0.01,
                    double hint = 0);

// The workload's arrivals scaled to `rate` requests/s (times x base_rate / rate).
std::vector<SimRequest> AtRate(const std::vector<SimRequest>& base, double rate);
double MeanRate(const std::vector<SimRequest>& requests);

}  // namespace duet::placement

#endif  // DUET_PLACEMENT_SIM_H_
