// The SIMT executor: duet's CUDA sources (.cu) compiled by g++ as host code
// and run on the CPU, so that CI checks GPU code without a GPU, as nvcc's
// old device emulation and Triton's interpreter did. Include it through
// kernels/cuda/cuda_compat.h, which picks it (DUET_SIMT) or the CUDA headers.
//
// What a kernel sees is CUDA's: threadIdx, blockIdx, blockDim, gridDim,
// __syncthreads, __syncwarp, the warp shuffles and votes, atomics, the math
// and conversion intrinsics the kernels use, and shared memory declared by
// DUET_SHARED (which nvcc reads as __shared__). A launch is DUET_LAUNCH
// (kernel<<<grid, block, shmem, stream>>> under nvcc) and goes to the
// emulated runtime (runtime below): device memory, copies, memset, streams,
// events and graph capture, as the CUDA runtime API names them.
//
// How it runs: a block's threads are fibers (Boost.Context, each on a
// guard-paged stack) on the one OS thread that runs the launch; a thread runs
// until its next barrier or warp operation, then the next runnable thread is
// picked in an order drawn from a seed, so each run of a kernel interleaves
// its threads differently. Blocks run one after another, also in a seeded
// order. What a GPU would do wrong, or leave undefined, is a fault that ends
// the launch and is reported (LastFault(); the stream's next synchronisation
// returns cudaErrorLaunchFailure): a barrier some threads reach at another
// place or never, a warp operation one of whose mask lanes never comes, a
// shuffle from a lane outside the mask, a shared-memory index out of bounds,
// and a data race on shared memory: two threads touching one element between
// the same barriers (and, in one warp, the same warp operations), at least
// one of them writing.
//
// Device memory is guarded (kernels/guarded_memory.h): readable only inside a
// kernel or a copy, so a host dereference of a device pointer faults in CI
// as it would on a GPU. Work on a stream is deferred: it runs when someone
// synchronises (a stream, an event, the device, a synchronous copy), all
// streams' pending work then interleaving in a seeded order that keeps each
// stream's order, every event wait and the legacy default stream's implicit
// ordering with the other (blocking) streams, so a missing wait between two
// streams shows as a wrong result under some seed. While a stream captures
// a graph, a synchronous call, or a copy to or from host memory (all of it
// pageable here), is refused and voids the capture. Not
// emulated: dynamic shared memory, non-blocking streams, cross-stream
// capture, textures, cooperative launches.
#ifndef DUET_KERNELS_SIMT_SIMT_H_
#define DUET_KERNELS_SIMT_SIMT_H_

#ifdef __CUDACC__
#error "kernels/simt/simt.h is the host build's stand-in for CUDA; nvcc has its own"
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <source_location>
#include <string>
#include <type_traits>

