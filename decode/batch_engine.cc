#include "decode/batch_engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/logging.h"

namespace duet::decode {
namespace {

// Enough to outlast any offer still in flight behind its cancel.
constexpr size_t kRememberCancelled = 4096;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

struct BatchEngine::Seq {
  explicit Seq(engine::BlockPool* pool) : kv(pool) {}

  uint64_t id = 0;
  uint64_t arrival = 0;  // Order of Add: "newest" means the largest.
  std::vector<int32_t> tokens;  // Prompt, then generated.
  int64_t num_prompt = 0;
  GenerationParams params;
  engine::SequenceKv kv;
  int64_t computed = 0;  // Positions whose KV is in kv.
  Phase phase = Phase::kWaiting;
  bool import_kv = false;  // Its KV is still to come from the importer.
  // Prefill every token, then sample (a new request); otherwise prefill all
  // but the last, which is then fed as a decode token (a recompute).
  bool fresh = true;
  bool first_pending = false;  // The next sample is this attempt's first token.
  // Its cached prefix in the tree, pinned while `pinned`.
  kvcache::Match cached;
  bool pinned = false;
  int64_t cached_prompt_tokens = 0;  // Of the attempt that samples the first token.
  std::vector<int64_t> cache_boundaries;
  std::shared_ptr<grammar::TokenConstraint> constraint;  // Null: free text.

  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - num_prompt; }
  int64_t PrefillTarget() const {
    return fresh ? static_cast<int64_t>(tokens.size()) : static_cast<int64_t>(tokens.size()) - 1;
  }
  // Positions the request must hold before it can run: its prefill plus
  // the next fed token, so a newly admitted request never preempts in its
  // first step.
  int64_t AdmitPositions() const { return PrefillTarget() + 1; }
};

BatchEngine::BatchEngine(engine::Model* model, engine::BlockPool* pool, KvImporter* importer,
                         BatchEngineOptions options)
    : model_(model),
      pool_(pool),
      importer_(importer),
      // At least one request and one token a step, or nothing would ever run.
      options_{.max_running = std::max<int64_t>(options.max_running, 1),
               .token_budget = std::max<int64_t>(options.token_budget, 1),
               .cache = options.cache,
               .mask_seconds = options.mask_seconds} {}

BatchEngine::~BatchEngine() { DropAll(); }

absl::Status BatchEngine::Add(SequenceRequest r) {
  last_request_id_ = std::max(last_request_id_, r.request_id);  // Taken in, queued or refused.
  if (seqs_.count(r.request_id)) {
    return absl::AlreadyExistsError(absl::StrCat("request ", r.request_id, " is already here"));
  }
  if (cancelled_.count(r.request_id)) {
    return absl::CancelledError(absl::StrCat("request ", r.request_id, " was cancelled"));
  }
  if (r.prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (r.import_kv && (importer_ == nullptr || r.generated.empty())) {
    return absl::InvalidArgumentError("an imported request needs an importer and a generated token");
  }
  auto seq = std::make_unique<Seq>(pool_);
  seq->id = r.request_id;
  seq->arrival = next_arrival_++;
  seq->num_prompt = static_cast<int64_t>(r.prompt.size());
  seq->tokens = std::move(r.prompt);
  seq->tokens.insert(seq->tokens.end(), r.generated.begin(), r.generated.end());
  seq->params = std::move(r.params);
  seq->import_kv = r.import_kv;
  seq->cache_boundaries = std::move(r.cache_boundaries);
  seq->constraint = std::move(r.constraint);
  seq->fresh = !r.import_kv;
  seq->first_pending = !r.import_kv;
  waiting_.push_back(seq.get());
  seqs_[r.request_id] = std::move(seq);
  return absl::OkStatus();
}

void BatchEngine::RememberCancelled(uint64_t id) {
  if (!cancelled_.insert(id).second) return;
  cancelled_order_.push_back(id);
  if (cancelled_order_.size() > kRememberCancelled) {
    cancelled_.erase(cancelled_order_.front());
    cancelled_order_.pop_front();
  }
}

bool BatchEngine::Cancel(uint64_t request_id) {
  auto it = seqs_.find(request_id);
  if (it == seqs_.end()) {
    RememberCancelled(request_id);
    return false;
  }
  Remove(it->second.get());
  return true;
}

void BatchEngine::DropAll() {
  std::vector<uint64_t> ids;
  ids.reserve(seqs_.size());
  for (const auto& [id, s] : seqs_) ids.push_back(id);
  for (uint64_t id : ids) Remove(seqs_.at(id).get());
  last_request_id_ = 0;  // A new router numbers its requests afresh.
}

void BatchEngine::Remove(Seq* s) {
  // The import first: its transfer may still write the blocks.
  if (s->import_kv && importer_ != nullptr) importer_->Abandon(s->id);
  s->kv.Release();
  Unpin(s);
  if (s->phase == Phase::kWaiting) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), s));
  } else {
    active_.erase(s->arrival);
  }
  seqs_.erase(s->id);  // Frees s.
}

