// The emulated CUDA runtime behind kernels/simt/simt.h: guarded device
// memory, deferred streams run in a seeded interleaving at synchronisation
// points, events, and graph capture and replay.
#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/guarded_memory.h"
#include "kernels/simt/executor.h"

struct SimtEvent {
  uint64_t recorded = 0;   // Records enqueued so far.
  uint64_t completed = 0;  // Records run so far.
};

namespace duet::simt {
namespace {

struct Item {
  enum Kind { kWork, kRecord, kWait } kind = kWork;
  std::string what;                  // For errors: "kernel RmsNormKernel", "copy".
  std::function<std::string()> run;  // kWork: its fault, "" when clean.
  SimtEvent* event = nullptr;        // kRecord, kWait
  uint64_t serial = 0;               // kWait: the record it waits for.
  // An implicit event's owner, shared by its record and its wait, so it
  // goes when both have run (a user's event is the runtime's).
  std::shared_ptr<SimtEvent> owned;
};

}  // namespace
}  // namespace duet::simt

struct SimtGraph {
  std::vector<duet::simt::Item> items;
};

struct SimtStream {
  std::deque<duet::simt::Item> pending;
  SimtGraph* capture = nullptr;  // Set while capturing.
  bool capture_invalidated = false;
};

namespace duet::simt {
namespace {

struct Runtime {
  absl::Mutex mu;
  SimtStream default_stream;
  std::vector<std::unique_ptr<SimtStream>> streams;
  std::vector<std::unique_ptr<SimtEvent>> events;
  std::vector<std::unique_ptr<SimtGraph>> graphs;
  std::map<uintptr_t, kernels::BufferPtr> memory;  // by base address
  cudaError_t last = cudaSuccess;    // cudaGetLastError's.
  cudaError_t sticky = cudaSuccess;  // A kernel's fault: every later call returns it.
  uint64_t drains = 0;
};

Runtime& R() {
  static Runtime* r = new Runtime();
  return *r;
}

SimtStream* StreamOf(Runtime& r, cudaStream_t s) { return s == nullptr ? &r.default_stream : s; }

cudaError_t Fail(Runtime& r, cudaError_t e) {
  r.last = e;
  return e;
}

bool Capturing(const Runtime& r) {
  if (r.default_stream.capture != nullptr) return true;
  for (const auto& s : r.streams) {
    if (s->capture != nullptr) return true;
  }
  return false;
}

// A synchronous call while a stream captures: refused, and the capture is void.
cudaError_t RefuseWhileCapturing(Runtime& r) {
  if (r.default_stream.capture != nullptr) r.default_stream.capture_invalidated = true;
  for (const auto& s : r.streams) {
    if (s->capture != nullptr) s->capture_invalidated = true;
  }
  return Fail(r, cudaErrorStreamCaptureUnsupported);
}

bool Ready(const Item& item) { return item.kind != Item::kWait || item.event->completed >= item.serial; }

// Runs pending work of every stream, one item at a time from a stream drawn
// from the seed among those whose next item can run, until `done()`.
cudaError_t Drain(Runtime& r, const std::function<bool()>& done) {
  // Device memory opens once for the whole drain, which runs only device
  // work, rather than once per item: each opening re-protects every guarded
  // page (the resident weights too), which per op cost more than the ops.
  kernels::GuardWindow open;
  std::mt19937_64 rng(Seed() * 0x9e3779b97f4a7c15ull + ++r.drains);
  std::vector<SimtStream*> all = {&r.default_stream};
  for (const auto& s : r.streams) all.push_back(s.get());
  while (r.sticky == cudaSuccess && !done()) {
    std::vector<SimtStream*> ready;
    for (SimtStream* s : all) {
      if (!s->pending.empty() && Ready(s->pending.front())) ready.push_back(s);
    }
    if (ready.empty()) {
      SetLastFault("a stream waits for an event whose record can never run (recorded later on the same stream?)");
      r.sticky = cudaErrorLaunchFailure;
      break;
    }
    SimtStream* s = ready[std::uniform_int_distribution<size_t>(0, ready.size() - 1)(rng)];
    Item item = std::move(s->pending.front());
    s->pending.pop_front();
    if (item.kind == Item::kRecord) {
      item.event->completed = std::max(item.event->completed, item.serial);
    } else if (item.kind == Item::kWork) {
      const std::string fault = item.run();
      if (!fault.empty()) {
        SetLastFault(fault);
        r.sticky = cudaErrorLaunchFailure;
      }
    }
  }
  if (r.sticky != cudaSuccess) {
    for (SimtStream* s : all) s->pending.clear();
    return Fail(r, r.sticky);
  }
  return cudaSuccess;
}

cudaError_t DrainAll(Runtime& r) {
  return Drain(r, [&] {
    if (!r.default_stream.pending.empty()) return false;
    return std::all_of(r.streams.begin(), r.streams.end(), [](const auto& s) { return s->pending.empty(); });
  });
}

// `to` waits for what `from` holds now (an event of the runtime's own).
void Order(SimtStream& from, SimtStream& to) {
  auto e = std::make_shared<SimtEvent>();
  from.pending.push_back(
      Item{.kind = Item::kRecord, .what = "implicit record", .event = e.get(), .serial = ++e->recorded, .owned = e});
  to.pending.push_back(
      Item{.kind = Item::kWait, .what = "implicit wait", .event = e.get(), .serial = e->recorded, .owned = e});
}

void Push(Runtime& r, cudaStream_t stream, Item item) {
  SimtStream* s = StreamOf(r, stream);
  if (s->capture != nullptr) {
    s->capture->items.push_back(std::move(item));
    return;
  }
  // The legacy default stream (nullptr): its work waits for every other
  // stream's earlier work, and theirs for its earlier work (streams made by
  // cudaStreamCreate are blocking ones).
  if (s == &r.default_stream) {
    for (const auto& o : r.streams) {
      if (!o->pending.empty()) Order(*o, *s);
    }
  } else if (!r.default_stream.pending.empty()) {
    Order(r.default_stream, *s);
  }
  s->pending.push_back(std::move(item));
}

// The allocation holding [p, p + bytes), or null.
kernels::Buffer* Allocation(Runtime& r, const void* p, size_t bytes) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  auto it = r.memory.upper_bound(at);
  if (it == r.memory.begin()) return nullptr;
  --it;
  kernels::Buffer* b = it->second.get();
  return at + bytes <= it->first + static_cast<uintptr_t>(b->bytes()) ? b : nullptr;
}

cudaError_t EnqueueCopy(Runtime& r, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                        cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  const bool dst_device = Allocation(r, dst, bytes) != nullptr, src_device = Allocation(r, src, bytes) != nullptr;
  const bool ok = kind == cudaMemcpyHostToDevice   ? dst_device && !src_device
                  : kind == cudaMemcpyDeviceToHost ? src_device && !dst_device
                  : kind == cudaMemcpyDeviceToDevice ? dst_device && src_device
                  : kind == cudaMemcpyDefault        ? dst_device || src_device
                                                     : false;
  if (!ok) return Fail(r, cudaErrorInvalidValue);
  // Host memory here is pageable (there is no pinned memory to emulate),
  // and CUDA cannot record a copy to or from pageable memory in a graph.
  if (StreamOf(r, stream)->capture != nullptr && !(src_device && dst_device)) return RefuseWhileCapturing(r);
  Item item{.what = "copy"};
  if (!src_device) {
    // A pageable host source is read when the call is made, as CUDA stages it.
    auto staged = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(src),
                                                        static_cast<const uint8_t*>(src) + bytes);
    item.run = [dst, staged] {
      kernels::GuardWindow open;
      std::memcpy(dst, staged->data(), staged->size());
      return std::string();
    };
  } else {
    item.run = [dst, src, bytes] {
      kernels::GuardWindow open;
      std::memcpy(dst, src, bytes);
      return std::string();
    };
  }
  Push(r, stream, std::move(item));
  return cudaSuccess;
}

}  // namespace

