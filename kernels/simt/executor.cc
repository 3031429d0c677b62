// The SIMT executor's blocks: fibers, their scheduling, barriers, warp
// collectives, shared-memory checks and faults (kernels/simt/simt.h).
#include "kernels/simt/executor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <boost/context/fiber.hpp>
#include <boost/context/stack_context.hpp>
#include <cstdio>
#include <new>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/logging.h"
#include "kernels/dtype.h"

namespace duet::simt {
namespace {

namespace ctx = boost::context;

// A fault inside a thread: unwinds its fiber to the top, where the block sees it.
struct KernelFault {};

// Guard-paged fiber stacks, kept for the next block (one launch can run
// thousands of blocks of up to 1024 threads).
class StackPool {
 public:
  static constexpr size_t kStackBytes = 64 * 1024;

  ctx::stack_context Take() {
    if (free_.empty()) {
      const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
      void* at = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (at == MAP_FAILED) throw std::bad_alloc();
      CHECK_EQ(mprotect(at, page, PROT_NONE), 0);  // The guard below the stack.
      ctx::stack_context s;
      s.size = kStackBytes;
      s.sp = static_cast<char*>(at) + page + kStackBytes;
      return s;
    }
    ctx::stack_context s = free_.back();
    free_.pop_back();
    return s;
  }
  void Give(ctx::stack_context s) { free_.push_back(s); }

 private:
  std::vector<ctx::stack_context> free_;
};

thread_local StackPool stacks;

// The StackAllocator Boost.Context asks for a fiber's stack.
struct PooledStack {
  ctx::stack_context allocate() { return stacks.Take(); }
  void deallocate(ctx::stack_context& s) noexcept { stacks.Give(s); }
};

enum class State { kRunnable, kBarrier, kWarp, kDone };

struct Thread {
  uint3 idx;
  int linear = 0, warp = 0, lane = 0;
  State state = State::kRunnable;
  ctx::fiber fiber;  // Resumed by the block.
  ctx::fiber back;   // The block's scheduler, while this thread runs.
  std::source_location where;  // Its sync point.
  unsigned mask = 0;           // Its warp collective's.
  uint64_t value = 0;
  uint64_t got[32] = {};       // The warp's values when its collective completed.
  uint64_t warp_syncs = 0;     // Warp collectives it has completed.
};

std::string Site(std::source_location w) { return absl::StrCat(w.file_name(), ":", w.line()); }
std::string Tid(const uint3& t) { return absl::StrCat("(", t.x, ",", t.y, ",", t.z, ")"); }

struct Block {
  const char* kernel = "";
  uint3 idx;
  dim3 dim, grid;
  std::vector<Thread> threads;
  Thread* current = nullptr;
  uint64_t epoch = 0;  // Barrier intervals, unique per block of the process.
  std::mt19937_64 rng;
  std::string fault;

  std::string Describe() const { return absl::StrCat(kernel, " block ", Tid(idx)); }
};

thread_local Block* block = nullptr;

uint64_t NextEpochBase() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1) << 32;
}

absl::Mutex fault_mu;
std::string& LastFaultText() {
  static std::string* s = new std::string();
  return *s;
}
std::atomic<uint64_t> seed{0x5eed};

Thread& Me() {
  CHECK(block != nullptr && block->current != nullptr) << "a SIMT device function called outside a kernel";
  return *block->current;
}

void Yield() {
  Thread& t = Me();
  t.back = std::move(t.back).resume();
}

void SetFault(Block& b, const std::string& message) {
  if (b.fault.empty()) b.fault = message;
}

