// GPTQ checkpoints' linear layers (4 bits, desc_act false), repacked into
// kernels' kQ4Z at load. The format, per linear layer of n outputs and k
// inputs, with G groups of group_size inputs (G = 1 when it is -1):
//   qweight  I32 [k / 8][n]   input i of output j is bits 4(i % 8).. of
//                             qweight[i / 8][j]
//   qzeros   I32 [G][n / 8]   group g's zero of output j is bits 4(j % 8)..
//                             of qzeros[g][j / 8], stored minus one (the
//                             "gptq" format; "gptq_v2" stores it as is)
//   scales   F16 [G][n]
//   g_idx    I32 [k]          input i's group: i / group_size (checked)
//   w[j][i] = scales[g][j] * (q - zero), g = i / group_size
// kQ4Z's blocks of 32 inputs take their group's scale and zero, so a
// group_size that is a multiple of 32 (or -1) is kept exactly.
#ifndef DUET_ENGINE_GPTQ_H_
#define DUET_ENGINE_GPTQ_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "spec/model_config.h"
#include "engine/safetensors.h"
#include "kernels/dtype.h"

namespace duet::engine {

// The layer whose tensors are `base` + ".qweight", ".qzeros", ".scales"
// and ".g_idx" (optional) in `st`, [n][k]; InvalidArgument naming the
// tensor when one is missing, has the wrong dtype or shape, or holds a
// group index other than i / group_size.
absl::StatusOr<kernels::HostWeights> LoadGptqLinear(const SafetensorsModel& st, const std::string& base, int64_t n,
                                                    int64_t k, const spec::ModelConfig::Gptq& gptq);

}  // namespace duet::engine

#endif  // DUET_ENGINE_GPTQ_H_