// ---- CUDA's keywords and types, as host C++.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct float2 {
  float x, y;
};
struct float4 {
  float x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
constexpr int warpSize = 32;

// Half and bfloat16 as storage types with CUDA's conversions (round to nearest even).
struct __half {
  uint16_t bits;
};
struct __nv_bfloat16 {
  uint16_t bits;
};
__half __float2half(float f);
float __half2float(__half h);
__nv_bfloat16 __float2bfloat16(float f);
float __bfloat162float(__nv_bfloat16 h);

// Round-to-nearest arithmetic intrinsics (what the host does anyway) and the
// fast variants, here as exact as the plain ones.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline void __sincosf(float x, float* s, float* c) { sincosf(x, s, c); }

// ---- The runtime API, emulated (runtime.cc).
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureUnmatched = 903,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
using cudaStream_t = struct SimtStream*;
using cudaEvent_t = struct SimtEvent*;
using cudaGraph_t = struct SimtGraph*;
using cudaGraphExec_t = struct SimtGraph*;

cudaError_t cudaGetDeviceCount(int* count);  // One emulated device.
cudaError_t cudaMalloc(void** ptr, size_t bytes);
template <typename T>
cudaError_t cudaMalloc(T** ptr, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t error);

namespace duet::simt {

// ---- What the executor gives a running thread (executor.cc).
const uint3& ThreadIdx();
const uint3& BlockIdx();
const dim3& BlockDim();
const dim3& GridDim();

void SyncThreads(std::source_location where);
void SyncWarp(unsigned mask, std::source_location where);
// A warp collective: this lane gives `value`; once every lane of `mask` has
// given its own, returns the values of all 32 lanes (those outside the mask
// undefined). Faults when this lane is not in the mask or a mask lane never comes.
const uint64_t* WarpExchange(unsigned mask, uint64_t value, std::source_location where);
// Ends the launch with `message` (and where the thread is) as its fault.
[[noreturn]] void Fault(const std::string& message, std::source_location where);
int LaneId();

// The fault that ended the last failed launch in this process ("" if none).
std::string LastFault();
// The seed the next launches' orders are drawn from (blocks, threads and
// streams); each launch then draws its own from it.
void SetSeed(uint64_t seed);
// Drops every stream's pending work and clears the errors, a fault's sticky
// one included (cudaDeviceReset's part that tests need); memory stays.
void ResetDevice();

template <typename T>
uint64_t ToBits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T>
T FromBits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

// The lane of this lane's `width`-wide group that `src` names (CUDA's rule:
// lanes wrap inside their group), or a fault outside the mask.
int ShuffleSource(unsigned mask, int src, int width, std::source_location where);

// The xor, down and up shuffles: lane `src`'s value, or this lane's own `v`
// where `src` falls outside this lane's `width`-wide group (CUDA's rule).
template <typename T>
T ShuffleInGroup(unsigned mask, T v, int src, int width, std::source_location where) {
  const int group = LaneId() / width * width;
  const uint64_t* all = WarpExchange(mask, ToBits(v), where);
  if (src < group || src >= group + width) return v;
  return FromBits<T>(all[ShuffleSource(mask, src, warpSize, where)]);
}

// ---- Shared memory: DUET_SHARED(T, name, n) declares n elements of T per
// block; every access is checked for bounds and races.
struct SharedShadow {
  uint64_t epoch = 0;   // The block's barrier interval it was last touched in.
  int32_t writer = -1;  // The thread that last wrote it in that interval, or -1,
  int32_t readers[2] = {-1, -1};  // and two threads that read it (-1: none).
  // Each one's count of warp collectives at the time (two lanes of a warp
  // are ordered by a collective between them).
  uint64_t writer_warp = 0;
  uint64_t reader_warp[2] = {0, 0};
};
void SharedAccess(SharedShadow& shadow, bool write, const char* name, int64_t index, std::source_location where);
void SharedBounds(const char* name, int64_t index, int64_t size, std::source_location where);

template <typename T, int64_t N>
class Shared {
 public:
  Shared(const char* name, std::source_location declared) : name_(name), declared_(declared) {}

  class Ref {
   public:
    Ref(Shared& s, int64_t i) : s_(s), i_(i) {}
    operator T() const {
      SharedAccess(s_.shadow_[i_], false, s_.name_, i_, s_.declared_);
      return s_.data_[i_];
    }
    Ref& operator=(T v) {
      SharedAccess(s_.shadow_[i_], true, s_.name_, i_, s_.declared_);
      s_.data_[i_] = v;
      return *this;
    }
    Ref& operator=(const Ref& other) { return *this = static_cast<T>(other); }
    Ref& operator+=(T v) { return *this = static_cast<T>(*this) + v; }
    Ref& operator-=(T v) { return *this = static_cast<T>(*this) - v; }
    Ref& operator*=(T v) { return *this = static_cast<T>(*this) * v; }

   private:
    Shared& s_;
    int64_t i_;
  };

  Ref operator[](int64_t i) {
    SharedBounds(name_, i, N, declared_);
    return Ref(*this, i);
  }