void BatchEngine::Unpin(Seq* s) {
  if (!s->pinned) return;
  options_.cache->Release(s->cached);
  s->pinned = false;
  s->cached = {};
}

void BatchEngine::Insert(Seq* s, int64_t tokens) {
  if (options_.cache == nullptr) return;
  const int64_t full = tokens / pool_->layout().block_size;
  options_.cache->Insert(absl::MakeConstSpan(s->tokens).subspan(0, static_cast<size_t>(tokens)),
                         absl::MakeConstSpan(s->kv.block_table()).subspan(0, static_cast<size_t>(full)),
                         s->cache_boundaries);
}

void BatchEngine::Finish(Seq* s, FinishKind kind, absl::Status error, StepResult& out) {
  // What it computed stays for the next request that shares it.
  if (kind != FinishKind::kError && s->phase == Phase::kRunning) Insert(s, s->computed);
  out.finishes.push_back({.request_id = s->id, .kind = kind, .error = std::move(error)});
  Remove(s);
}

EngineCounts BatchEngine::counts() const {
  EngineCounts c;
  c.waiting = static_cast<int64_t>(waiting_.size());
  for (const Seq* s : waiting_) {
    if (!s->import_kv) c.queued_prefill_tokens += s->PrefillTarget();
  }
  for (const auto& [arrival, s] : active_) {
    switch (s->phase) {
      case Phase::kPulling: ++c.pulling; break;
      case Phase::kPrefilling:
        ++c.prefilling;
        c.queued_prefill_tokens += s->PrefillTarget() - s->computed;
        break;
      case Phase::kRunning: ++c.running; break;
      case Phase::kWaiting: break;
    }
  }
  c.prompt_tokens_computed = prompt_tokens_computed_;
  c.preemptions = preemptions_;
  c.last_request_id = last_request_id_;
  c.cache_query_tokens = cache_hits_.query_tokens;
  c.cache_hit_tokens[0] = cache_hits_.hit_tokens[0];
  c.cache_hit_tokens[1] = cache_hits_.hit_tokens[1];
  return c;
}

void BatchEngine::PollImports(StepResult& out) {
  std::vector<Seq*> pulling;  // Collected first: Finish edits active_.
  for (const auto& [arrival, s] : active_) {
    if (s->phase == Phase::kPulling) pulling.push_back(s);
  }
  for (Seq* s : pulling) {
    std::optional<absl::Status> done = importer_->Poll(s->id);
    if (!done.has_value()) continue;
    s->import_kv = false;  // The importer has forgotten it either way.
    if (!done->ok()) {
      Finish(s, FinishKind::kError, *done, out);
      continue;
    }
    s->computed = static_cast<int64_t>(s->tokens.size()) - 1;
    s->phase = Phase::kRunning;
  }
}

void BatchEngine::Preempt(Seq* v) {
  LOG(DEBUG) << "preempting request " << v->id << " (" << v->tokens.size() << " tokens)";
  v->kv.Release();
  Unpin(v);
  // A request that has sampled here (or arrived with a token to feed) keeps
  // its tokens and recomputes the KV of all but the last; one still in its
  // first prefill simply starts over.
  if (v->phase == Phase::kRunning) v->fresh = false;
  v->computed = 0;
  v->phase = Phase::kWaiting;
  active_.erase(v->arrival);
  waiting_.push_front(v);
  ++preemptions_;
}

void BatchEngine::ReserveRunning() {
  std::vector<Seq*> running;
  for (const auto& [arrival, s] : active_) {
    if (s->phase == Phase::kRunning) running.push_back(s);
  }
  // Oldest first, so the victims (newest first) are never ones already served.
  for (Seq* s : running) {
    if (s->phase != Phase::kRunning) continue;  // Preempted for an older one.
    const int64_t need = static_cast<int64_t>(s->tokens.size());  // Feeds position size - 1.
    while (s->kv.capacity_tokens() < need && !s->kv.Reserve(need).ok()) {
      // The cache's unpinned blocks go before any request does.
      if (options_.cache != nullptr && options_.cache->Evict(kvcache::Tier::kDevice, 1) > 0) continue;
      Seq* victim = nullptr;
      for (auto it = active_.rbegin(); it != active_.rend(); ++it) {
        // Pulls are left alone: their transfers are writing the blocks.
        if (it->second->phase == Phase::kRunning || it->second->phase == Phase::kPrefilling) {
          victim = it->second;
          break;
        }
      }
      Preempt(victim);  // s itself is a candidate, so there is always one.
      if (victim == s) break;
    }
  }
}

