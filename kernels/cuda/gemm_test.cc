// The GEMM seam against the CPU's reference GEMM on the same (rounded)
// inputs, for F32, BF16 and F16 (and BF16 or F16 inputs into F32), on odd
// shapes, padded strides, alpha and beta: on the SIMT runtime here, on a GPU
// (cuBLAS) in the gpu-tagged twin.
#include "kernels/cuda/gemm.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <tuple>
#include <vector>

#include "kernels/cpu/reference.h"
#include "kernels/dtype.h"
#include "kernels/testing/op_testing.h"

namespace duet::kernels::cuda {
namespace {

using testing::Random;

size_t Bytes(GemmType t) { return t == GemmType::kF32 ? 4 : 2; }

// `v` in dtype t, as bytes, and the floats those bytes hold.
std::vector<uint8_t> Encode(const std::vector<float>& v, GemmType t, std::vector<float>* rounded) {
  std::vector<uint8_t> out(v.size() * Bytes(t));
  rounded->resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == GemmType::kF32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
      (*rounded)[i] = v[i];
      continue;
    }
    const uint16_t h = t == GemmType::kBF16 ? FloatToBf16(v[i]) : FloatToHalf(v[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
    (*rounded)[i] = t == GemmType::kBF16 ? Bf16ToFloat(h) : HalfToFloat(h);
  }
  return out;
}

std::vector<float> Decode(const std::vector<uint8_t>& bytes, GemmType t) {
  std::vector<float> out(bytes.size() / Bytes(t));
  for (size_t i = 0; i < out.size(); ++i) {
    if (t == GemmType::kF32) {
      std::memcpy(&out[i], bytes.data() + 4 * i, 4);
      continue;
    }
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    out[i] = t == GemmType::kBF16 ? Bf16ToFloat(h) : HalfToFloat(h);
  }
  return out;
}

void* Upload(const std::vector<uint8_t>& host) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, host.size()) == cudaSuccess);
  REQUIRE(cudaMemcpy(p, host.data(), host.size(), cudaMemcpyHostToDevice) == cudaSuccess);
  return p;
}

TEST_CASE("the GEMM seam matches the CPU GEMM for F32, BF16 and F16, odd shapes, strides, alpha and beta", "[gemm]") {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  struct Types {
    GemmType in, out;
    double tolerance;  // NMSE: the output's rounding (F32 accumulates either way)
  };
  for (const Types& t : {Types{GemmType::kF32, GemmType::kF32, 1e-10}, Types{GemmType::kBF16, GemmType::kBF16, 1e-4},
                         Types{GemmType::kF16, GemmType::kF16, 1e-6}, Types{GemmType::kBF16, GemmType::kF32, 1e-10},
                         Types{GemmType::kF16, GemmType::kF32, 1e-10}}) {
    for (auto [m, n, k, pad] : std::vector<std::tuple<int, int, int, int>>{
             {1, 1, 1, 0}, {1, 70, 37, 0}, {3, 33, 64, 5}, {17, 40, 100, 3}}) {
      for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.5f, 2.0f}}) {
        const int lda = k + pad, ldb = k + pad, ldc = n + pad;
        std::vector<float> a_r, b_r, c_r;
        const std::vector<uint8_t> a = Encode(Random(static_cast<size_t>(m * lda), 1), t.in, &a_r);
        const std::vector<uint8_t> b = Encode(Random(static_cast<size_t>(n * ldb), 2), t.in, &b_r);
        const std::vector<uint8_t> c = Encode(Random(static_cast<size_t>(m * ldc), 3), t.out, &c_r);
        void *da = Upload(a), *db = Upload(b), *dc = Upload(c);
        REQUIRE(Gemm({.m = m, .n = n, .k = k, .a = da, .a_type = t.in, .lda = lda, .b = db, .b_type = t.in,
                      .ldb = ldb, .c = dc, .c_type = t.out, .ldc = ldc, .alpha = alpha, .beta = beta},
                     stream) == cudaSuccess);
        REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
        std::vector<uint8_t> got_bytes(c.size());
        REQUIRE(cudaMemcpy(got_bytes.data(), dc, c.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
        const std::vector<float> got = Decode(got_bytes, t.out);
        // The CPU's: the reference GEMM over the unpadded rounded inputs.
        std::vector<float> ap(static_cast<size_t>(m * k)), bp(static_cast<size_t>(n * k)), prod(static_cast<size_t>(m * n));
        for (int i = 0; i < m; ++i) std::copy_n(a_r.begin() + i * lda, k, ap.begin() + i * k);
        for (int j = 0; j < n; ++j) std::copy_n(b_r.begin() + j * ldb, k, bp.begin() + j * k);
        ref::Gemm(ap.data(), bp.data(), prod.data(), m, n, k, false);
        std::vector<float> want = c_r, got_used = c_r;
        for (int i = 0; i < m; ++i) {
          for (int j = 0; j < n; ++j) {
            const size_t at = static_cast<size_t>(i * ldc + j);
            want[at] = alpha * prod[static_cast<size_t>(i * n + j)] + beta * c_r[at];
            got_used[at] = got[at];
          }
        }
        INFO("m=" << m << " n=" << n << " k=" << k << " pad=" << pad << " alpha=" << alpha << " beta=" << beta
                  << " in " << static_cast<int>(t.in) << " out " << static_cast<int>(t.out));
        CHECK(testing::Nmse(got_used, want) <= t.tolerance);
        // The padding past each row of C is untouched.
        for (int i = 0; i < m; ++i) {
          for (int j = n; j < ldc; ++j) CHECK(got[static_cast<size_t>(i * ldc + j)] == c_r[static_cast<size_t>(i * ldc + j)]);
        }
        for (void* p : {da, db, dc}) REQUIRE(cudaFree(p) == cudaSuccess);
      }
    }
  }
  CHECK(Gemm({.m = 2, .n = 2, .k = 4, .lda = 3}, stream) == cudaErrorInvalidValue);  // lda below k
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
}

}  // namespace
}  // namespace duet::kernels::cuda