// The barrier and warp collectives that can complete now; false when none.
bool Release(Block& b) {
  bool released = false;
  const int warps = static_cast<int>((b.threads.size() + 31) / 32);
  for (int w = 0; w < warps; ++w) {
    const size_t first = static_cast<size_t>(w) * 32, end = std::min(b.threads.size(), first + 32);
    Thread* waiting = nullptr;
    for (size_t i = first; i < end; ++i) {
      if (b.threads[i].state == State::kWarp) {
        waiting = &b.threads[i];
        break;
      }
    }
    if (waiting == nullptr) continue;
    const unsigned mask = waiting->mask;
    bool complete = true;
    for (size_t i = first; i < end; ++i) {
      const Thread& t = b.threads[i];
      const bool in_mask = (mask >> t.lane) & 1u;
      if (t.state == State::kWarp && t.mask != mask) {
        SetFault(b, absl::StrCat(b.Describe(), ": warp ", w, "'s lanes ", waiting->lane, " and ", t.lane,
                                 " meet at warp operations of different masks (0x", absl::Hex(mask), " at ",
                                 Site(waiting->where), ", 0x", absl::Hex(t.mask), " at ", Site(t.where), ")"));
        return false;
      }
      if (in_mask && t.state != State::kWarp) complete = false;
    }
    for (int lane = static_cast<int>(end - first); lane < 32; ++lane) {
      if ((mask >> lane) & 1u) {
        SetFault(b, absl::StrCat(b.Describe(), ": the warp operation at ", Site(waiting->where), " names lane ", lane,
                                 " in its mask 0x", absl::Hex(mask), ", past the block's last thread"));
        return false;
      }
    }
    if (!complete) continue;
    uint64_t values[32] = {};
    for (size_t i = first; i < end; ++i) values[b.threads[i].lane] = b.threads[i].value;
    for (size_t i = first; i < end; ++i) {
      Thread& t = b.threads[i];
      if (t.state != State::kWarp) continue;
      std::copy(values, values + 32, t.got);
      ++t.warp_syncs;
      t.state = State::kRunnable;
    }
    released = true;
  }
  if (released) return true;
  // The barrier: every thread waits at one, at one place.
  const Thread* first_waiting = nullptr;
  const Thread* exited = nullptr;
  for (const Thread& t : b.threads) {
    if (t.state == State::kDone) {
      exited = &t;
      continue;
    }
    if (t.state != State::kBarrier) return false;
    if (first_waiting == nullptr) {
      first_waiting = &t;
    } else if (t.where.line() != first_waiting->where.line() ||
               std::string_view(t.where.file_name()) != first_waiting->where.file_name()) {
      SetFault(b, absl::StrCat(b.Describe(), ": divergent barrier: thread ", Tid(first_waiting->idx), " waits at ",
                               Site(first_waiting->where), ", thread ", Tid(t.idx), " at ", Site(t.where)));
      return false;
    }
  }
  if (first_waiting == nullptr) return false;
  if (exited != nullptr) {
    SetFault(b, absl::StrCat(b.Describe(), ": divergent barrier: thread ", Tid(first_waiting->idx), " waits at ",
                             Site(first_waiting->where), ", thread ", Tid(exited->idx),
                             " has exited without reaching it"));
    return false;
  }
  ++b.epoch;
  for (Thread& t : b.threads) {
    if (t.state == State::kBarrier) t.state = State::kRunnable;
  }
  return true;
}

// Why nothing can run: the first thread's wait that can never end.
std::string Stuck(const Block& b) {
  for (const Thread& t : b.threads) {
    if (t.state != State::kWarp) continue;
    for (const Thread& o : b.threads) {
      if (o.warp != t.warp || !((t.mask >> o.lane) & 1u) || o.state == State::kWarp) continue;
      return absl::StrCat(b.Describe(), ": lane ", t.lane, " of warp ", t.warp, " waits at the warp operation at ",
                          Site(t.where), " (mask 0x", absl::Hex(t.mask), ") for lane ", o.lane, ", which ",
                          o.state == State::kDone ? "has exited" : absl::StrCat("waits at ", Site(o.where)),
                          ": a lane of the mask never comes");
    }
  }
  for (const Thread& t : b.threads) {
    if (t.state == State::kBarrier) {
      for (const Thread& o : b.threads) {
        if (o.state == State::kWarp) {
          return absl::StrCat(b.Describe(), ": divergent barrier: thread ", Tid(t.idx), " waits at __syncthreads at ",
                              Site(t.where), " while thread ", Tid(o.idx), " waits at a warp operation at ",
                              Site(o.where));
        }
      }
    }
  }
  return absl::StrCat(b.Describe(), ": no thread can run");
}

}  // namespace

