// A precision map: the dtype of each decoder layer's linear weights (and
// optionally the embedding's and lm_head's), which `duet precision-plan`
// writes and workers load with --precision-map, so that a prefill pool and a
// decode pool may each hold the model at its own precision.
//
//   ASSIGN_OR_RETURN(PrecisionMap map, ReadPrecisionMap("decode.json"));
//   Model::Load(dir, backend, {.precision_map = map});
//
// The file is JSON:
//   {"layers": ["bf16", "q4", "q4", "q8"],   one per layer, in order
//    "experts": ["q4", "q4", "q4", "q4"],    optional: a mixture of experts' expert
//                                            weights, one per layer (a dense layer's
//                                            is unused; default: the layer's)
//    "embedding": "q8", "lm_head": "q8",     optional (default: --weight-dtype)
//    "plan": {...}}                          optional, what the planner measured;
//                                            workers ignore it
// Any other key, a dtype name kernels/dtype.h does not know, or a layer count
// other than the model's is an error that names the file.
#ifndef DUET_ENGINE_PRECISION_MAP_H_
#define DUET_ENGINE_PRECISION_MAP_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"

namespace duet::engine {

struct PrecisionMap {
  std::vector<kernels::DType> layers;
  std::vector<kernels::DType> experts;  // Empty: each layer's experts as the layer.
  std::optional<kernels::DType> embedding;
  std::optional<kernels::DType> lm_head;
  std::string source;  // Where it was read from, for error messages.
};

absl::StatusOr<PrecisionMap> ParsePrecisionMap(const std::string& json_text, const std::string& source);
absl::StatusOr<PrecisionMap> ReadPrecisionMap(const std::string& path);
// The map as the file holds it, with `plan` (a JSON object's text, or empty)
// under "plan".
std::string PrecisionMapJson(const PrecisionMap& map, const std::string& plan = "");

}  // namespace duet::engine

#endif  // DUET_ENGINE_PRECISION_MAP_H_
