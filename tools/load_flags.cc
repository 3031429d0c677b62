#include "tools/load_flags.h"

#include <algorithm>

#include "base/status_macros.h"
#include "absl/strings/str_cat.h"
#include "engine/precision_map.h"

namespace duet::tools {

void AddLoadFlags(FlagSet& f) {
  f.String("weight-dtype", "auto", engine::kWeightDTypeHelp);
  f.String("precision-map", "",
           "JSON file of each layer's weight dtype (as duet precision-plan writes it); --weight-dtype then applies "
           "to the embedding and lm_head where the map names no dtype for them");
  f.String("kv-dtype", "auto", engine::kKvDTypeHelp);
  f.String("cpu-kernels", "exact",
           "the CPU backend's GEMMs on q8, q4 and q4z weights: exact (the F32 product over the dequantized weights) "
           "or int8 (each activation row quantized to int8 in blocks of 32 and integer dot products: faster "
           "decode, not the exact product; both batch-invariant; kernels/README.md gives int8's quality)");
  f.String("device", "cpu",
           "the kernel backend: cpu; cuda (a --config=cuda build on a GPU: every op in F32, correctness first, "
           "kernels/README.md); cuda-emulated (the CUDA kernels on the CPU by the SIMT executor, for tests; slow). "
           "Not cpu: --tp/--pp ranks are threads, each with its own CUDA backend on the one device, their collectives "
           "through host memory (no NCCL yet); prefill and decode workers move KV through a host copy of the pool");
  f.String("activation-dtype", "auto",
           "the activations' dtype: auto (the backend's: f32 on cpu, bf16 on cuda and cuda-emulated) | f32 (the "
           "CPU's arithmetic, what tests compare with it) | bf16 (cuda: GEMM inputs rounded to bf16 with f32 "
           "accumulation, bf16 the default KV dtype; the residual stream and the other ops stay f32)");
  f.Int("cuda-graph-max-batch", 0,
        "decode steps of up to this many sequences replayed as CUDA graphs (one per bucket: 1, 2, 4, 8, then "
        "multiples of 8; each captured after its first eager step); 0: every step eager. --device cuda or "
        "cuda-emulated, one rank; not yet verified on a GPU");
  f.Bool("deterministic",
         "a request's tokens independent of what it is batched with on every backend: the CPU kernels always "
         "are; --device cuda then replaces cuBLAS by a fixed-order GEMM kernel (slower: kernels/README.md)");
  f.Int("tp", 1,
        "tensor parallelism: ranks that split the attention heads, the KV heads and the MLP (it must divide each); "
        "on the CPU backend each rank is a thread of this process with --threads / tp threads");
  f.Int("pp", 1,
        "pipeline parallelism: stages of consecutive layers; on the CPU backend each is a thread of this process, "
        "and a step passes them in turn (as on a GPU, a stage waits for the one before it)");
}

absl::StatusOr<engine::LoadOptions> LoadOptionsFromFlags(const FlagSet& f) {
  engine::LoadOptions o;
  ASSIGN_OR_RETURN(o.weight_dtype, engine::ParseWeightDType(f.GetString("weight-dtype")));
  ASSIGN_OR_RETURN(o.kv_dtype, engine::ParseKvDType(f.GetString("kv-dtype")));
  if (!f.GetString("precision-map").empty()) {
    ASSIGN_OR_RETURN(o.precision_map, engine::ReadPrecisionMap(f.GetString("precision-map")));
  }
  if (const std::string k = f.GetString("cpu-kernels"); k == "int8") {
    o.cpu_kernels = kernels::CpuKernels::kInt8Activations;
  } else if (k != "exact") {
    return absl::InvalidArgumentError(absl::StrCat("--cpu-kernels: \"", k, "\" is not exact or int8"));
  }
  o.tp = static_cast<int>(f.GetInt("tp"));
  o.pp = static_cast<int>(f.GetInt("pp"));
  if (o.tp < 1 || o.pp < 1) return absl::InvalidArgumentError("--tp and --pp must be >= 1");
  o.device = f.GetString("device");
  o.deterministic = f.GetBool("deterministic");
  o.graph_max_batch = static_cast<int>(f.GetInt("cuda-graph-max-batch"));
  if (o.graph_max_batch < 0) return absl::InvalidArgumentError("--cuda-graph-max-batch must be >= 0");
  if (o.graph_max_batch > 0 && o.device == "cpu") {
    return absl::InvalidArgumentError("--cuda-graph-max-batch: the CPU backend has no graphs (--device cuda)");
  }
  if (const std::string a = f.GetString("activation-dtype"); a == "f32") {
    o.activation_dtype = kernels::DType::kF32;
  } else if (a == "bf16") {
    o.activation_dtype = kernels::DType::kBF16;  // NewBackend refuses it on the CPU
  } else if (a != "auto") {
    return absl::InvalidArgumentError(absl::StrCat("--activation-dtype: \"", a, "\" is not auto, f32 or bf16"));
  }
  if (o.device != "cpu" && o.device != "cuda" && o.device != "cuda-emulated") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: \"", o.device, "\" is not cpu, cuda or cuda-emulated"));
  }
  // --threads is the process's budget: the tensor-parallel ranks share it
  // (the stages run one after another, so each may use a rank's share).
  if (const int64_t threads = f.GetInt("threads"); threads > 0) {
    o.rank_threads = std::max(1, static_cast<int>(threads) / o.tp);
  }
  return o;
}

}  // namespace duet::tools
