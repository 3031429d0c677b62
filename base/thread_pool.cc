#include "base/thread_pool.h"

#include <sched.h>

#include <immintrin.h>

#include <algorithm>
#include <chrono>

namespace duet {
namespace {
thread_local bool tls_in_pool = false;

// Spins until done() or about `budget_us` microseconds pass; true if done.
template <typename Done>
bool SpinUntil(Done done, int budget_us) {
  auto start = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    if (done()) return true;
    _mm_pause();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() - start > std::chrono::microseconds(budget_us)) {
      return done();
    }
  }
}

constexpr int kSpinMicros = 100;
}  // namespace

int AvailableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks() {
  while (true) {
    int64_t begin = next_.fetch_add(chunk_, std::memory_order_relaxed);
    if (begin >= n_) break;
    (*fn_)(begin, std::min(n_, begin + chunk_));
  }
}

void ThreadPool::WorkerLoop(int /*index*/) {
  tls_in_pool = true;
  uint64_t seen = 0;
  while (true) {
    auto has_work = [&] { return generation_.load(std::memory_order_acquire) != seen; };
    if (!SpinUntil(has_work, kSpinMicros)) {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || has_work(); });
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    seen = generation_.load(std::memory_order_acquire);
    RunChunks();
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                             int64_t min_grain) {
  if (n <= 0) return;
  min_grain = std::max<int64_t>(1, min_grain);
  if (num_threads_ == 1 || tls_in_pool || n <= min_grain) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  // Several chunks per thread balance uneven work; never below min_grain.
  int64_t chunk = std::max(min_grain, (n + num_threads_ * 4 - 1) / (num_threads_ * 4));
  fn_ = &fn;
  n_ = n;
  chunk_ = chunk;
  next_.store(0, std::memory_order_relaxed);
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  {
    // Taking the lock orders this wake-up after any worker's predicate check.
    std::lock_guard<std::mutex> lock(mu_);
  }
  work_cv_.notify_all();
  tls_in_pool = true;
  RunChunks();
  tls_in_pool = false;
  auto all_done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!SpinUntil(all_done, kSpinMicros)) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, all_done);
  }
  fn_ = nullptr;
}

}  // namespace duet