int64_t BatchEngine::GrowthNextStep() const {
  int64_t blocks = 0;
  for (const auto& [arrival, s] : active_) {
    if (s->phase == Phase::kRunning &&
        s->kv.capacity_tokens() < static_cast<int64_t>(s->tokens.size()) + 1) {
      ++blocks;
    }
  }
  return blocks;
}

void BatchEngine::Admit(StepResult& out) {
  const int64_t block_size = pool_->layout().block_size;
  while (!waiting_.empty()) {
    if (static_cast<int64_t>(active_.size()) >= options_.max_running) return;
    Seq* s = waiting_.front();
    const int64_t positions = s->AdmitPositions();
    const int64_t need = CeilDiv(positions, block_size);
    if (need > pool_->num_blocks()) {
      Finish(s, FinishKind::kError,
             absl::ResourceExhaustedError(absl::StrCat("request ", s->id, " needs ", need,
                                                       " KV blocks; this worker's pool has ",
                                                       pool_->num_blocks())),
             out);
      continue;
    }
    // Keep the blocks running requests will grow into next step, so that an
    // admission is not undone by a preemption right after (for imports, a
    // wasted pull). With nothing active the pool is all free (or the prefix
    // cache's, which gives way), so the head always goes in eventually: FIFO
    // without starvation.
    const int64_t reserve = active_.empty() ? 0 : GrowthNextStep();
    if (!Reserve(s, positions, reserve)) return;
    waiting_.pop_front();
    active_[s->arrival] = s;
    if (!s->import_kv) {
      s->phase = Phase::kPrefilling;
      continue;
    }
    s->phase = Phase::kPulling;
    absl::Status started = importer_->Start(s->id, s->kv.block_table());
    if (!started.ok()) {
      s->import_kv = false;  // A failed Start has ended the import.
      Finish(s, FinishKind::kError, std::move(started), out);
    }
  }
}

bool BatchEngine::Reserve(Seq* s, int64_t positions, int64_t reserve) {
  const int64_t bs = pool_->layout().block_size;
  kvcache::PrefixTree* tree = options_.cache;
  s->computed = 0;
  if (tree == nullptr || s->import_kv) {
    if (pool_->num_free() < CeilDiv(positions, bs) + reserve || !s->kv.Reserve(positions).ok()) return false;
    if (!s->import_kv) cache_hits_.query_tokens += s->PrefillTarget();  // every one a miss
    if (s->first_pending) s->cached_prompt_tokens = 0;
    return true;
  }
  // At least the last token of the prefill is computed: a fresh request
  // needs its logits, and a chunk is never empty. Room is made
  // (kvcache::Admit) from everything but what the match uses: with nothing
  // else active, a request that fits the pool is always admitted.
  const absl::Span<const int32_t> prefix =
      absl::MakeConstSpan(s->tokens).subspan(0, static_cast<size_t>(s->PrefillTarget() - 1));
  absl::StatusOr<kvcache::Admission> a = kvcache::Admit(*tree, prefix, CeilDiv(positions, bs) + reserve,
                                                        [this] { return pool_->num_free(); });
  if (!a.ok()) return false;
  if (!s->kv.ShareBlocks(a->blocks).ok() || !s->kv.Reserve(positions).ok()) {
    s->kv.Release();
    kvcache::Abandon(*tree, *a);
    return false;
  }
  kvcache::Commit(*tree, *a, s->PrefillTarget(), &cache_hits_);
  s->cached = a->match;
  s->pinned = true;
  s->computed = a->match.tokens;
  if (s->first_pending) s->cached_prompt_tokens = std::min(a->match.tokens, s->num_prompt);
  return true;
}