 private:
  const char* name_;
  std::source_location declared_;
  T data_[N] = {};
  SharedShadow shadow_[N];
};

// A launch (DUET_LAUNCH): validates the configuration (cudaGetLastError
// reports a bad one), then queues the kernel on `stream` with its arguments
// copied.
void Enqueue(const char* kernel, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
             std::function<void()> body);

// A library call's work (an emulated cuBLAS GEMM): `work` runs on the host
// as `stream`'s next item, with device memory open.
cudaError_t EnqueueWork(const char* what, cudaStream_t stream, std::function<void()> work);

template <typename Kernel>
struct Launcher {
  const char* name;
  dim3 grid, block;
  size_t shared_bytes;
  cudaStream_t stream;
  Kernel* kernel;
  template <typename... Args>
  void operator()(Args... args) const {
    Kernel* k = kernel;
    Enqueue(name, grid, block, shared_bytes, stream, [k, args...] { k(args...); });
  }
};

}  // namespace duet::simt

#define threadIdx (::duet::simt::ThreadIdx())
#define blockIdx (::duet::simt::BlockIdx())
#define blockDim (::duet::simt::BlockDim())
#define gridDim (::duet::simt::GridDim())
#define __syncthreads() ::duet::simt::SyncThreads(std::source_location::current())
inline void __syncwarp(unsigned mask = 0xffffffffu,
                       std::source_location where = std::source_location::current()) {
  ::duet::simt::SyncWarp(mask, where);
}

// DUET_SHARED(float, partial, 32); ... partial[i] = v; per block, checked
// (a fault names the array, its declaration and the threads).
#define DUET_SHARED(T, name, n) \
  static thread_local ::duet::simt::Shared<T, (n)> name(#name, std::source_location::current())

// DUET_LAUNCH(kernel, grid, block, shared_bytes, stream)(args...).
#define DUET_LAUNCH(kernel, grid, block, shared_bytes, stream) \
  ::duet::simt::Launcher<std::remove_pointer_t<decltype(&kernel)>>{#kernel, (grid), (block), (shared_bytes), (stream), &kernel}

template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = warpSize,
              std::source_location where = std::source_location::current()) {
  const uint64_t* all = ::duet::simt::WarpExchange(mask, ::duet::simt::ToBits(v), where);
  return ::duet::simt::FromBits<T>(all[::duet::simt::ShuffleSource(mask, src, width, where)]);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize,
                  std::source_location where = std::source_location::current()) {
  return ::duet::simt::ShuffleInGroup(mask, v, ::duet::simt::LaneId() ^ lane_mask, width, where);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize,
                   std::source_location where = std::source_location::current()) {
  return ::duet::simt::ShuffleInGroup(mask, v, ::duet::simt::LaneId() + static_cast<int>(delta), width, where);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize,
                 std::source_location where = std::source_location::current()) {
  return ::duet::simt::ShuffleInGroup(mask, v, ::duet::simt::LaneId() - static_cast<int>(delta), width, where);
}
unsigned __ballot_sync(unsigned mask, int predicate, std::source_location where = std::source_location::current());
int __any_sync(unsigned mask, int predicate, std::source_location where = std::source_location::current());
int __all_sync(unsigned mask, int predicate, std::source_location where = std::source_location::current());

// Atomics: the threads of a launch run one at a time, so a plain
// read-modify-write is atomic here.
template <typename T>
T atomicAdd(T* address, T v) {
  const T old = *address;
  *address = old + v;
  return old;
}
template <typename T>
T atomicMax(T* address, T v) {
  const T old = *address;
  if (v > old) *address = v;
  return old;
}
template <typename T>
T atomicMin(T* address, T v) {
  const T old = *address;
  if (v < old) *address = v;
  return old;
}
template <typename T>
T atomicExch(T* address, T v) {
  const T old = *address;
  *address = v;
  return old;
}
template <typename T>
T atomicCAS(T* address, T compare, T v) {
  const T old = *address;
  if (old == compare) *address = v;
  return old;
}

#endif  // DUET_KERNELS_SIMT_SIMT_H_
