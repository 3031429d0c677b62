// The cluster file of `duet up --config`: which workers to run and how.
// `duet place --emit` writes the same format.
//
//   {"model": "/models/x", "router": {"port": 8000},
//    "prefill": [{"tp": 1, "pp": 1, "device": "cpu", "kv_memory_gib": 0.5, "threads": 1, "cpus": [0]}],
//    "decode":  [{"tp": 1, "pp": 1, "device": "cpu", "kv_memory_gib": 1.0, "threads": 1, "cpus": [1]}]}
//
// Pools: "prefill", "decode", "colocated" (lists of instances; a pool may be
// absent). Instance fields, all optional: tp, pp (on the CPU backend, ranks
// that are threads of the worker), device ("cpu", or "cuda:N" for the CUDA
// backend), kv_memory_gib, kv_blocks,
// threads, cpus (cores to pin to), max_batch_tokens, weight_dtype, kv_dtype,
// precision_map (the worker's flags of those names), gpu (a GPU id of
// placement/hardware or a JSON file: for simulation). Top level, for
// simulation: "kv_link_gbps" (prefill -> decode bandwidth, GB/s). Unknown
// fields are errors, so typos do not pass silently. `duet up` runs only what
// this build can (CPU devices); `duet sim` reads any.
#ifndef DUET_PLACEMENT_CLUSTER_CONFIG_H_
#define DUET_PLACEMENT_CLUSTER_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace duet::placement {

struct InstanceConfig {
  std::string role;  // prefill | decode | colocated
  int tp = 1;
  int pp = 1;
  std::string device = "cpu";
  double kv_memory_gib = 0.25;
  int64_t kv_blocks = 0;
  int threads = 0;
  std::vector<int> cpus;
  int64_t max_batch_tokens = 0;  // 0: not set (the command's --max-batch-tokens, else kDefaultMaxBatchTokens)
  std::string gpu;  // for simulation
  // The worker's --weight-dtype, --kv-dtype, --precision-map ("": its
  // default); duet sim holds the instance's model in weight_dtype.
  std::string weight_dtype, kv_dtype, precision_map;
};

struct ClusterConfig {
  std::string model;
  std::string served_model_name;
  int router_port = 8000;
  std::string policy = "least_loaded";
  std::vector<InstanceConfig> instances;
  double kv_link_gbps = 0;  // for simulation; 0: unset
};

// for_simulation: any device, TP and PP (nothing will run them here).
absl::StatusOr<ClusterConfig> ParseClusterConfig(const std::string& json_text, const std::string& source,
                                                 bool for_simulation = false);
absl::StatusOr<ClusterConfig> LoadClusterConfig(const std::string& path, bool for_simulation = false);

}  // namespace duet::placement

#endif  // DUET_PLACEMENT_CLUSTER_CONFIG_H_
