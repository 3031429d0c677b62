// The SIMT executor on small kernels written as CUDA: a correct block sum
// over shuffles and shared memory gives the host's sum under every seed,
// and each mutation a GPU would punish is caught: a removed __syncthreads
// (race checker), a wrong shuffle lane (wrong result), an out-of-bounds
// shared index, a divergent barrier (reported, no hang), a lane missing from
// a shuffle mask, a host read of device memory (a fault) and a missing event
// wait between two streams (a wrong result under some seed). Graph capture
// replays, and refuses synchronous calls while capturing.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "kernels/simt/simt.h"
#include "kernels/testing/op_testing.h"

namespace duet::simt {
namespace {

using kernels::testing::Random;

constexpr int kWarp = 32;

// Which mutation a kernel runs with.
enum class Mutant { kNone, kNoBarrier, kWrongLane, kOutOfBounds, kDivergentBarrier, kNarrowMask };

// Sum of v over the block (blockDim.x a multiple of 32), to every thread.
__device__ float BlockSum(float v, Mutant m) {
  DUET_SHARED(float, partial, 32);
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const int lane_mask = m == Mutant::kWrongLane && offset == 4 ? 8 : offset;  // 8 twice: a lane pair missed
    const unsigned mask = m == Mutant::kNarrowMask ? 0x0000ffffu : 0xffffffffu;
    v += __shfl_xor_sync(mask, v, lane_mask);
  }
  const int lane = threadIdx.x % kWarp;
  const int at = m == Mutant::kOutOfBounds ? static_cast<int>(threadIdx.x / kWarp) + 32 : threadIdx.x / kWarp;
  if (lane == 0) partial[at] = v;
  if (m == Mutant::kDivergentBarrier) {
    if (threadIdx.x < 32) {  // The first warp waits at one barrier, the others at another.
      __syncthreads();
    } else {
      __syncthreads();
    }
  } else if (m != Mutant::kNoBarrier) {
    __syncthreads();
  }
  v = lane < static_cast<int>(blockDim.x / kWarp) ? static_cast<float>(partial[lane]) : 0.0f;
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// out[row] = sum of x's row (one block per row).
__global__ void RowSums(const float* x, float* out, int dim, Mutant m) {
  float s = 0;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) s += x[blockIdx.x * dim + i];
  s = BlockSum(s, m);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

struct Device {
  std::vector<void*> held;
  template <typename T>
  T* Put(const std::vector<T>& host) {
    void* p = nullptr;
    REQUIRE(cudaMalloc(&p, host.size() * sizeof(T)) == cudaSuccess);
    REQUIRE(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
    held.push_back(p);
    return static_cast<T*>(p);
  }
  template <typename T>
  std::vector<T> Get(const T* p, size_t n) {
    std::vector<T> out(n);
    REQUIRE(cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return out;
  }
  ~Device() {
    ResetDevice();
    for (void* p : held) cudaFree(p);
  }
};

// Runs RowSums with mutation m; returns the sync's error (the fault, if any, in LastFault()).
cudaError_t RunRowSums(Device& dev, Mutant m, int rows, int dim, int threads, std::vector<float>* sums) {
  const std::vector<float> x = Random(static_cast<size_t>(rows * dim), 3);
  const float* dx = dev.Put(x);
  float* dout = dev.Put(std::vector<float>(static_cast<size_t>(rows)));
  DUET_LAUNCH(RowSums, dim3(rows), dim3(threads), 0, nullptr)(dx, dout, dim, m);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  const cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess && sums != nullptr) *sums = dev.Get(dout, static_cast<size_t>(rows));
  return e;
}

std::vector<float> HostRowSums(int rows, int dim) {
  const std::vector<float> x = Random(static_cast<size_t>(rows * dim), 3);
  std::vector<float> want(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    double s = 0;
    for (int i = 0; i < dim; ++i) s += x[static_cast<size_t>(r * dim + i)];
    want[static_cast<size_t>(r)] = static_cast<float>(s);
  }
  return want;
}

TEST_CASE("a block sum over shuffles and shared memory is right under every seed", "[simt]") {
  for (uint64_t seed : {1, 2, 3, 4}) {
    SetSeed(seed);
    for (int threads : {32, 96, 256}) {
      Device dev;
      std::vector<float> got;
      INFO("seed " << seed << ", " << threads << " threads: " << LastFault());
      REQUIRE(RunRowSums(dev, Mutant::kNone, 5, 300, threads, &got) == cudaSuccess);
      CHECK(kernels::testing::MaxRelError(got, HostRowSums(5, 300)) < 1e-5);
    }
  }
}

TEST_CASE("mutations: a removed barrier, an out-of-bounds shared index, a divergent barrier and a narrow mask are "
          "reported; a wrong shuffle lane gives a wrong sum",
          "[simt]") {
  SetSeed(7);
  struct Case {
    Mutant m;
    const char* says;
  };
  for (const Case& c : {Case{Mutant::kNoBarrier, "data race on shared partial["},
                        Case{Mutant::kOutOfBounds, "is out of bounds (32 elements"},
                        Case{Mutant::kDivergentBarrier, "divergent barrier"},
                        Case{Mutant::kNarrowMask, "mask 0xffff"}}) {
    Device dev;
    INFO("expects: " << c.says);
    REQUIRE(RunRowSums(dev, c.m, 3, 300, 96, nullptr) == cudaErrorLaunchFailure);
    CHECK_THAT(LastFault(), Catch::Contains(c.says));
    CHECK_THAT(LastFault(), Catch::Contains("RowSums block"));
    // The error is sticky until the device is reset, as CUDA's is.
    CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  }
  Device dev;
  std::vector<float> got;
  REQUIRE(RunRowSums(dev, Mutant::kWrongLane, 3, 300, 96, &got) == cudaSuccess);
  CHECK(kernels::testing::MaxRelError(got, HostRowSums(3, 300)) > 1e-2);
}

__global__ void WaitForLaneThatExits(float* out) {
  if (threadIdx.x == 3) return;
  out[threadIdx.x] = __shfl_sync(0xffffffffu, 1.0f, 0);
}

TEST_CASE("a warp operation waiting for a lane that exited is reported, not a hang", "[simt]") {
  Device dev;
  float* out = dev.Put(std::vector<float>(32));
  DUET_LAUNCH(WaitForLaneThatExits, dim3(1), dim3(32), 0, nullptr)(out);
  REQUIRE(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  CHECK_THAT(LastFault(), Catch::Contains("for lane 3, which has exited"));
}

TEST_CASE("a launch with more than 1024 threads is refused at launch", "[simt]") {
  Device dev;
  float* out = dev.Put(std::vector<float>(32));
  DUET_LAUNCH(WaitForLaneThatExits, dim3(1), dim3(2048), 0, nullptr)(out);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("device memory faults when host code reads it, and copies reach it", "[simt]") {
  Device dev;
  float* p = dev.Put(std::vector<float>{2.5f});
  CHECK(dev.Get(p, 1)[0] == 2.5f);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    signal(SIGSEGV, SIG_DFL);
    const volatile float* at = p;
    _exit(*at == 2.5f ? 0 : 1);  // faults
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
}

__global__ void Fill(float* x, int n, float v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = v;
}
__global__ void Copy(const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i];
}

// Stream a fills x, stream b copies x to y: with an event between them, or
// (wait false) without; whether y got a's values.
bool TwoStreams(bool wait) {
  Device dev;
  const int n = 64;
  float* x = dev.Put(std::vector<float>(n, 0.0f));
  float* y = dev.Put(std::vector<float>(n, 0.0f));
  cudaStream_t a = nullptr, b = nullptr;
  cudaEvent_t filled = nullptr;
  REQUIRE(cudaStreamCreate(&a) == cudaSuccess);
  REQUIRE(cudaStreamCreate(&b) == cudaSuccess);
  REQUIRE(cudaEventCreate(&filled) == cudaSuccess);
  DUET_LAUNCH(Fill, dim3(2), dim3(32), 0, a)(x, n, 1.0f);
  REQUIRE(cudaEventRecord(filled, a) == cudaSuccess);
  if (wait) REQUIRE(cudaStreamWaitEvent(b, filled, 0) == cudaSuccess);
  DUET_LAUNCH(Copy, dim3(2), dim3(32), 0, b)(x, y, n);
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  const bool right = dev.Get(y, n) == std::vector<float>(n, 1.0f);
  REQUIRE(cudaStreamDestroy(a) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(b) == cudaSuccess);
  return right;
}

TEST_CASE("a missing event wait between two streams gives a wrong result under some seed; the wait fixes every seed",
          "[simt]") {
  int wrong_without = 0;
  for (uint64_t seed = 1; seed <= 16; ++seed) {
    SetSeed(seed);
    INFO("seed " << seed);
    CHECK(TwoStreams(true));
    if (!TwoStreams(false)) ++wrong_without;
  }
  CHECK(wrong_without > 0);
}

TEST_CASE("graph capture records a stream's work and replays it; a synchronous call or a host copy while "
          "capturing is refused",
          "[simt]") {
  Device dev;
  const int n = 40;
  float* x = dev.Put(std::vector<float>(n, 0.0f));
  float* y = dev.Put(std::vector<float>(n, 0.0f));
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreate(&s) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  DUET_LAUNCH(Fill, dim3(2), dim3(32), 0, s)(x, n, 3.0f);
  DUET_LAUNCH(Copy, dim3(2), dim3(32), 0, s)(x, y, n);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  // Nothing ran while capturing.
  CHECK(dev.Get(y, n) == std::vector<float>(n, 0.0f));
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    REQUIRE(cudaMemset(y, 0, n * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(dev.Get(y, n) == std::vector<float>(n, 3.0f));
  }
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
  CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
  REQUIRE(cudaGetLastError() == cudaErrorStreamCaptureInvalidated);
  // A copy from pageable host memory cannot be recorded either.
  const std::vector<float> host(n, 1.0f);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(cudaMemcpyAsync(x, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, s) ==
        cudaErrorStreamCaptureUnsupported);
  CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
  REQUIRE(cudaGetLastError() == cudaErrorStreamCaptureInvalidated);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

}  // namespace
}  // namespace duet::simt