std::string RunBlock(const char* kernel, dim3 grid, dim3 dim, uint3 idx, uint64_t block_seed,
                     const std::function<void()>& body) {
  Block b;
  b.kernel = kernel;
  b.idx = idx;
  b.dim = dim;
  b.grid = grid;
  b.epoch = NextEpochBase();
  b.rng.seed(block_seed);
  const int n = static_cast<int>(dim.x * dim.y * dim.z);
  b.threads.resize(static_cast<size_t>(n));
  Block* const outer = block;
  block = &b;
  for (int i = 0; i < n; ++i) {
    Thread& t = b.threads[static_cast<size_t>(i)];
    t.linear = i;
    t.warp = i / 32;
    t.lane = i % 32;
    t.idx = uint3{static_cast<unsigned>(i) % dim.x, static_cast<unsigned>(i) / dim.x % dim.y,
                  static_cast<unsigned>(i) / (dim.x * dim.y)};
    t.fiber = ctx::fiber(std::allocator_arg, PooledStack(), [&t, &body](ctx::fiber&& back) {
      t.back = std::move(back);
      try {
        body();
      } catch (const KernelFault&) {
      }
      t.state = State::kDone;
      return std::move(t.back);
    });
  }
  // The runnable threads: only Release wakes a thread, so the list is
  // gathered again only after it, and a thread that stops running (done or
  // waiting) leaves it by a swap with the last; a draw stays O(1), which a
  // scan per switch made O(threads).
  std::vector<Thread*> runnable;
  bool gather = true;
  while (b.fault.empty()) {
    if (gather) {
      runnable.clear();
      for (Thread& t : b.threads) {
        if (t.state == State::kRunnable) runnable.push_back(&t);
      }
      gather = false;
    }
    if (runnable.empty()) {
      if (std::all_of(b.threads.begin(), b.threads.end(), [](const Thread& t) { return t.state == State::kDone; })) {
        break;
      }
      if (!Release(b) && b.fault.empty()) SetFault(b, Stuck(b));
      gather = true;
      continue;
    }
    const size_t pick = std::uniform_int_distribution<size_t>(0, runnable.size() - 1)(b.rng);
    Thread* t = runnable[pick];
    b.current = t;
    t->fiber = std::move(t->fiber).resume();
    b.current = nullptr;
    if (t->state != State::kRunnable) {
      runnable[pick] = runnable.back();
      runnable.pop_back();
    }
  }
  // Threads still suspended (after a fault) are unwound as their fibers go.
  for (Thread& t : b.threads) t.fiber = ctx::fiber();
  block = outer;
  return b.fault;
}

const uint3& ThreadIdx() { return Me().idx; }
const uint3& BlockIdx() {
  Me();
  return block->idx;
}
const dim3& BlockDim() {
  Me();
  return block->dim;
}
const dim3& GridDim() {
  Me();
  return block->grid;
}
int LaneId() { return Me().lane; }

void SyncThreads(std::source_location where) {
  Thread& t = Me();
  t.state = State::kBarrier;
  t.where = where;
  Yield();
}

const uint64_t* WarpExchange(unsigned mask, uint64_t value, std::source_location where) {
  Thread& t = Me();
  if (!((mask >> t.lane) & 1u)) {
    Fault(absl::StrCat("lane ", t.lane, " runs a warp operation whose mask 0x", absl::Hex(mask), " leaves it out"),
          where);
  }
  t.state = State::kWarp;
  t.mask = mask;
  t.value = value;
  t.where = where;
  Yield();
  return t.got;
}

void SyncWarp(unsigned mask, std::source_location where) { WarpExchange(mask, 0, where); }

