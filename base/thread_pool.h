// A fixed pool of worker threads for data-parallel loops on the CPU backend.
//
//   ThreadPool pool(4);
//   pool.ParallelFor(rows, [&](int64_t begin, int64_t end) { ... });
//
// ParallelFor splits [0, n) into contiguous ranges, runs them on the pool's
// threads and the calling thread, and returns when all are done. One
// ParallelFor runs at a time per pool (calls from several threads are
// serialised); a ParallelFor nested inside another runs inline. The pool's
// size is duet's CPU thread budget: OpenBLAS is set to the same count so the
// two never oversubscribe the cores.
#ifndef DUET_BASE_THREAD_POOL_H_
#define DUET_BASE_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace duet {

class ThreadPool {
 public:
  // num_threads counts the caller: 1 means everything runs inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Runs fn(begin, end) over [0, n) in ranges of at least min_grain items.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                   int64_t min_grain = 1);

 private:
  void WorkerLoop(int index);
  void RunChunks();

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // Serialises ParallelFor callers.

  // Workers spin for a short while on generation_ before sleeping on
  // work_cv_, so back-to-back ParallelFor calls (dozens per decode step) do
  // not pay a futex wake-up each; the caller likewise spins on pending_.
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};  // Workers still running the current job.
  bool stop_ = false;            // Guarded by mu_.

  // The current job; written before generation_ is bumped.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 1;
  std::atomic<int64_t> next_{0};
};

// The number of cores this process may run on (sched_getaffinity).
int AvailableCores();

}  // namespace duet

#endif  // DUET_BASE_THREAD_POOL_H_
