#include "engine/gptq.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace duet::engine {
namespace {

// Tensor `name`, checked to be `dtype` of `shape`.
absl::StatusOr<const TensorView*> Expect(const SafetensorsModel& st, const std::string& name, DType dtype,
                                         const std::vector<int64_t>& shape) {
  ASSIGN_OR_RETURN(const TensorView* t, st.Get(name));
  if (t->dtype != dtype || t->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(t->file, ": GPTQ tensor ", name, " is ", DTypeName(t->dtype), " [",
                                                   absl::StrJoin(t->shape, ", "), "], expected ", DTypeName(dtype),
                                                   " [", absl::StrJoin(shape, ", "), "]"));
  }
  return t;
}

int32_t I32At(const TensorView& t, int64_t i) {
  int32_t v;
  std::memcpy(&v, t.data + 4 * i, 4);  // The data is only byte-aligned in general.
  return v;
}

uint16_t U16At(const TensorView& t, int64_t i) {
  uint16_t v;
  std::memcpy(&v, t.data + 2 * i, 2);
  return v;
}

}  // namespace

absl::StatusOr<kernels::HostWeights> LoadGptqLinear(const SafetensorsModel& st, const std::string& base, int64_t n,
                                                    int64_t k, const spec::ModelConfig::Gptq& gptq) {
  const int64_t group = gptq.group_size == -1 ? k : gptq.group_size;
  if (k % 8 != 0 || n % 8 != 0 || k % group != 0) {
    return absl::InvalidArgumentError(absl::StrCat(base, ": a GPTQ layer of ", n, " x ", k,
                                                   " does not pack into 8-value words and groups of ", group));
  }
  const int64_t groups = k / group;
  ASSIGN_OR_RETURN(const TensorView* qweight, Expect(st, base + ".qweight", DType::kI32, {k / 8, n}));
  ASSIGN_OR_RETURN(const TensorView* qzeros, Expect(st, base + ".qzeros", DType::kI32, {groups, n / 8}));
  ASSIGN_OR_RETURN(const TensorView* scales, Expect(st, base + ".scales", DType::kF16, {groups, n}));
  if (st.Find(base + ".g_idx") != nullptr) {
    ASSIGN_OR_RETURN(const TensorView* g_idx, Expect(st, base + ".g_idx", DType::kI32, {k}));
    for (int64_t i = 0; i < k; ++i) {
      if (I32At(*g_idx, i) != i / group) {
        return absl::InvalidArgumentError(absl::StrCat(g_idx->file, ": ", base, ".g_idx[", i, "] is ",
                                                       I32At(*g_idx, i), ", not ", i / group,
                                                       " (act-order groups, desc_act, are not supported)"));
      }
    }
  }
  const int64_t blocks = kernels::QuantBlocks(k);
  kernels::HostWeights w{.dtype = kernels::DType::kQ4Z, .n = n, .k = k};
  const int64_t row_bytes = blocks * kernels::kQuantBlock / 2;
  w.values.assign(n * row_bytes, 0);
  w.scales.assign(n * blocks, 0);
  w.zeros.assign(n * blocks, 0);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t g = b * kernels::kQuantBlock / group;
      w.scales[j * blocks + b] = kernels::HalfToFloat(U16At(*scales, g * n + j));
      const int stored = (I32At(*qzeros, g * (n / 8) + j / 8) >> (4 * (j % 8))) & 0xf;
      w.zeros[j * blocks + b] = static_cast<uint8_t>(gptq.v2_zeros ? stored : stored + 1);
    }
    uint8_t* row = w.values.data() + j * row_bytes;
    for (int64_t i = 0; i < k; ++i) {
      const int q = (I32At(*qweight, (i / 8) * n + j) >> (4 * (i % 8))) & 0xf;
      kernels::SetNibble(row + (i / kernels::kQuantBlock) * kernels::kQuantBlock / 2, i % kernels::kQuantBlock, q);
    }
  }
  return w;
}

}  // namespace duet::engine
