#include "base/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace duet {

std::string CudaErrorText(cudaError_t err) {
  return absl::StrCat(cudaGetErrorName(err), ": ", cudaGetErrorString(err));
}

absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  struct Mapping {
    cudaError_t err;
    absl::StatusCode code;
  };
  static constexpr Mapping kCodes[] = {
      {cudaErrorInvalidValue, absl::StatusCode::kInvalidArgument},
      {cudaErrorInvalidDevicePointer, absl::StatusCode::kInvalidArgument},
      {cudaErrorInvalidResourceHandle, absl::StatusCode::kInvalidArgument},
      {cudaErrorInvalidConfiguration, absl::StatusCode::kInvalidArgument},
      {cudaErrorMemoryAllocation, absl::StatusCode::kResourceExhausted},
      {cudaErrorNoDevice, absl::StatusCode::kUnavailable},
      {cudaErrorInsufficientDriver, absl::StatusCode::kUnavailable},
      {cudaErrorDevicesUnavailable, absl::StatusCode::kUnavailable},
      {cudaErrorInvalidDevice, absl::StatusCode::kUnavailable},
      {cudaErrorNotSupported, absl::StatusCode::kFailedPrecondition},
  };
  absl::StatusCode code = absl::StatusCode::kInternal;
  for (const Mapping& m : kCodes) {
    if (m.err == err) code = m.code;
  }
  return absl::Status(code, absl::StrCat(what, ": ", CudaErrorText(err)));
}

}  // namespace duet
