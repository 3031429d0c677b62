// The one place a service gets its kernel backend from.
//
//   ASSIGN_OR_RETURN(kernels::KernelBackendPtr be, kernels::NewBackend({.threads = 2}));
//
// Kinds: "cpu" (kernels/cpu, AVX2/FMA with scalar fallbacks). "cuda" is
// named so that asking for it says plainly that it is not built yet.
#ifndef DUET_KERNELS_FACTORY_H_
#define DUET_KERNELS_FACTORY_H_

#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"

namespace duet::kernels {

struct BackendOptions {
  std::string kind = "cpu";
  int threads = 0;  // CPU: <= 0 means every core this process may run on.
  CpuKernels cpu_kernels = CpuKernels::kBatchInvariant;
};

// InvalidArgument for an unknown kind, Unimplemented for one not built.
absl::StatusOr<KernelBackendPtr> NewBackend(const BackendOptions& options);

}  // namespace duet::kernels

#endif  // DUET_KERNELS_FACTORY_H_
