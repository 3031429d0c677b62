#include "base/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace duet {

std::string CudaErrorText(cudaError_t err) {
  return absl::StrCat(cudaGetErrorName(err), ": ", cudaGetErrorString(err));
}

absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  absl::StatusCode code = absl::StatusCode::kInternal;
  switch (err) {
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidConfiguration:
      code = absl::StatusCode::kInvalidArgument;
      break;
    case cudaErrorMemoryAllocation:
      code = absl::StatusCode::kResourceExhausted;
      break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInvalidDevice:
      code = absl::StatusCode::kUnavailable;
      break;
    case cudaErrorNotSupported:
      code = absl::StatusCode::kFailedPrecondition;
      break;
    default:
      break;
  }
  return absl::Status(code, absl::StrCat(what, ": ", CudaErrorText(err)));
}

}  // namespace duet
