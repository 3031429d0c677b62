// GPUs as data: dense BF16 FLOP/s, memory bandwidth and capacity, the link
// between GPUs of a node and the network between nodes, from published spec
// sheets (placement/hardware/*.json, compiled in), or a JSON file of the same
// fields.
//
//   ASSIGN_OR_RETURN(GpuSpec g, LoadGpu("a100-80g"));
#ifndef DUET_PLACEMENT_HARDWARE_H_
#define DUET_PLACEMENT_HARDWARE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace duet::placement {

struct GpuSpec {
  std::string id;    // "a100-80g"
  std::string name;  // "NVIDIA A100-SXM4-80GB"
  double flops = 0;            // dense BF16, FLOP/s
  double memory_bw = 0;        // bytes/s
  double memory_bytes = 0;
  double intra_node_bw = 0;    // bytes/s between two GPUs of a node
  double inter_node_bw = 0;    // bytes/s per GPU across nodes
  int sms = 0;                 // streaming multiprocessors (wave quantization)
  std::string source;
};

// A built-in id (a100-40g, a100-80g, h100-sxm, h200, l4, a10g) or a path to
// a JSON file with name, bf16_tflops, memory_gbps, memory_gib,
// intra_node_gbps, inter_node_gbps.
absl::StatusOr<GpuSpec> LoadGpu(const std::string& id_or_path);
std::vector<std::string> GpuIds();

// The roofline of one kernel on one GPU: max(flops / (peak x compute
// efficiency), bytes / (bandwidth x memory efficiency)), or their sum for a
// kernel that does not overlap the two, plus a fixed cost. The roofline
// latency model's batches and the latency-model bench's operators are both
// timed by it.
struct KernelCost {
  double flops = 0;
  double bytes = 0;  // read and written
};
struct RooflineEfficiency {
  double compute = 1;
  double memory = 1;
  double fixed_s = 0;
  bool overlap = true;  // false: compute and memory time add up
};
double KernelSeconds(const GpuSpec& g, const KernelCost& k, const RooflineEfficiency& e = {});

// A ring all-reduce among n GPUs of one node, `bytes` per GPU: latency +
// 2(n-1)/n x bytes / (intra-node link x efficiency); 0 for n < 2.
double AllReduceSeconds(const GpuSpec& g, int n, double bytes, double latency_s = 0, double link_efficiency = 1);

}  // namespace duet::placement

#endif  // DUET_PLACEMENT_HARDWARE_H_