int ShuffleSource(unsigned mask, int src, int width, std::source_location where) {
  const int lane = Me().lane;
  const int group = lane / width * width;
  const int from = group + ((src % width) + width) % width;
  if (!((mask >> from) & 1u)) {
    Fault(absl::StrCat("lane ", lane, " shuffles from lane ", from, ", which is not in the mask 0x", absl::Hex(mask)),
          where);
  }
  return from;
}

void Fault(const std::string& message, std::source_location where) {
  Thread& t = Me();
  SetFault(*block, absl::StrCat(block->Describe(), " thread ", Tid(t.idx), " at ", Site(where), ": ", message));
  throw KernelFault();
}

void SharedBounds(const char* name, int64_t index, int64_t size, std::source_location where) {
  if (index < 0 || index >= size) {
    Fault(absl::StrCat("shared ", name, "[", index, "] is out of bounds (", size, " elements, declared at ",
                       Site(where), ")"),
          where);
  }
}

void SharedAccess(SharedShadow& s, bool write, const char* name, int64_t index, std::source_location where) {
  Thread& t = Me();
  if (s.epoch != block->epoch) s = SharedShadow{.epoch = block->epoch};
  // Two accesses of one interval conflict unless they are one thread's, or
  // two lanes of one warp with a warp collective between them.
  auto ordered = [&](int32_t other, uint64_t other_warp_syncs) {
    if (other == t.linear) return true;
    const Thread& o = block->threads[static_cast<size_t>(other)];
    return o.warp == t.warp && other_warp_syncs != t.warp_syncs;
  };
  auto race = [&](int32_t other, const char* what) {
    Fault(absl::StrCat("data race on shared ", name, "[", index, "] (declared at ", Site(where), "): thread ",
                       Tid(block->threads[static_cast<size_t>(other)].idx), " ", what, " it and this thread ",
                       write ? "writes" : "reads", " it between the same barriers"),
          where);
  };
  if (s.writer >= 0 && !ordered(s.writer, s.writer_warp)) race(s.writer, "wrote");
  if (write) {
    for (int r = 0; r < 2; ++r) {
      if (s.readers[r] >= 0 && !ordered(s.readers[r], s.reader_warp[r])) race(s.readers[r], "read");
    }
    s.writer = t.linear;
    s.writer_warp = t.warp_syncs;
    return;
  }
  for (int r = 0; r < 2; ++r) {
    if (s.readers[r] == t.linear) {
      s.reader_warp[r] = t.warp_syncs;
      return;
    }
    if (s.readers[r] < 0) {
      s.readers[r] = t.linear;
      s.reader_warp[r] = t.warp_syncs;
      return;
    }
  }
  // A third reader: keep the two, which a later writer races with already.
}

std::string LastFault() {
  absl::MutexLock lock(&fault_mu);
  return LastFaultText();
}

void SetLastFault(const std::string& fault) {
  absl::MutexLock lock(&fault_mu);
  LastFaultText() = fault;
}

void SetSeed(uint64_t s) { seed.store(s); }
uint64_t Seed() { return seed.load(); }

}  // namespace duet::simt

unsigned __ballot_sync(unsigned mask, int predicate, std::source_location where) {
  const uint64_t* all = ::duet::simt::WarpExchange(mask, predicate != 0 ? 1 : 0, where);
  unsigned bits = 0;
  for (int lane = 0; lane < 32; ++lane) {
    if (((mask >> lane) & 1u) && all[lane] != 0) bits |= 1u << lane;
  }
  return bits;
}
int __any_sync(unsigned mask, int predicate, std::source_location where) {
  return __ballot_sync(mask, predicate, where) != 0;
}
int __all_sync(unsigned mask, int predicate, std::source_location where) {
  return __ballot_sync(mask, predicate, where) == mask;
}

__half __float2half(float f) { return {duet::kernels::FloatToHalf(f)}; }
float __half2float(__half h) { return duet::kernels::HalfToFloat(h.bits); }
__nv_bfloat16 __float2bfloat16(float f) { return {duet::kernels::FloatToBf16(f)}; }
float __bfloat162float(__nv_bfloat16 h) { return duet::kernels::Bf16ToFloat(h.bits); }
