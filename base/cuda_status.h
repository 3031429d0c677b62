// CUDA runtime errors as absl::Status, in the library's own words (STYLE.md
// rule 3): the one conversion the CUDA ops and the GPU transports share.
//
//   RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, bytes), "cudaMalloc"));
//   LOG(WARNING) << "cudaFree: " << CudaErrorText(err);
//
// Built only under --config=cuda.
#ifndef DUET_BASE_CUDA_STATUS_H_
#define DUET_BASE_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace duet {

// "cudaErrorMemoryAllocation: out of memory".
std::string CudaErrorText(cudaError_t err);

// OK for cudaSuccess; otherwise "what: <CudaErrorText>" with a code that says
// what a caller can do: InvalidArgument (a bad value, pointer, handle or
// launch configuration), ResourceExhausted (out of memory), Unavailable (no
// usable device or driver), FailedPrecondition (not supported here),
// Internal (anything else).
absl::Status CudaStatus(cudaError_t err, absl::string_view what);

}  // namespace duet

#endif  // DUET_BASE_CUDA_STATUS_H_
