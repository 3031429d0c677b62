// PrefillScheduler: the bookkeeping of a prefill worker, without the model or
// the network: the FCFS queue, which prompt chunks run in the next step under
// a token budget, each request's KV blocks, and the leases that hold finished
// requests' blocks for decode.
//
//   PrefillScheduler s(options, &pool, transport, region, clock);
//   RETURN_IF_ERROR(s.Enqueue(request, params));  // params: AcceptPrefillRequest's
//   Step step = s.Schedule();             // chunks for one Model::Forward
//   ... run it ...
//   for (uint64_t id : s.Complete(step)) { sample; s.Finish(id) or s.Lease(id); }
//   s.Release(id);                        // KvReleased: epochs bumped, blocks freed
//
// A request moves queued -> prefilling (blocks reserved for all of
// prompt + resume, chunks computed step by step) -> complete (its last chunk
// ran; the caller samples token 1) -> leased (blocks promised to a decode)
// -> gone. Every exit (Finish, Release, lease expiry, Cancel, DropUnleased,
// destruction) drops the request's SequenceKv, so every block returns to the
// pool; leased blocks come back only after the LeaseTable bumped their epochs.
//
// With a knowledge tree (options.cache), a request starts from the longest
// cached block-aligned prefix of its tokens but the last (shared blocks,
// swapped in from host first), computes only the rest, and on completion
// adds its full blocks to the tree; its cached path stays pinned until it
// ends (with a reorder window, the queue is admitted by cached/compute
// ratio within it; see SchedulerOptions). Otherwise scheduling is strictly
// first come, first served: requests being prefilled
// continue first (in admission order), then the queue head is admitted when
// its blocks can be reserved. A head that does not fit waits (blocks come back
// as decodes release leases or leases expire) and nothing behind it overtakes
// it. A prompt longer than the budget is split across steps; chunk
// boundaries need not be block-aligned.
//
// Not thread-safe: one owner (the service's engine thread) calls everything.
// The LeaseTable's end callback runs inside Release/Cancel/ExpireDue on that
// same thread.
#ifndef DUET_PREFILL_SCHEDULER_H_
#define DUET_PREFILL_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "base/serving_defaults.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/clock.h"
#include "engine/block_pool.h"
#include "kvcache/admission.h"
#include "kvcache/prefix_tree.h"
#include "kvtransfer/lease.h"
#include "kvtransfer/transport.h"
#include "proto/control.pb.h"
#include "spec/generation.h"

namespace duet::prefill {

struct SchedulerOptions {
  int64_t max_batch_tokens = kDefaultMaxBatchTokens;  // Prompt tokens per step.
  int64_t max_queued_requests = 1024;  // Waiting (not yet admitted) requests.
  absl::Duration lease_duration = absl::Seconds(60);
  // The knowledge tree over this pool (not owned; outlives the scheduler);
  // nullptr: every prompt is computed whole.
  kvcache::PrefixTree* cache = nullptr;
  // With a cache: admit, among the queue's first reorder_window + 1
  // requests, the one with the most cached tokens per token to compute, so
  // long as no request is overtaken by more than reorder_window later
  // arrivals. 0: first come, first served.
  int64_t reorder_window = 0;
};

// One request as the scheduler holds it.
struct PrefillSequence {
  proto::PrefillRequest request;
  spec::GenerationParams params;  // The request's, converted once when it was accepted.
  std::vector<int32_t> tokens;  // prompt_ids + resume_ids: what is prefilled.
  absl::Time arrival;
  int64_t computed = 0;  // Tokens already run through the model.
  engine::SequenceKv kv;
  uint64_t lease_id = 0;  // While leased.
  // The cached prefix it started from, pinned in `cache` until the sequence
  // ends (leased blocks included).
  kvcache::PrefixTree* cache = nullptr;
  kvcache::Match cached;
  int64_t overtaken = 0;  // Later arrivals admitted before it (at most the reorder window).

  PrefillSequence(proto::PrefillRequest r, spec::GenerationParams p, engine::BlockPool* pool, absl::Time now);
  ~PrefillSequence();
  PrefillSequence(const PrefillSequence&) = delete;
  PrefillSequence& operator=(const PrefillSequence&) = delete;
  uint64_t id() const { return request.request_id(); }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
};

// What one Model::Forward computes. Spans point into the scheduler's
// sequences and stay valid until the next call that changes the scheduler.
struct Step {
  struct Chunk {
    uint64_t request_id = 0;
    absl::Span<const int32_t> tokens;  // At positions start_pos...
    int64_t start_pos = 0;
    absl::Span<const int32_t> block_table;
    bool last = false;  // The prompt's final chunk: its last row's logits are wanted.
  };
  std::vector<Chunk> chunks;
  // How long each request admitted for this step waited in the queue.
  std::vector<absl::Duration> queue_times;