void Enqueue(const char* kernel, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
             std::function<void()> body) {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 || threads > 1024 || block.z > 64 ||
      grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu) {
    Fail(r, cudaErrorInvalidConfiguration);
    return;
  }
  if (shared_bytes > 0) {  // Dynamic shared memory is not emulated.
    SetLastFault(absl::StrCat(kernel, ": dynamic shared memory (", shared_bytes, " bytes) is not emulated"));
    Fail(r, cudaErrorInvalidValue);
    return;
  }
  auto run = [kernel, grid, block, body = std::move(body)] {
    std::vector<uint3> order;
    for (unsigned z = 0; z < grid.z; ++z) {
      for (unsigned y = 0; y < grid.y; ++y) {
        for (unsigned x = 0; x < grid.x; ++x) order.push_back({x, y, z});
      }
    }
    std::mt19937_64 rng(Seed() ^ std::hash<std::string>()(kernel));
    std::shuffle(order.begin(), order.end(), rng);
    kernels::GuardWindow open;  // Device memory is the kernel's while it runs.
    for (const uint3& idx : order) {
      std::string fault = RunBlock(kernel, grid, block, idx, rng(), body);
      if (!fault.empty()) return fault;
    }
    return std::string();
  };
  Push(r, stream, Item{.what = absl::StrCat("kernel ", kernel), .run = std::move(run)});
}

