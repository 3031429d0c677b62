// The CUDA backend's ops, with errors as absl::Status, plus the device-memory
// helpers its tests and callers need.
//
//   ASSIGN_OR_RETURN(DeviceBuffer x, DeviceBuffer::Allocate(rows * dim * 4));
//   RETURN_IF_ERROR(RmsNorm(x.data<float>(), w, x.data<float>(), rows, dim, eps, stream));
//
// Each op has the semantics of its kernels::ref counterpart (kernels/cpu/
// reference.h) on device memory, is enqueued on `stream` and returns without
// waiting; a kernel fault surfaces at the next synchronizing call. This is the
// boundary where cudaError_t becomes absl::Status (the .cuh launchers stay
// abseil-free for nvcc). Calls are thread-safe as far as the CUDA runtime is.
#ifndef DUET_KERNELS_CUDA_CUDA_OPS_H_
#define DUET_KERNELS_CUDA_CUDA_OPS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace duet::kernels::cuda {

// The number of visible devices; an error (never 0) when there is none or the
// driver is missing, so GPU tests fail loudly instead of passing vacuously.
absl::StatusOr<int> RequireDevice();

// y = x / sqrt(mean(x^2) + eps) * w per row; x and y may alias.
absl::Status RmsNorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                     cudaStream_t stream);

// Rotates x (num_tokens x num_heads x head_dim) in place; inv_freq holds
// head_dim / 2 values from kernels::RopeInvFreq, positions num_tokens.
absl::Status Rope(float* x, const int32_t* positions, const float* inv_freq, int64_t num_tokens,
                  int64_t num_heads, int64_t head_dim, cudaStream_t stream);

// Owns one cudaMalloc'd allocation; freed on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  template <typename T>
  T* data() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void Reset();

  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Synchronous copies (they wait for the legacy default stream).
absl::Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes);
absl::Status CopyToHost(void* host_dst, const void* device_src, size_t bytes);

// Waits for `stream` and reports any error its work raised.
absl::Status Synchronize(cudaStream_t stream);

}  // namespace duet::kernels::cuda

#endif  // DUET_KERNELS_CUDA_CUDA_OPS_H_
