// The one place a service gets its kernel backend from.
//
//   ASSIGN_OR_RETURN(kernels::KernelBackendPtr be, kernels::NewBackend({.threads = 2}));
//
// Kinds: "cpu" (kernels/cpu, AVX2/FMA with scalar fallbacks) in every
// binary; "cuda" (kernels/cuda on a GPU) and "cuda-emulated" (the same
// kernels on the SIMT executor's emulated device, kernels/simt) where the
// binary links their registration (kernels/cuda:register_cuda under
// --config=cuda, :register_cuda_simt otherwise: one binary cannot hold both
// the CUDA runtime and its emulation). The duet binary links the one its
// build has.
#ifndef DUET_KERNELS_FACTORY_H_
#define DUET_KERNELS_FACTORY_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/dtype.h"

namespace duet::kernels {

struct BackendOptions {
  std::string kind = "cpu";
  int threads = 0;  // CPU: <= 0 means every core this process may run on.
  CpuKernels cpu_kernels = CpuKernels::kBatchInvariant;
  // A row's output the same bits whatever it is batched with: the CPU
  // kernels always are; the CUDA backend then takes its fixed-order GEMM.
  bool deterministic = false;
  // The activations' dtype: nullopt for the backend's own (the CPU's f32,
  // CUDA's bf16); the CPU backend takes only f32, CUDA f32 or bf16.
  std::optional<DType> activation_dtype;
};

// InvalidArgument for an unknown kind, Unimplemented for one this binary
// does not hold (with the build that has it), else the maker's answer.
absl::StatusOr<KernelBackendPtr> NewBackend(const BackendOptions& options);

// Makes `kind` available to NewBackend (from a static initializer of a
// library linked with alwayslink); a second registration of a kind replaces
// the first.
using BackendMaker = std::function<absl::StatusOr<KernelBackendPtr>(const BackendOptions&)>;
bool RegisterBackend(const std::string& kind, BackendMaker make);

}  // namespace duet::kernels

#endif  // DUET_KERNELS_FACTORY_H_
