// Placement search: which parallelism and how many prefill and decode
// instances give the highest goodput per GPU for an SLO, on a cluster of
// nodes x GPUs, for a model and a workload (DistServe's question).
//
//   PlaceOptions o{.nodes = 1, .gpus_per_node = 4, .slo = {0.25, 0.1}, .target = 0.9};
//   ASSIGN_OR_RETURN(PlaceResult r, Place(model, gpu, latency, workload, o));
//   r.disaggregated[0] is the plan; r.colocated[0] the best colocated one.
//
// Candidates: per role, every (tp, pp) with tp a power of two up to the GPUs
// of a node (high node-affinity: an instance's TP group inside a node, its
// stages across nodes; low node-affinity: a prefill and a decode instance
// paired inside one node, so KV moves over the node link only), that the
// latency model knows and whose weights leave room for KV; then instance
// counts within the GPU budget. Each role's single-instance goodput is found
// by simulation (prefill against the TTFT target alone, decode against TPOT
// alone); a pair's estimate is min(n_p x G_p, n_d x G_d), DistServe's
// decomposition. The best `verify` estimates are simulated as whole clusters
// (goodput by bisection on the full SLO), and the plans are ranked by that.
// exhaustive: every candidate simulated as a whole cluster (automatic up to
// 64 candidates). A plan with pipeline stages leads only if its goodput per
// GPU beats every simulated PP-free plan's by 5%; pipeline stages add
// throughput, not speed (latency.h), and cost hand-offs and processes.
#ifndef DUET_PLACEMENT_PLACE_H_
#define DUET_PLACEMENT_PLACE_H_

#include <string>
#include <vector>

#include "base/serving_defaults.h"
#include "absl/status/statusor.h"
#include "placement/hardware.h"
#include "placement/latency.h"
#include "placement/model.h"
#include "placement/sim.h"

namespace duet::placement {

// One weight precision the search may give a role's instances (LLM-PQ's
// phase-aware precision): the model at that precision (ModelSpec's
// weight_dtype: its bytes, hence its memory and decode reads) and, per pool,
// the latency model that times it; `sensitivity` is its quality cost, as
// `duet precision-plan` measures it (mean KL divergence of the logits from
// the model as given).
struct PrecisionChoice {
  std::string dtype;  // "bf16", "q8", ...
  double sensitivity = 0;
  ModelSpec model;
  std::vector<LatencyModel*> latency;  // per pool (the first, the second), not owned
};

struct PlaceOptions {
  int nodes = 1;
  int gpus_per_node = 8;
  std::string affinity = "high";  // high | low
  Slo slo;
  double target = 0.9;
  int max_pp = 4;
  int verify = 6;          // whole-cluster simulations of the best estimates
  bool exhaustive = false;
  double memory_fraction = 0.9;  // of GPU memory for weights + KV
  int64_t max_batch_tokens = kDefaultMaxBatchTokens;
  std::string policy = "least_loaded";
  // Heterogeneous pools (LLM-PQ's setting): a second set of nodes with
  // another GPU type and its latency model. Prefill and decode may then each
  // use either pool (KV crossing pools over the slower inter-node network).
  const GpuSpec* second_gpu = nullptr;  // not owned; nullptr: one pool
  LatencyModel* second_latency = nullptr;
  int second_nodes = 0;
  int second_gpus_per_node = 0;
  // Empty: every instance holds the model as given. Else each role's
  // instances hold it in one of these (prefill and decode may differ),
  // among those whose sensitivity is at most max_sensitivity; a plan's
  // sensitivity is the larger of its two roles' (each output token comes
  // from one of the two models).
  std::vector<PrecisionChoice> precisions;
  double max_sensitivity = 1e300;
};

struct RoleConfig {
  Parallel par;
  int count = 0;
};

struct Plan {
  bool colocated = false;
  RoleConfig prefill, decode;  // colocated: prefill holds the instances
  int prefill_pool = 0, decode_pool = 0;  // 0: the first GPU type, 1: the second
  int prefill_precision = -1, decode_precision = -1;  // into PlaceOptions::precisions; -1: the model as given
  std::string prefill_dtype, decode_dtype;            // their dtypes ("" for -1)
  double sensitivity = 0;
  int gpus = 0;
  double estimate = 0;  // decomposed estimate, requests/s
  Goodput goodput;      // whole-cluster simulation (0 when not simulated)
  ClusterSpec cluster;
  std::string Describe() const;
};

struct PlaceResult {
  std::vector<Plan> disaggregated;  // best first (simulated ones first)
  std::vector<Plan> colocated;      // best first
  int simulations = 0;
  int candidates = 0;
};

// The KV tokens an instance of `p` on `g` holds: `fraction` of its GPUs'
// memory less the weights, at the model's bytes per token (not positive when
// the weights do not fit).
double KvCapacity(const ModelSpec& m, const GpuSpec& g, const Parallel& p, double fraction = 0.9);

// `colocated_latency` times the colocated configurations (e.g. vLLM's fit
// beside DistServe's for the disaggregated ones); nullptr: `latency`.
absl::StatusOr<PlaceResult> Place(const ModelSpec& model, const GpuSpec& gpu, LatencyModel& latency,
                                  const std::vector<SimRequest>& workload, const PlaceOptions& options,
                                  LatencyModel* colocated_latency = nullptr);

// The cluster a plan describes (KV capacity from GPU memory, node link for KV;
// the second pool's instances carry its latency model).
ClusterSpec MakeCluster(const Plan& plan, const ModelSpec& model, const GpuSpec& gpu, const PlaceOptions& options);

// The `duet up --config` / `duet sim --cluster` JSON of a plan.
std::string PlanToClusterJson(const Plan& plan, const ModelSpec& model, const GpuSpec& gpu,
                              const PlaceOptions& options);

}  // namespace duet::placement

#endif  // DUET_PLACEMENT_PLACE_H_
