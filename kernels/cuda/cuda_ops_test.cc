// Each CUDA op against its CPU reference by normalized error. Needs a device:
// without one every case fails on RequireDevice with the CUDA error string.
#include "kernels/cuda/cuda_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "kernels/cpu/reference.h"
#include "kernels/rope.h"

namespace duet::kernels::cuda {
namespace {

constexpr double kTolerance = 1e-5;

void RequireOk(const absl::Status& status) {
  INFO(status.ToString());
  REQUIRE(status.ok());
}

void RequireDeviceOrFail() { RequireOk(RequireDevice().status()); }

std::vector<float> Random(size_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// max|got - want| / max|want|: one bound for every shape and magnitude.
double NormalizedError(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(static_cast<double>(got[i]) - want[i]));
    max_ref = std::max(max_ref, std::abs(static_cast<double>(want[i])));
  }
  REQUIRE(max_ref > 0);
  return max_diff / max_ref;
}

template <typename T>
DeviceBuffer Upload(const std::vector<T>& host) {
  absl::StatusOr<DeviceBuffer> buffer = DeviceBuffer::Allocate(host.size() * sizeof(T));
  RequireOk(buffer.status());
  RequireOk(CopyToDevice(buffer->data<void>(), host.data(), host.size() * sizeof(T)));
  return std::move(buffer).value();
}

std::vector<float> Download(const DeviceBuffer& buffer, size_t n) {
  std::vector<float> host(n);
  RequireOk(CopyToHost(host.data(), buffer.data<void>(), n * sizeof(float)));
  return host;
}

TEST_CASE("RmsNorm matches the reference", "[gpu]") {
  RequireDeviceOrFail();
  std::mt19937 rng(42);
  const float eps = 1e-5f;
  // Dims 1, 7 and 100 leave the 32-wide warps partly idle; 1 and 7 also take
  // the scalar path, the multiples of 4 the float4 one.
  for (int64_t rows : {1, 7, 96, 4096}) {
    for (int64_t dim : {1, 7, 64, 100, 768, 5120}) {
      INFO("rows=" << rows << " dim=" << dim);
      const std::vector<float> x = Random(rows * dim, -2.0f, 2.0f, rng);
      const std::vector<float> w = Random(dim, 0.5f, 1.5f, rng);
      std::vector<float> want(x.size());
      ref::RmsNorm(x.data(), w.data(), want.data(), rows, dim, eps);

      DeviceBuffer dx = Upload(x), dw = Upload(w);
      absl::StatusOr<DeviceBuffer> dy = DeviceBuffer::Allocate(x.size() * sizeof(float));
      RequireOk(dy.status());
      RequireOk(
          RmsNorm(dx.data<float>(), dw.data<float>(), dy->data<float>(), rows, dim, eps, nullptr));
      RequireOk(Synchronize(nullptr));
      CHECK(NormalizedError(Download(*dy, x.size()), want) <= kTolerance);

      // In place, as the model runs it on the residual stream's copy.
      RequireOk(
          RmsNorm(dx.data<float>(), dw.data<float>(), dx.data<float>(), rows, dim, eps, nullptr));
      RequireOk(Synchronize(nullptr));
      CHECK(NormalizedError(Download(dx, x.size()), want) <= kTolerance);
    }
  }
}

TEST_CASE("RmsNorm on unaligned rows takes the scalar path and still matches", "[gpu]") {
  RequireDeviceOrFail();
  std::mt19937 rng(7);
  const int64_t rows = 5, dim = 768;
  // One float of offset breaks 16-byte alignment though dim % 4 == 0.
  const std::vector<float> x = Random(rows * dim + 1, -3.0f, 3.0f, rng);
  const std::vector<float> w = Random(dim, -1.0f, 1.0f, rng);
  std::vector<float> want(rows * dim);
  ref::RmsNorm(x.data() + 1, w.data(), want.data(), rows, dim, 1e-6f);

  DeviceBuffer dx = Upload(x), dw = Upload(w);
  absl::StatusOr<DeviceBuffer> dy = DeviceBuffer::Allocate((rows * dim + 1) * sizeof(float));
  RequireOk(dy.status());
  RequireOk(RmsNorm(dx.data<float>() + 1, dw.data<float>(), dy->data<float>() + 1, rows, dim, 1e-6f,
                    nullptr));
  RequireOk(Synchronize(nullptr));
  std::vector<float> got = Download(*dy, rows * dim + 1);
  got.erase(got.begin());
  CHECK(NormalizedError(got, want) <= kTolerance);
}

TEST_CASE("RmsNorm rejects a bad shape with InvalidArgument", "[gpu]") {
  RequireDeviceOrFail();
  CHECK(RmsNorm(nullptr, nullptr, nullptr, 4, 0, 1e-5f, nullptr).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(RmsNorm(nullptr, nullptr, nullptr, -1, 8, 1e-5f, nullptr).code() ==
        absl::StatusCode::kInvalidArgument);
  // Zero rows is a valid empty batch and launches nothing.
  RequireOk(RmsNorm(nullptr, nullptr, nullptr, 0, 8, 1e-5f, nullptr));
}

struct RopeShape {
  int64_t num_tokens, num_heads, head_dim;
};

void CheckRope(const RopeConfig& config, const RopeShape& shape, std::mt19937& rng) {
  INFO("tokens=" << shape.num_tokens << " heads=" << shape.num_heads
                 << " head_dim=" << shape.head_dim << " llama3=" << config.llama3_factor);
  const std::vector<float> inv_freq = RopeInvFreq(config);
  // The first and last tokens pin the extremes; the rest spread up to 1e5.
  std::uniform_int_distribution<int32_t> pos_dist(0, 100000);
  std::vector<int32_t> positions(shape.num_tokens);
  for (int32_t& p : positions) p = pos_dist(rng);
  positions.front() = 100000;
  if (shape.num_tokens > 1) positions.back() = 0;
  const std::vector<float> x =
      Random(shape.num_tokens * shape.num_heads * shape.head_dim, -2.0f, 2.0f, rng);
  std::vector<float> want = x;
  ref::Rope(want.data(), positions.data(), inv_freq.data(), shape.num_tokens, shape.num_heads,
            shape.head_dim);

  DeviceBuffer dx = Upload(x), dpos = Upload(positions), dfreq = Upload(inv_freq);
  RequireOk(Rope(dx.data<float>(), dpos.data<int32_t>(), dfreq.data<float>(), shape.num_tokens,
                 shape.num_heads, shape.head_dim, nullptr));
  RequireOk(Synchronize(nullptr));
  CHECK(NormalizedError(Download(dx, x.size()), want) <= kTolerance);
}

TEST_CASE("Rope matches the reference up to position 1e5", "[gpu]") {
  RequireDeviceOrFail();
  std::mt19937 rng(1234);
  RopeConfig plain;
  plain.theta = 10000.0;
  // Llama-3.1's rope_scaling.
  RopeConfig llama3;
  llama3.theta = 500000.0;
  llama3.llama3_factor = 8.0;
  llama3.llama3_low_freq_factor = 1.0;
  llama3.llama3_high_freq_factor = 4.0;
  llama3.llama3_original_max_position = 8192.0;
  // head_dim 100 (50 pairs) and 2 leave warps partly idle; 640 (320 pairs)
  // is more than one 256-thread row covers, so its threads loop.
  const std::vector<RopeShape> shapes = {
      {1, 1, 64}, {7, 8, 100}, {96, 32, 128}, {4096, 8, 128}, {5, 3, 2}, {3, 2, 640}, {96, 4, 64},
  };
  for (RopeConfig config : {plain, llama3}) {
    for (const RopeShape& shape : shapes) {
      config.head_dim = static_cast<int>(shape.head_dim);
      CheckRope(config, shape, rng);
    }
  }
}

TEST_CASE("Rope rejects a negative shape with InvalidArgument", "[gpu]") {
  RequireDeviceOrFail();
  CHECK(Rope(nullptr, nullptr, nullptr, -1, 8, 64, nullptr).code() ==
        absl::StatusCode::kInvalidArgument);
  RequireOk(Rope(nullptr, nullptr, nullptr, 0, 8, 64, nullptr));
}

}  // namespace
}  // namespace duet::kernels::cuda
