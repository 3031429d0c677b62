// The CUDA backend offered to kernels::NewBackend: as "cuda" where this
// file is compiled against the CUDA runtime (register_cuda, --config=cuda),
// as "cuda-emulated" against the SIMT executor (register_cuda_simt).
#include "kernels/cuda/cuda_backend.h"
#include "kernels/factory.h"

namespace duet::kernels::cuda {
namespace {

#if defined(DUET_SIMT)
constexpr char kKind[] = "cuda-emulated";
#else
constexpr char kKind[] = "cuda";
#endif

const bool registered = RegisterBackend(kKind, [](const BackendOptions& o) {
  return NewCudaBackend({.deterministic = o.deterministic, .activation_dtype = o.activation_dtype.value_or(DType::kBF16)});
});

}  // namespace
}  // namespace duet::kernels::cuda
