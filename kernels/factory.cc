#include "kernels/factory.h"

#include "absl/strings/str_cat.h"

namespace duet::kernels {

absl::StatusOr<KernelBackendPtr> NewBackend(const BackendOptions& options) {
  if (options.kind == "cpu") return NewCpuBackend(options.threads, options.cpu_kernels);
  if (options.kind == "cuda") {
    return absl::UnimplementedError(
        "the CUDA backend is not built yet: the engine runs on the CPU backend (kernels/cuda holds its first ops)");
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown kernel backend \"", options.kind, "\" (cpu | cuda)"));
}

}  // namespace duet::kernels