cudaError_t EnqueueWork(const char* what, cudaStream_t stream, std::function<void()> work) {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  if (r.sticky != cudaSuccess) return r.sticky;
  Push(r, stream, Item{.what = what, .run = [work = std::move(work)] {
                         kernels::GuardWindow open;
                         work();
                         return std::string();
                       }});
  return cudaSuccess;
}

void ResetDevice() {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  r.default_stream = SimtStream();
  for (auto& s : r.streams) *s = SimtStream();
  r.last = r.sticky = cudaSuccess;
  SetLastFault("");
}

}  // namespace duet::simt

using duet::simt::R;
using duet::simt::Runtime;

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return cudaErrorInvalidValue;
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  if (ptr == nullptr) return duet::simt::Fail(r, cudaErrorInvalidValue);
  if (duet::simt::Capturing(r)) return duet::simt::RefuseWhileCapturing(r);
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  absl::StatusOr<duet::kernels::BufferPtr> b =
      duet::kernels::GuardedMemoryType().Allocate(static_cast<int64_t>(bytes), "device memory");
  if (!b.ok()) return duet::simt::Fail(r, cudaErrorMemoryAllocation);
  *ptr = (*b)->base();
  r.memory[reinterpret_cast<uintptr_t>(*ptr)] = *std::move(b);
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  if (ptr == nullptr) return cudaSuccess;
  if (duet::simt::Capturing(r)) return duet::simt::RefuseWhileCapturing(r);
  if (cudaError_t e = duet::simt::DrainAll(r); e != cudaSuccess) return e;  // cudaFree synchronises.
  auto it = r.memory.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == r.memory.end()) return duet::simt::Fail(r, cudaErrorInvalidDevicePointer);
  r.memory.erase(it);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  if (r.sticky != cudaSuccess) return r.sticky;
  return duet::simt::EnqueueCopy(r, dst, src, bytes, kind, stream);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  if (r.sticky != cudaSuccess) return r.sticky;
  if (duet::simt::Capturing(r)) return duet::simt::RefuseWhileCapturing(r);
  if (cudaError_t e = duet::simt::EnqueueCopy(r, dst, src, bytes, kind, nullptr); e != cudaSuccess) return e;
  return duet::simt::DrainAll(r);  // The legacy default stream waits for every stream.
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  if (r.sticky != cudaSuccess) return r.sticky;
  if (bytes == 0) return cudaSuccess;
  if (duet::simt::Allocation(r, dst, bytes) == nullptr) return duet::simt::Fail(r, cudaErrorInvalidValue);
  duet::simt::Push(r, stream, duet::simt::Item{.what = "memset", .run = [dst, value, bytes] {
                                                 duet::kernels::GuardWindow open;
                                                 std::memset(dst, value, bytes);
                                                 return std::string();
                                               }});
  return cudaSuccess;
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  if (cudaError_t e = cudaMemsetAsync(dst, value, bytes, nullptr); e != cudaSuccess) return e;
  return cudaDeviceSynchronize();
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  if (stream == nullptr) return duet::simt::Fail(r, cudaErrorInvalidValue);
  r.streams.push_back(std::make_unique<SimtStream>());
  *stream = r.streams.back().get();
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  auto it = std::find_if(r.streams.begin(), r.streams.end(), [&](const auto& s) { return s.get() == stream; });
  if (it == r.streams.end()) return duet::simt::Fail(r, cudaErrorInvalidResourceHandle);
  // Its pending work still runs, as CUDA's does after a destroy.
  if (cudaError_t e = duet::simt::Drain(r, [&] { return stream->pending.empty(); }); e != cudaSuccess) return e;
  r.streams.erase(it);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  SimtStream* s = duet::simt::StreamOf(r, stream);
  if (s->capture != nullptr) return duet::simt::RefuseWhileCapturing(r);
  return duet::simt::Drain(r, [s] { return s->pending.empty(); });
}

