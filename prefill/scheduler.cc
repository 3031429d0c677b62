#include "prefill/scheduler.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"

namespace duet::prefill {

PrefillSequence::PrefillSequence(proto::PrefillRequest r, spec::GenerationParams p, engine::BlockPool* pool,
                                 absl::Time now)
    : request(std::move(r)), params(std::move(p)), arrival(now), kv(pool) {
  tokens.reserve(request.spec().prompt_ids().size() + request.resume_ids().size());
  tokens.insert(tokens.end(), request.spec().prompt_ids().begin(), request.spec().prompt_ids().end());
  tokens.insert(tokens.end(), request.resume_ids().begin(), request.resume_ids().end());
}

PrefillSequence::~PrefillSequence() {
  if (cache != nullptr) cache->Release(cached);
}

int64_t Step::num_tokens() const {
  int64_t n = 0;
  for (const Chunk& c : chunks) n += static_cast<int64_t>(c.tokens.size());
  return n;
}

PrefillScheduler::PrefillScheduler(SchedulerOptions options, engine::BlockPool* pool,
                                   kvtransfer::KvTransport* transport, kvtransfer::RegionId region,
                                   Clock* clock)
    : options_(options), pool_(pool), clock_(clock) {
  CHECK(options_.max_batch_tokens > 0) << "max_batch_tokens must be positive";
  leases_ = std::make_unique<kvtransfer::LeaseTable>(
      transport, region, pool->num_blocks(), clock,
      [this](uint64_t lease_id, const std::vector<int32_t>& blocks, kvtransfer::LeaseTable::EndReason reason) {
        OnLeaseEnd(lease_id, blocks, reason);
      });
}

PrefillScheduler::~PrefillScheduler() {
  // Epochs first, so a decode still pulling sees the lease end, then the
  // blocks go back with the maps.
  leases_->CancelAll();
}

bool PrefillScheduler::Holds(uint64_t id) const { return Find(id) != nullptr; }

const PrefillSequence* PrefillScheduler::Find(uint64_t id) const {
  for (const SeqPtr& s : queue_) {
    if (s->id() == id) return s.get();
  }
  for (const SeqPtr& s : running_) {
    if (s->id() == id) return s.get();
  }
  if (auto it = complete_.find(id); it != complete_.end()) return it->second.get();
  if (auto it = leased_.find(id); it != leased_.end()) return it->second.get();
  return nullptr;
}

absl::Status PrefillScheduler::Enqueue(proto::PrefillRequest request, spec::GenerationParams params) {
  const uint64_t id = request.request_id();
  if (Holds(id)) return absl::AlreadyExistsError(absl::StrCat("request ", id, " is already held"));
  if (num_queued() >= options_.max_queued_requests) {
    return absl::ResourceExhaustedError("prefill queue full");
  }
  auto seq = std::make_unique<PrefillSequence>(std::move(request), std::move(params), pool_, clock_->Now());
  const int64_t bs = pool_->layout().block_size;
  const int64_t blocks = (seq->num_tokens() + bs - 1) / bs;
  if (blocks > pool_->num_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("the prompt needs ", blocks,
                                                     " KV blocks, more than this worker's pool of ",
                                                     pool_->num_blocks()));
  }
  queue_.push_back(std::move(seq));
  return absl::OkStatus();
}

Step PrefillScheduler::Schedule() {
  Step step;
  int64_t budget = options_.max_batch_tokens;
  auto add = [&](PrefillSequence& s) {
    const int64_t len = std::min(s.num_tokens() - s.computed, budget);
    step.chunks.push_back({.request_id = s.id(),
                           .tokens = absl::MakeConstSpan(s.tokens).subspan(s.computed, len),
                           .start_pos = s.computed,
                           .block_table = s.kv.block_table(),
                           .last = s.computed + len == s.num_tokens()});
    budget -= len;
  };
  for (SeqPtr& s : running_) {
    if (budget == 0) return step;
    add(*s);
  }
  const absl::Time now = clock_->Now();
  while (budget > 0 && !queue_.empty()) {
    const size_t k = NextToAdmit();
    PrefillSequence& head = *queue_[k];
    // All of the prompt's blocks now, so a request once admitted never
    // stalls mid-prompt; one that does not fit waits for leases to end,
    // and nothing else is admitted meanwhile.
    if (!Admit(head)) break;
    step.queue_times.push_back(now - head.arrival);
    for (size_t j = 0; j < k; ++j) ++queue_[j]->overtaken;
    running_.push_back(std::move(queue_[k]));
    queue_.erase(queue_.begin() + static_cast<long>(k));
    add(*running_.back());
  }
  return step;
}

