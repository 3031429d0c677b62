#include "kernels/communicator.h"

#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/logging.h"

namespace duet::kernels {
namespace {

// What the ranks of one group share.
struct Group {
  explicit Group(int n) : size(n), buffers(n), lengths(n) {}
  const int size;
  absl::Mutex mu;
  // The barrier: ranks arrived at the current one, and how many have
  // completed (bumped under mu, so blocked ranks' Await sees it).
  std::atomic<int> arrived{0};
  std::atomic<int64_t> generation{0};
  // Each rank's all-reduce buffer: written by its rank before the first
  // barrier of a call, read by every rank between its barriers.
  std::vector<float*> buffers;
  std::vector<int64_t> lengths;
  // (from, to) -> messages not yet received, oldest first.
  std::map<std::pair<int, int>, std::deque<std::vector<float>>> mail ABSL_GUARDED_BY(mu);
};

class ThreadCommunicator : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<Group> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size; }

  void AllReduceSum(float* data, int64_t n) override {
    Group& g = *group_;
    if (g.size == 1) return;
    g.buffers[rank_] = data;
    g.lengths[rank_] = n;
    Barrier();
    for (int r = 0; r < g.size; ++r) {
      CHECK_EQ(g.lengths[r], n) << "all-reduce of " << n << " floats on rank " << rank_ << ", " << g.lengths[r]
                                << " on rank " << r;
    }
    // This rank sums its slice of every buffer, then writes the slice back
    // into each of them once every rank has read what it needs.
    const int64_t lo = n * rank_ / g.size, hi = n * (rank_ + 1) / g.size;
    sum_.resize(static_cast<size_t>(hi - lo));
    for (int64_t i = lo; i < hi; ++i) {
      float s = g.buffers[0][i];
      for (int r = 1; r < g.size; ++r) s += g.buffers[r][i];
      sum_[i - lo] = s;
    }
    Barrier();
    for (int r = 0; r < g.size; ++r) std::memcpy(g.buffers[r] + lo, sum_.data(), sum_.size() * sizeof(float));
    Barrier();
  }

  void Send(int peer, const float* data, int64_t n) override {
    CHECK(peer >= 0 && peer < group_->size && peer != rank_) << "send to rank " << peer;
    absl::MutexLock lock(&group_->mu);
    group_->mail[{rank_, peer}].emplace_back(data, data + n);
  }

  void Recv(int peer, float* data, int64_t n) override {
    CHECK(peer >= 0 && peer < group_->size && peer != rank_) << "receive from rank " << peer;
    Group& g = *group_;
    absl::MutexLock lock(&g.mu);
    std::deque<std::vector<float>>& box = g.mail[{peer, rank_}];
    g.mu.Await(absl::Condition(+[](std::deque<std::vector<float>>* b) { return !b->empty(); }, &box));
    CHECK_EQ(static_cast<int64_t>(box.front().size()), n)
        << "rank " << rank_ << " receives " << n << " floats; rank " << peer << " sent " << box.front().size();
    std::memcpy(data, box.front().data(), static_cast<size_t>(n) * sizeof(float));
    box.pop_front();
  }

 private:
  // Returns once every rank of the group has called it. A rank spins for a
  // few microseconds first, then blocks: a decode step makes dozens of
  // all-reduces of three barriers each, and a sleep and wake-up per barrier
  // cost more than the ranks' usual skew.
  void Barrier() {
    Group& g = *group_;
    // Read before arriving: the barrier cannot complete without this rank.
    const int64_t generation = g.generation.load(std::memory_order_acquire);
    if (g.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == g.size) {
      g.arrived.store(0, std::memory_order_relaxed);  // Before the release below: no rank arrives again until then.
      absl::MutexLock lock(&g.mu);
      g.generation.store(generation + 1, std::memory_order_release);
      return;
    }
    auto done = [&] { return g.generation.load(std::memory_order_acquire) != generation; };
    for (int i = 0; i < kSpins; ++i) {
      if (done()) return;
      Pause();
    }
    struct Wait {
      const Group* g;
      int64_t generation;
    } wait{&g, generation};
    absl::MutexLock lock(&g.mu);
    g.mu.Await(absl::Condition(
        +[](Wait* w) { return w->g->generation.load(std::memory_order_acquire) != w->generation; }, &wait));
  }

  static constexpr int kSpins = 1024;  // About 10-50 us of pause instructions.
  static void Pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }

  const std::shared_ptr<Group> group_;
  const int rank_;
  std::vector<float> sum_;  // This rank's slice of the all-reduce.
};

}  // namespace

std::vector<CommunicatorPtr> NewThreadCommunicators(int n) {
  CHECK_GE(n, 1);
  auto group = std::make_shared<Group>(n);
  std::vector<CommunicatorPtr> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<ThreadCommunicator>(group, r));
  return out;
}

}  // namespace duet::kernels
