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
  CudaBackendOptions options{.deterministic = o.deterministic};
  if (o.activation_dtype.has_value()) options.activation_dtype = *o.activation_dtype;  // else the backend's default
  return NewCudaBackend(options);
});

}  // namespace
}  // namespace duet::kernels::cuda