StepResult BatchEngine::Step() {
  StepResult out;
  if (importer_ != nullptr) PollImports(out);
  ReserveRunning();
  Admit(out);

  // The batch: every running request's next token, then prefill chunks of
  // the oldest prefilling requests while the token budget lasts.
  struct Entry {
    Seq* seq;
    int64_t len;
    bool sample;
  };
  std::vector<engine::BatchSeq> batch;
  std::vector<Entry> entries;
  for (const auto& [arrival, s] : active_) {
    if (s->phase != Phase::kRunning) continue;
    const int64_t pos = static_cast<int64_t>(s->tokens.size()) - 1;
    batch.push_back({.tokens = absl::MakeConstSpan(&s->tokens[pos], 1),
                     .start_pos = pos,
                     .block_table = s->kv.block_table(),
                     .logit_rows = {0}});
    entries.push_back({s, 1, true});
  }
  int64_t budget = options_.token_budget - static_cast<int64_t>(batch.size());
  if (batch.empty()) budget = std::max<int64_t>(options_.token_budget, 1);
  for (const auto& [arrival, s] : active_) {
    if (budget <= 0) break;
    if (s->phase != Phase::kPrefilling) continue;
    const int64_t target = s->PrefillTarget();
    const int64_t len = std::min(target - s->computed, budget);
    const bool last = s->computed + len == target;
    engine::BatchSeq b{.tokens = absl::MakeConstSpan(s->tokens.data() + s->computed, len),
                       .start_pos = s->computed,
                       .block_table = s->kv.block_table()};
    if (last && s->fresh) b.logit_rows = {static_cast<int32_t>(len - 1)};
    batch.push_back(std::move(b));
    entries.push_back({s, len, last && s->fresh});
    budget -= len;
  }
  if (batch.empty()) return out;

  for (const Entry& e : entries) out.batch_tokens += e.len;
  absl::StatusOr<engine::Logits> logits = model_->Forward(batch, *pool_);
  out.ran_forward = true;
  if (!logits.ok()) {
    LOG(ERROR) << "forward pass failed: " << logits.status();
    for (const Entry& e : entries) {
      Finish(e.seq, FinishKind::kError,
             absl::InternalError(absl::StrCat("forward pass failed: ", logits.status().message())), out);
    }
    return out;
  }

  const spec::ModelConfig& c = model_->config();
  int64_t row = 0;
  for (const Entry& e : entries) {
    Seq* s = e.seq;
    if (s->phase == Phase::kPrefilling) {
      s->computed += e.len;
      prompt_tokens_computed_ += e.len;
      if (s->computed == s->PrefillTarget()) {
        s->phase = Phase::kRunning;
        s->fresh = false;
        Insert(s, s->computed);
      }
      // Mid-prompt chunks and the end of a recompute (whose next token is
      // already known) have no logits.
      if (!e.sample) continue;
    } else {
      s->computed = static_cast<int64_t>(s->tokens.size());
    }
    // As engine::Generate: the position is the number of tokens before it.
    const int64_t pos = static_cast<int64_t>(s->tokens.size());
    const GenerationParams& p = s->params;
    absl::Span<const uint64_t> allowed;
    if (s->constraint != nullptr) {
      const absl::Time mask_start = absl::Now();
      allowed = s->constraint->Mask();
      if (options_.mask_seconds != nullptr && !allowed.empty()) {
        options_.mask_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - mask_start));
      }
    }
    engine::SampleResult smp = engine::Sample(
        logits->row(row++), c.vocab_size, p.sampling, p.choice_index, pos,
        absl::MakeConstSpan(s->tokens).subspan(static_cast<size_t>(s->num_prompt)), allowed);
    const int32_t token = smp.token;
    if (s->constraint != nullptr && token < 0 && s->constraint->ended()) {
      // The grammar ended at an EOS that ignore_eos or min_tokens let
      // through: nothing may follow, so the request stops there.
      Finish(s, FinishKind::kStop, absl::OkStatus(), out);
      continue;
    }
    if (s->constraint != nullptr && (token < 0 || !s->constraint->Accept(token))) {
      Finish(s, FinishKind::kError,
             token < 0 ? absl::InternalError(absl::StrCat("the request's grammar allows no next token after ",
                                                          s->generated()))
                       : absl::InternalError(absl::StrCat("the request's grammar refused token ", token,
                                                          ", which its mask allowed")),
             out);
      continue;
    }
    s->tokens.push_back(token);
    out.tokens.push_back({.request_id = s->id,
                          .sample = std::move(smp),
                          .first = s->first_pending,
                          .cached_tokens = s->cached_prompt_tokens});
    s->first_pending = false;
    switch (spec::FinishAfter(p, c, s->generated(), pos, token)) {
      case spec::FinishDecision::kStop:
        Finish(s, FinishKind::kStop, absl::OkStatus(), out);
        break;
      case spec::FinishDecision::kLength:
        Finish(s, FinishKind::kLength, absl::OkStatus(), out);
        break;
      case spec::FinishDecision::kContinue:
        break;
    }
  }
  return out;
}

}  // namespace duet::decode
