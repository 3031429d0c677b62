// Arguments of the mixture-of-experts op, shared by every backend.
//
//   MoeArgs args{.x = h, .scores = router_logits, .out = y, .experts = experts.data(),
//                .num_experts = 16, .top_k = 4, .rows = T, .scratch = scratch};
//   RETURN_IF_ERROR(backend.Moe(args));
//
// Each row's router scores pick its experts (RouteRow: the softmax's top_k,
// ties to the lower index, renormalised to sum to one where asked), and its
// output is the chosen experts' SiLU-gated MLPs of x weighted by those
// probabilities, summed in the order RouteRow lists them. A row's output
// depends only on its own x and scores. The experts' weights are host memory
// as every op's weights are; x, scores, out and the scratch are the
// backend's (MoeScratchBytes of it, for the grouping of rows by expert).
#ifndef DUET_KERNELS_MOE_H_
#define DUET_KERNELS_MOE_H_

#include <cstdint>

#include "kernels/dtype.h"

namespace duet::kernels {

struct ExpertWeights {
  WeightMatrix gate_up;  // [2 * inter][hidden]: the gate's rows, then the up projection's
  WeightMatrix down;     // [hidden][inter]
};

struct MoeArgs {
  const float* x = nullptr;       // [rows][hidden], the MLP's normalised input
  const float* scores = nullptr;  // [rows][num_experts], the router's logits
  float* out = nullptr;           // [rows][hidden]
  const ExpertWeights* experts = nullptr;  // [num_experts], all of one shape
  int64_t num_experts = 0;
  int64_t top_k = 0;
  bool renormalize = false;  // The chosen probabilities divided by their sum.
  int64_t rows = 0;
  void* scratch = nullptr;  // MoeScratchBytes(rows, top_k, num_experts, hidden, inter) bytes
  int64_t hidden() const { return experts[0].down.n; }
  int64_t inter() const { return experts[0].down.k; }
};

// Row r's experts and their weights, top_k of each, largest probability
// first: what every backend's Moe uses, so that they choose alike.
void RouteRow(const float* scores, int64_t num_experts, int64_t top_k, bool renormalize, int32_t* experts,
              float* weights);

// The scratch a Moe call groups its rows in: each (row, choice) pair's
// expert and weight, the pairs sorted by expert (their rows of x gathered,
// the experts' gate/up products, activations and outputs), where each pair
// landed, and each expert's first sorted pair.
struct MoeScratch {
  int64_t pairs = 0;
  // Byte offsets into the scratch.
  int64_t expert = 0, weight = 0, slot = 0, first = 0, xs = 0, gu = 0, act = 0, ys = 0;
  int64_t bytes = 0;
};
MoeScratch MoeScratchFor(int64_t rows, int64_t top_k, int64_t num_experts, int64_t hidden, int64_t inter);
inline int64_t MoeScratchBytes(int64_t rows, int64_t top_k, int64_t num_experts, int64_t hidden, int64_t inter) {
  return MoeScratchFor(rows, top_k, num_experts, hidden, inter).bytes;
}

}  // namespace duet::kernels

#endif  // DUET_KERNELS_MOE_H_