cudaError_t cudaDeviceSynchronize() {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  if (duet::simt::Capturing(r)) return duet::simt::RefuseWhileCapturing(r);
  return duet::simt::DrainAll(r);
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  if (event == nullptr) return duet::simt::Fail(r, cudaErrorInvalidValue);
  r.events.push_back(std::make_unique<SimtEvent>());
  *event = r.events.back().get();
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  // Kept until the process ends: queued waits may still name it.
  return event == nullptr ? duet::simt::Fail(r, cudaErrorInvalidResourceHandle) : cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  if (event == nullptr) return duet::simt::Fail(r, cudaErrorInvalidResourceHandle);
  if (duet::simt::StreamOf(r, stream)->capture != nullptr) {
    return duet::simt::RefuseWhileCapturing(r);  // Cross-stream capture is not emulated.
  }
  duet::simt::Push(r, stream,
                   duet::simt::Item{.kind = duet::simt::Item::kRecord, .what = "event record", .event = event,
                                    .serial = ++event->recorded});
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  if (event == nullptr) return duet::simt::Fail(r, cudaErrorInvalidResourceHandle);
  if (duet::simt::Capturing(r)) return duet::simt::RefuseWhileCapturing(r);
  const uint64_t want = event->recorded;
  return duet::simt::Drain(r, [event, want] { return event->completed >= want; });
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  if (event == nullptr) return duet::simt::Fail(r, cudaErrorInvalidResourceHandle);
  if (duet::simt::StreamOf(r, stream)->capture != nullptr) return duet::simt::RefuseWhileCapturing(r);
  duet::simt::Push(r, stream,
                   duet::simt::Item{.kind = duet::simt::Item::kWait, .what = "event wait", .event = event,
                                    .serial = event->recorded});
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  SimtStream* s = duet::simt::StreamOf(r, stream);
  if (stream == nullptr || s->capture != nullptr) return duet::simt::Fail(r, cudaErrorInvalidValue);
  r.graphs.push_back(std::make_unique<SimtGraph>());
  s->capture = r.graphs.back().get();
  s->capture_invalidated = false;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  SimtStream* s = duet::simt::StreamOf(r, stream);
  if (s->capture == nullptr || graph == nullptr) return duet::simt::Fail(r, cudaErrorStreamCaptureUnmatched);
  *graph = s->capture;
  s->capture = nullptr;
  if (s->capture_invalidated) {
    *graph = nullptr;
    return duet::simt::Fail(r, cudaErrorStreamCaptureInvalidated);
  }
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  if (exec == nullptr || graph == nullptr) return duet::simt::Fail(r, cudaErrorInvalidValue);
  r.graphs.push_back(std::make_unique<SimtGraph>(*graph));
  *exec = r.graphs.back().get();
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  if (exec == nullptr) return duet::simt::Fail(r, cudaErrorInvalidValue);
  if (r.sticky != cudaSuccess) return r.sticky;
  for (const duet::simt::Item& item : exec->items) duet::simt::Push(r, stream, item);
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) { return graph == nullptr ? cudaErrorInvalidValue : cudaSuccess; }
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) { return exec == nullptr ? cudaErrorInvalidValue : cudaSuccess; }

cudaError_t cudaGetLastError() {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  const cudaError_t e = r.last;
  r.last = r.sticky;
  return e;
}

cudaError_t cudaPeekAtLastError() {
  Runtime& r = R();
  absl::MutexLock lock(&r.mu);
  return r.last;
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure (see duet::simt::LastFault())";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched: return "the capture was not initiated in this stream";
  }
  return "unknown error";
}