size_t PrefillScheduler::NextToAdmit() {
  if (options_.cache == nullptr || options_.reorder_window <= 0) return 0;
  size_t best = 0;
  double best_ratio = -1;
  const size_t last = std::min(queue_.size(), static_cast<size_t>(options_.reorder_window) + 1);
  for (size_t k = 0; k < last; ++k) {
    const PrefillSequence& s = *queue_[k];
    const int64_t cached =
        options_.cache->Lookup(absl::MakeConstSpan(s.tokens).subspan(0, s.tokens.size() - 1)).tokens;
    const double ratio = static_cast<double>(cached) / static_cast<double>(s.num_tokens() - cached);
    if (ratio > best_ratio) {
      best_ratio = ratio;
      best = k;
    }
    // Nothing may overtake a request already overtaken window times.
    if (s.overtaken >= options_.reorder_window) break;
  }
  return best;
}

bool PrefillScheduler::Admit(PrefillSequence& head) {
  kvcache::PrefixTree* tree = options_.cache;
  if (tree == nullptr) {
    if (!head.kv.Reserve(head.num_tokens()).ok()) return false;
    cache_hits_.query_tokens += head.num_tokens();  // every one a miss
    return true;
  }
  const int64_t bs = pool_->layout().block_size;
  // The last token is always computed: its logits give token 1. Room is
  // made (kvcache::Admit) from the tree's other unpinned leaves if the pool
  // lacks it (blocks running or leased sequences share are not freed by
  // that): with nothing else held, a prompt that fits the pool always fits.
  const absl::Span<const int32_t> prefix = absl::MakeConstSpan(head.tokens).subspan(0, head.tokens.size() - 1);
  absl::StatusOr<kvcache::Admission> a =
      kvcache::Admit(*tree, prefix, (head.num_tokens() + bs - 1) / bs, [this] { return pool_->num_free(); });
  if (!a.ok()) return false;
  if (!head.kv.ShareBlocks(a->blocks).ok() || !head.kv.Reserve(head.num_tokens()).ok()) {
    head.kv.Release();
    kvcache::Abandon(*tree, *a);
    return false;
  }
  kvcache::Commit(*tree, *a, head.num_tokens(), &cache_hits_);
  head.cache = tree;
  head.cached = a->match;
  head.computed = a->match.tokens;
  return true;
}

PrefillScheduler::SeqPtr PrefillScheduler::TakeRunning(uint64_t id) {
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if ((*it)->id() == id) {
      SeqPtr s = std::move(*it);
      running_.erase(it);
      return s;
    }
  }
  return nullptr;
}

std::vector<uint64_t> PrefillScheduler::Complete(const Step& step) {
  std::vector<uint64_t> done;
  for (const Step::Chunk& c : step.chunks) {
    const int64_t len = static_cast<int64_t>(c.tokens.size());
    prompt_tokens_computed_ += len;
    if (!c.last) {
      for (SeqPtr& s : running_) {
        if (s->id() == c.request_id) s->computed += len;
      }
      continue;
    }
    SeqPtr s = TakeRunning(c.request_id);
    CHECK(s != nullptr) << "completed chunk of unknown request " << c.request_id;
    s->computed += len;
    // Its full blocks join the tree (which takes its own references).
    if (options_.cache != nullptr) {
      const auto& b = s->request.spec().cache_boundaries();
      const std::vector<int64_t> boundaries(b.begin(), b.end());
      options_.cache->Insert(s->tokens, s->kv.block_table(), boundaries);
    }
    done.push_back(c.request_id);
    complete_[c.request_id] = std::move(s);
  }
  return done;
}

std::vector<uint64_t> PrefillScheduler::Fail(const Step& step) {
  std::vector<uint64_t> failed;
  for (const Step::Chunk& c : step.chunks) {
    if (TakeRunning(c.request_id) != nullptr) failed.push_back(c.request_id);
  }
  return failed;
}