  bool empty() const { return chunks.empty(); }
  int64_t num_tokens() const;
};

class PrefillScheduler {
 public:
  // pool, transport and clock must outlive the scheduler; `region` is the
  // pool's registration in `transport` (with pool->num_blocks() epoch blocks).
  PrefillScheduler(SchedulerOptions options, engine::BlockPool* pool,
                   kvtransfer::KvTransport* transport, kvtransfer::RegionId region, Clock* clock);
  // Cancels every live lease (bumping epochs) and frees every block.
  ~PrefillScheduler();
  PrefillScheduler(const PrefillScheduler&) = delete;
  PrefillScheduler& operator=(const PrefillScheduler&) = delete;

  // Queues a validated request with its parameters. ResourceExhausted "prefill queue full" at
  // max_queued_requests, or when its prompt needs more blocks than the whole
  // pool (it could never run); AlreadyExists for an id already held.
  absl::Status Enqueue(proto::PrefillRequest request, spec::GenerationParams params);

  // Plans the next step (admitting queue heads as blocks allow). Empty when
  // nothing can run now.
  Step Schedule();
  // Records that `step` ran; returns the requests whose prompt is now fully
  // computed, in step order. They stay "complete" until Finish or Lease.
  std::vector<uint64_t> Complete(const Step& step);
  // Records that `step` failed: its requests are dropped; returns their ids.
  std::vector<uint64_t> Fail(const Step& step);

  // A complete request (or any held request) by id; nullptr if unknown.
  const PrefillSequence* Find(uint64_t id) const;

  // Another choice of a complete request's prompt (n > 1): a complete
  // request `sibling` (same prompt) that shares the parent's full KV blocks
  // and gets its own copy of a partial last block, so the prompt is computed
  // once for every choice; its parameters are the parent's with the
  // sibling's choice_index. ResourceExhausted when no block is free for the
  // copy; AlreadyExists for an id already held.
  absl::Status Fork(uint64_t parent, proto::PrefillRequest sibling);
  // Whether `id` is a choice (sibling id) of a request queued or prefilling.
  bool IsPendingSibling(uint64_t id) const;
  // Ends a complete request without handing it on (token 1 was its last, or
  // the offer could not be made): its blocks return to the pool.
  void Finish(uint64_t id);
  // Leases a complete request's blocks for decode; the lease's epochs go in
  // the KvHandle. The request then waits for Release, CancelLease or expiry.
  absl::StatusOr<kvtransfer::LeaseTable::Lease> Lease(uint64_t id);
  // KvReleased: ends the lease and frees the blocks. Returns the blocks'
  // count (0 when the request is not leased here, e.g. its lease expired).
  int64_t Release(uint64_t id);
  // Ends a leased request's lease as cancelled (its offer failed); false
  // when it is not leased (already released or expired).
  bool CancelLease(uint64_t id);
  // Cancel: drops the request wherever it is. False when unknown.
  bool Cancel(uint64_t id);
  // Ends every lease past its deadline; returns how many.
  int ExpireDue();
  // The router is gone: drops every queued, prefilling and complete request
  // (leased ones stay until released or expired). Returns their ids.
  std::vector<uint64_t> DropUnleased();

  int64_t num_queued() const { return static_cast<int64_t>(queue_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_leased() const { return static_cast<int64_t>(leased_.size()); }
  int64_t leased_blocks() const { return leased_blocks_; }
  // Prompt tokens not yet computed, of queued and partially prefilled requests.
  int64_t queued_prefill_tokens() const;
  int64_t prompt_tokens_computed() const { return prompt_tokens_computed_; }
  // Prompt tokens of admitted requests looked up in the cache (all of them,
  // with no cache), and found on device and on host (since start).
  int64_t cache_query_tokens() const { return cache_hits_.query_tokens; }
  int64_t cache_hit_tokens(kvcache::Tier t) const { return cache_hits_.hits(t); }
  uint64_t lease_expirations() const { return lease_expirations_; }

 private:
  using SeqPtr = std::unique_ptr<PrefillSequence>;
  void OnLeaseEnd(uint64_t lease_id, const std::vector<int32_t>& blocks, kvtransfer::LeaseTable::EndReason reason);
  bool Holds(uint64_t id) const;
  // Reserves the head's blocks, starting from its cached prefix; false (and
  // nothing held) when they do not fit.
  bool Admit(PrefillSequence& head);
  // The queue index to admit next: 0, or within the reorder window.
  size_t NextToAdmit();
  SeqPtr TakeRunning(uint64_t id);

  const SchedulerOptions options_;
  engine::BlockPool* const pool_;
  Clock* const clock_;
  std::deque<SeqPtr> queue_;
  std::vector<SeqPtr> running_;            // Admitted and being prefilled, in admission order.
  std::map<uint64_t, SeqPtr> complete_;    // Prompt done; token 1 being handled.
  std::map<uint64_t, SeqPtr> leased_;
  std::map<uint64_t, uint64_t> lease_owner_;  // Lease id -> request.
  int64_t leased_blocks_ = 0;
  int64_t prompt_tokens_computed_ = 0;
  kvcache::HitCounts cache_hits_;
  uint64_t lease_expirations_ = 0;
  // Last: its callback touches the maps above, and it must end (CancelAll)
  // before they are destroyed.
  std::unique_ptr<kvtransfer::LeaseTable> leases_;
};

}  // namespace duet::prefill

#endif  // DUET_PREFILL_SCHEDULER_H_
