#include "kernels/cuda/cuda_ops.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/cuda_status.h"
#include "kernels/cuda/rms_norm.cuh"
#include "kernels/cuda/rope.cuh"

namespace duet::kernels::cuda {

using ::duet::CudaStatus;
absl::StatusOr<int> RequireDevice() {
  int count = 0;
  absl::Status status = CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (!status.ok()) return status;
  if (count == 0) return absl::UnavailableError("cudaGetDeviceCount: no CUDA device visible");
  return count;
}

absl::Status RmsNorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                     cudaStream_t stream) {
  // Checked here too so that a bad shape reads as such, not as a CUDA error.
  if (rows < 0 || dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RmsNorm: need rows >= 0 and dim > 0, got rows=", rows, " dim=", dim));
  }
  return CudaStatus(LaunchRmsNorm(x, w, y, rows, dim, eps, stream), "RmsNorm launch");
}

absl::Status Rope(float* x, const int32_t* positions, const float* inv_freq, int64_t num_tokens,
                  int64_t num_heads, int64_t head_dim, cudaStream_t stream) {
  if (num_tokens < 0 || num_heads < 0 || head_dim < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Rope: negative shape, num_tokens=", num_tokens,
                                                   " num_heads=", num_heads,
                                                   " head_dim=", head_dim));
  }
  return CudaStatus(LaunchRope(x, positions, inv_freq, num_tokens, num_heads, head_dim, stream),
                    "Rope launch");
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer buffer;
  absl::Status status =
      CudaStatus(cudaMalloc(&buffer.ptr_, bytes), absl::StrCat("cudaMalloc(", bytes, ")"));
  if (!status.ok()) return status;
  buffer.bytes_ = bytes;
  return buffer;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { Reset(); }

void DeviceBuffer::Reset() {
  // A destructor cannot report; cudaFree fails only after an earlier sticky
  // error, which the owner has already seen.
  if (ptr_ != nullptr) cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

absl::Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes) {
  return CudaStatus(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice),
                    "cudaMemcpy host to device");
}

absl::Status CopyToHost(void* host_dst, const void* device_src, size_t bytes) {
  return CudaStatus(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost),
                    "cudaMemcpy device to host");
}

absl::Status Synchronize(cudaStream_t stream) {
  return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

}  // namespace duet::kernels::cuda
