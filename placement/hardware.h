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

}  // namespace duet::placement

#endif  // DUET_PLACEMENT_HARDWARE_H_