absl::Status PrefillScheduler::Fork(uint64_t parent, proto::PrefillRequest sibling) {
  auto it = complete_.find(parent);
  if (it == complete_.end()) return absl::NotFoundError(absl::StrCat("request ", parent, " is not complete"));
  if (Holds(sibling.request_id())) {
    return absl::AlreadyExistsError(absl::StrCat("request ", sibling.request_id(), " is already held"));
  }
  const PrefillSequence& p = *it->second;
  spec::GenerationParams params = p.params;
  params.choice_index = sibling.spec().choice_index();
  auto seq = std::make_unique<PrefillSequence>(std::move(sibling), std::move(params), pool_, clock_->Now());
  if (seq->tokens != p.tokens) return absl::InvalidArgumentError("a sibling must have its parent's prompt");
  const int64_t bs = pool_->layout().block_size;
  const int64_t full = p.num_tokens() / bs * bs;
  RETURN_IF_ERROR(seq->kv.SharePrefix(p.kv, full));
  RETURN_IF_ERROR(seq->kv.Reserve(p.num_tokens()));
  if (full < p.num_tokens()) {
    // The partial last block is the choice's own: decode appends after it.
    const size_t last = static_cast<size_t>(full / bs);
    RETURN_IF_ERROR(pool_->CopyBlock(p.kv.block_table()[last], seq->kv.block_table()[last]));
  }
  seq->computed = seq->num_tokens();
  complete_[seq->id()] = std::move(seq);
  return absl::OkStatus();
}

bool PrefillScheduler::IsPendingSibling(uint64_t id) const {
  auto has = [id](const SeqPtr& s) {
    const auto& sibs = s->request.sibling_request_ids();
    return std::find(sibs.begin(), sibs.end(), id) != sibs.end();
  };
  return std::any_of(queue_.begin(), queue_.end(), has) || std::any_of(running_.begin(), running_.end(), has);
}

void PrefillScheduler::Finish(uint64_t id) { complete_.erase(id); }

absl::StatusOr<kvtransfer::LeaseTable::Lease> PrefillScheduler::Lease(uint64_t id) {
  auto it = complete_.find(id);
  if (it == complete_.end()) {
    return absl::NotFoundError(absl::StrCat("request ", id, " is not complete"));
  }
  const std::vector<int32_t>& blocks = it->second->kv.block_table();
  auto lease = leases_->Grant(blocks, options_.lease_duration);
  if (!lease.ok()) return lease.status();
  it->second->lease_id = lease->id;
  lease_owner_[lease->id] = id;
  leased_blocks_ += static_cast<int64_t>(blocks.size());
  leased_[id] = std::move(it->second);
  complete_.erase(it);
  return lease;
}

void PrefillScheduler::OnLeaseEnd(uint64_t lease_id, const std::vector<int32_t>& blocks,
                                  kvtransfer::LeaseTable::EndReason reason) {
  auto owner = lease_owner_.find(lease_id);
  if (owner == lease_owner_.end()) {
    LOG(ERROR) << "a lease ended on blocks no request holds";
    return;
  }
  const uint64_t id = owner->second;
  lease_owner_.erase(owner);
  leased_blocks_ -= static_cast<int64_t>(blocks.size());
  if (reason == kvtransfer::LeaseTable::EndReason::kExpired) {
    ++lease_expirations_;
    LOG(WARNING) << "lease of request " << id << " expired; its " << blocks.size()
                 << " blocks return to the pool";
  }
  leased_.erase(id);  // The epochs are already bumped: the blocks may be reused.
}

int64_t PrefillScheduler::Release(uint64_t id) {
  auto it = leased_.find(id);
  if (it == leased_.end()) return 0;
  const int64_t blocks = static_cast<int64_t>(it->second->kv.block_table().size());
  return leases_->Release(it->second->lease_id).ok() ? blocks : 0;
}

bool PrefillScheduler::CancelLease(uint64_t id) {
  auto it = leased_.find(id);
  if (it == leased_.end()) return false;
  return leases_->Cancel(it->second->lease_id).ok();
}

bool PrefillScheduler::Cancel(uint64_t id) {
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if ((*it)->id() == id) {
      queue_.erase(it);
      return true;
    }
  }
  if (TakeRunning(id) != nullptr) return true;
  if (complete_.erase(id) > 0) return true;
  return CancelLease(id);
}

int PrefillScheduler::ExpireDue() { return leases_->ExpireDue(); }

std::vector<uint64_t> PrefillScheduler::DropUnleased() {
  std::vector<uint64_t> ids;
  for (const SeqPtr& s : queue_) ids.push_back(s->id());
  for (const SeqPtr& s : running_) ids.push_back(s->id());
  for (const auto& [id, s] : complete_) ids.push_back(id);
  queue_.clear();
  running_.clear();
  complete_.clear();
  return ids;
}

int64_t PrefillScheduler::queued_prefill_tokens() const {
  int64_t n = 0;
  for (const SeqPtr& s : queue_) n += s->num_tokens();
  for (const SeqPtr& s : running_) n += s->num_tokens() - s->computed;
  return n;
}

}  // namespace duet::prefill
