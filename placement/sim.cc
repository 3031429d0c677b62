#include "placement/sim.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>
#include <queue>
#include <unordered_map>
#include <utility>

#include "base/logging.h"
#include "kvcache/admission.h"
#include "placement/sim_dispatch.h"

namespace duet::placement {
namespace {

enum Kind : uint8_t { kArrival, kPrefillDone, kPrefillSlot, kTransferDone, kDecodeDone, kColocDone, kControl, kCheck, kReady };

struct Event {
  double t;
  uint64_t seq;
  Kind kind;
  int32_t inst;
  int64_t a;  // request index, or batch slot
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

struct Req {
  int64_t prompt = 0;
  int64_t output = 1;
  int64_t generated = 0;   // tokens so far (the first included)
  int64_t prefilled = 0;   // chunked prefill progress
  int32_t decode = -1;
  int64_t charged = 0;     // the tokens dispatch charged its prefill (the router's book), until its first token
};

// A request's cached prefix in its prefill instance's tree, pinned through
// its prefill, and the sequence's device blocks (the prefix's, then those
// it computes).
struct Cached {
  kvcache::Match match;
  std::vector<int32_t> blocks;
};

// The simulator's BlockStore: block ids and reference counts, no data (a
// swap is counted, and its time charged by the caller).
class CountingStore : public kvcache::BlockStore {
 public:
  CountingStore(int64_t device, int64_t host) : refs_(static_cast<size_t>(device), 0) {
    for (int64_t b = device - 1; b >= 0; --b) free_device_.push_back(static_cast<int32_t>(b));
    for (int64_t h = host - 1; h >= 0; --h) free_host_.push_back(static_cast<int32_t>(h));
  }
  void RefDevice(absl::Span<const int32_t> blocks) override {
    for (int32_t b : blocks) ++refs_[static_cast<size_t>(b)];
  }
  void UnrefDevice(absl::Span<const int32_t> blocks) override {
    for (int32_t b : blocks) {
      if (--refs_[static_cast<size_t>(b)] == 0) free_device_.push_back(b);
    }
  }
  absl::StatusOr<std::vector<int32_t>> AllocateDevice(int64_t n) override {
    return Take(free_device_, n, /*device=*/true);
  }
  absl::StatusOr<std::vector<int32_t>> AllocateHost(int64_t n) override { return Take(free_host_, n, false); }
  void FreeHost(absl::Span<const int32_t> slots) override {
    free_host_.insert(free_host_.end(), slots.begin(), slots.end());
  }
  void CopyToHost(absl::Span<const int32_t>, absl::Span<const int32_t>) override {}
  void CopyToDevice(absl::Span<const int32_t> slots, absl::Span<const int32_t>) override {
    copied_in += static_cast<int64_t>(slots.size());
  }
  int64_t free_device() const { return static_cast<int64_t>(free_device_.size()); }
  int64_t copied_in = 0;

 private:
  absl::StatusOr<std::vector<int32_t>> Take(std::vector<int32_t>& from, int64_t n, bool device) {
    if (n > static_cast<int64_t>(from.size())) return absl::ResourceExhaustedError("the tier is full");
    std::vector<int32_t> out(from.end() - n, from.end());
    from.resize(from.size() - static_cast<size_t>(n));
    if (device) {
      for (int32_t b : out) refs_[static_cast<size_t>(b)] = 1;
    }
    return out;
  }
  std::vector<int> refs_;
  std::vector<int32_t> free_device_, free_host_;
};

struct Inst {
  InstanceSpec spec;
  std::deque<int64_t> waiting;
  int64_t computing_tokens = 0;  // prefill: the uncached tokens of the batches in flight
  int64_t charged_tokens = 0;    // dispatch's queue, the router's book: Req::charged summed
  // Prefill: batches in flight, one per pipeline stage at most; stage 1
  // takes the next at next_start.
  int in_flight = 0;
  double next_start = 0;
  bool slot_pending = false;
  std::vector<std::vector<int64_t>> batches;  // by slot
  std::vector<int> free_slots;
  // Decode and colocated. On a decode instance, `running` holds the
  // requests ready for their next step and `step_decode` those in the step
  // in flight; on a colocated one, `running` holds both.
  std::vector<int64_t> running;
  int64_t pulling = 0;  // decode: admitted, KV in transfer
  double kv_used = 0;
  double kv_cap = std::numeric_limits<double>::infinity();
  bool busy = false;
  std::vector<int64_t> step_decode, step_prefill;  // what the current step runs
  // Prefill with a prefix cache (ClusterSpec::cache).
  std::unique_ptr<CountingStore> store;
  std::unique_ptr<kvcache::PrefixTree> tree;
  // Autoscaled runs: whether dispatch sees it, whether it holds its GPUs
  // (since when), and the states between.
  bool accepting = true;
  bool alive = true;
  bool starting = false;
  bool draining = false;
  int switch_to = -1;  // an InstanceRole once its drain ends
  int64_t gen = 0;     // a start's kReady is for this generation only
  double since = 0;
  bool idle() const {
    return waiting.empty() && in_flight == 0 && running.empty() && step_decode.empty() && step_prefill.empty() &&
           pulling == 0 && !busy;
  }
};

class Sim {
 public:
  Sim(const ClusterSpec& c, const ModelSpec& m, LatencyModel& lat, const std::vector<SimRequest>& reqs,
      const AutoscaleOptions* autoscale = nullptr)
      : c_(c), m_(m), lat_(lat), in_(reqs), a_(autoscale), dispatch_(c.policy, c.cache_aware_weights) {
    for (const InstanceSpec& s : c.instances) {
      Inst i;
      Init(i, s);
      insts_.push_back(std::move(i));
      if (s.role != InstanceRole::kDecode) entries_.push_back(static_cast<int32_t>(insts_.size() - 1));
    }
    reqs_.resize(reqs.size());
    out_.requests.resize(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      reqs_[i].prompt = reqs[i].prompt;
      if (reqs[i].content != nullptr && static_cast<int64_t>(reqs[i].content->tokens.size()) != reqs[i].prompt) {
        LOG(FATAL) << "request " << i << " has " << reqs[i].content->tokens.size() << " token ids for a prompt of "
                   << reqs[i].prompt;
      }
      reqs_[i].output = std::max<int64_t>(1, reqs[i].output);
      out_.requests[i].arrival = reqs[i].arrival;
      out_.requests[i].output = reqs_[i].output;
    }
    kv_bytes_ = static_cast<double>(m.KvBytesPerToken());
  }

  SimResult Run() {
    if (entries_.empty()) return out_;
    // Arrivals are pushed lazily, one ahead, to keep the heap small.
    if (!in_.empty()) Push(in_[0].arrival, kArrival, -1, 0);
    if (a_ != nullptr && !in_.empty()) Push(a_->interval_s, kControl, -1, 0);
    if (a_ != nullptr && !in_.empty() && a_->check_s > 0) Push(a_->check_s, kCheck, -1, 0);
    while (!q_.empty()) {
      Event e = q_.top();
      q_.pop();
      ++out_.events;
      now_ = e.t;
      switch (e.kind) {
        case kArrival:
          OnArrival(e.a);
          if (e.a + 1 < static_cast<int64_t>(in_.size())) Push(in_[e.a + 1].arrival, kArrival, -1, e.a + 1);
          break;
        case kPrefillDone:
          OnPrefillDone(e.inst, static_cast<int>(e.a));
          break;
        case kPrefillSlot:
          insts_[e.inst].slot_pending = false;
          TryPrefill(e.inst);
          break;
        case kTransferDone:
          insts_[e.inst].pulling--;
          insts_[e.inst].running.push_back(e.a);
          TryDecode(e.inst);
          break;
        case kDecodeDone:
          OnDecodeDone(e.inst);
          break;
        case kColocDone:
          OnColocDone(e.inst);
          break;
        case kControl:
          OnControl();
          break;
        case kCheck:
          OnCheck();
          break;
        case kReady:
          OnReady(e.inst, e.a);
          break;
      }
    }
    out_.makespan = now_;
    for (const Inst& s : insts_) {
      if (s.alive) out_.gpu_seconds += s.spec.par.gpus() * (now_ - s.since);
    }
    return std::move(out_);
  }

 private:
  void Push(double t, Kind k, int32_t inst, int64_t a) { q_.push(Event{t, seq_++, k, inst, a}); }

  // An instance as `spec` builds it, empty (a reused slot too).
  void Init(Inst& i, const InstanceSpec& s) {
    i.spec = s;
    i.kv_cap = s.kv_capacity_tokens > 0 ? s.kv_capacity_tokens : std::numeric_limits<double>::infinity();
    i.kv_used = 0;
    i.next_start = 0;
    i.store.reset();
    i.tree.reset();
    if (s.role == InstanceRole::kPrefill && c_.cache.device_blocks > 0) {
      i.store = std::make_unique<CountingStore>(c_.cache.device_blocks, c_.cache.host_blocks);
      LatencyModel* own = s.latency != nullptr ? s.latency : &lat_;
      const Parallel par = s.par;
      i.tree = std::make_unique<kvcache::PrefixTree>(
          kvcache::TreeOptions{.block_size = c_.cache.block_size,
                               .policy = c_.cache.policy,
                               .host_tier = c_.cache.host_blocks > 0,
                               .cost = [own, par](int64_t prefix, int64_t tokens) {
                                 return PrefillSavedSeconds(*own, par, prefix, tokens);
                               }},
          i.store.get());
    }
  }

  // --- The request's milestones, and the figures an autoscaler reads.
  void FirstToken(int64_t r) {
    out_.requests[r].first_token = now_;
    if (a_ != nullptr) ttft_.push_back(now_ - out_.requests[r].arrival);
  }
  void Finish(int64_t r) {
    out_.requests[r].finish = now_;
    ++finished_;
    if (a_ == nullptr) return;
    const RequestOutcome& o = out_.requests[r];
    if (o.output > 1) tpot_.push_back(o.tpot());
    if (outputs_.size() < a_->sample) outputs_.push_back(o.output);
  }

  // Shared memory bandwidth: another instance computing slows this one.
  bool OtherBusy(const Inst& self) const {
    for (const Inst& s : insts_) {
      if (&s != &self && (s.in_flight > 0 || s.busy)) return true;
    }
    return false;
  }
  double Contended(const Inst& s, double t, bool prefill) const {
    const double f = prefill ? c_.interference_prefill : c_.interference_decode;
    return f > 0 && OtherBusy(s) ? t * (1 + f) : t;
  }

  // The instance's own latency model (heterogeneous clusters), else the cluster's.
  LatencyModel& Lat(const Inst& s) { return s.spec.latency != nullptr ? *s.spec.latency : lat_; }

  double Need(int64_t r) const { return static_cast<double>(reqs_[r].prompt + reqs_[r].output); }

  // What the first batch or step after an idle spell pays on top. The spell
  // is the whole cluster's: what goes cold is the machine's memory system,
  // not one process's pages (on the VM that measured it, any core reading
  // memory keeps every process warm), so nothing pays while another
  // instance computes, or right after one did.
  double Idle(Inst& s) {
    const double penalty = Lat(s).IdlePenalty(now_ - last_end_);
    return penalty > 0 && !OtherBusy(s) ? penalty : 0.0;
  }

  // Dispatch is the router's (sim_dispatch.h): each instance's load as it
  // stands now (the vector is kept between picks).
  // Only the instances that take work (all, in a fixed cluster);
  // load_index_ maps a pick back to insts_.
  absl::Span<const InstanceLoad> Loads() {
    loads_.clear();
    load_index_.clear();
    for (size_t i = 0; i < insts_.size(); ++i) {
      const Inst& s = insts_[i];
      if (!s.accepting) continue;
      load_index_.push_back(static_cast<int32_t>(i));
      InstanceLoad& l = loads_.emplace_back();
      l.role = s.spec.role;
      l.charged_tokens = s.charged_tokens;
      l.kv_used = s.kv_used;
      l.kv_cap = s.kv_cap;
      l.requests = static_cast<int64_t>(s.running.size() + s.waiting.size() + s.step_decode.size()) + s.pulling;
      l.tree = s.tree.get();
    }
    return loads_;
  }

  // The prefill (or colocated) instance for request r; sets its charge.
  int32_t PickEntry(int64_t r) {
    const PromptTokens* c = in_[static_cast<size_t>(r)].content;
    const SimDispatch::Pick p = dispatch_.PickPrefill(
        Loads(), c != nullptr ? absl::MakeConstSpan(c->tokens) : absl::Span<const int32_t>(), reqs_[r].prompt);
    reqs_[r].charged = p.charged;
    return load_index_[static_cast<size_t>(p.instance)];
  }

  bool AnyDecode() {
    for (const InstanceLoad& l : Loads()) {
      if (l.role == InstanceRole::kDecode) return true;
    }
    return false;
  }

  void OnArrival(int64_t r) {
    ++arrived_;
    if (a_ != nullptr) {
      ++arrivals_;
      ++check_arrivals_;
      prompt_tokens_ += reqs_[r].prompt;
      if (prompts_.size() < a_->sample) prompts_.push_back(reqs_[r].prompt);
    }
    const int32_t i = PickEntry(r);
    Inst& s = insts_[i];
    s.waiting.push_back(r);
    s.charged_tokens += reqs_[r].charged;
    if (s.spec.role == InstanceRole::kPrefill) {
      TryPrefill(i);
    } else {
      TryColoc(i);
    }
  }

  // --- Pipeline stages (prefill and decode instances).
  // Whether stage 1 can take a batch now; if not, `wake` fires when it can.
  bool StageOneFree(int32_t i, Kind wake) {
    Inst& s = insts_[i];
    if (now_ >= s.next_start) return true;
    if (!s.slot_pending) {
      s.slot_pending = true;
      Push(s.next_start, wake, i, 0);
    }
    return false;
  }
  // A free slot for a batch in flight.
  int TakeSlot(Inst& s) {
    if (s.free_slots.empty()) {
      s.batches.emplace_back();
      return static_cast<int>(s.batches.size()) - 1;
    }
    const int slot = s.free_slots.back();
    s.free_slots.pop_back();
    return slot;
  }

  // --- Prefill instances.
  void TryPrefill(int32_t i) {
    Inst& s = insts_[i];
    // Up to pp batches in flight, one per stage: the latency model's time is
    // a batch's way through every stage, and stage 1 takes the next batch
    // once it has handed this one on (time / pp later).
    const int pp = std::max(1, s.spec.par.pp);
    while (!s.waiting.empty() && s.in_flight < pp) {
      if (!StageOneFree(i, kPrefillSlot)) return;
      const int slot = TakeSlot(s);
      std::vector<int64_t>& batch = s.batches[slot];
      batch.clear();
      lens_.clear();
      int64_t tokens = 0;
      int64_t swap_blocks = 0;
      while (!s.waiting.empty()) {
        const int64_t r = s.waiting.front();
        // The budget counts the tokens to compute, after any cached prefix.
        const int64_t compute = s.tree != nullptr ? reqs_[r].prompt - s.tree->Lookup(CachePrefix(r)).tokens
                                                  : reqs_[r].prompt;
        if (!batch.empty() && (tokens + compute > s.spec.max_batch_tokens ||
                               (s.spec.max_prefill_batch > 0 &&
                                static_cast<int64_t>(batch.size()) >= s.spec.max_prefill_batch))) {
          break;
        }
        s.waiting.pop_front();
        batch.push_back(r);
        const int64_t computed = reqs_[r].prompt - (s.tree != nullptr ? AcquireCached(s, r, &swap_blocks) : 0);
        lens_.push_back(computed);
        tokens += computed;
        out_.requests[r].prefill_start = now_;
      }
      // Host hits are copied in first, at the host link's speed.
      out_.cache.swap_in_blocks += swap_blocks;
      const double swap = swap_blocks > 0 ? static_cast<double>(swap_blocks * c_.cache.block_size) * kv_bytes_ /
                                                c_.cache.host_link_bytes_per_s
                                          : 0.0;
      const double t = Contended(s, Lat(s).Prefill(s.spec.par, lens_), /*prefill=*/true) + swap +
                       (s.in_flight == 0 ? Idle(s) : 0.0);
      s.in_flight++;
      s.computing_tokens += tokens;
      s.next_start = now_ + t / pp;
      Push(now_ + t, kPrefillDone, i, slot);
    }
  }

  // The prompt but its last token: what a prefix cache may supply.
  absl::Span<const int32_t> CachePrefix(int64_t r) const {
    const PromptTokens* c = in_[static_cast<size_t>(r)].content;
    return c == nullptr || c->tokens.empty() ? absl::Span<const int32_t>()
                                             : absl::MakeConstSpan(c->tokens).subspan(0, c->tokens.size() - 1);
  }

  // As a worker admits a request (kvcache::Admit, as prefill::PrefillScheduler does): its
  // cached prefix pinned, room made for every block the prompt fills but
  // its cached device ones (unpinned leaves evicted), the host part swapped
  // in (its blocks added to `swap_blocks`) and the rest allocated, a hit
  // counted; returns the cached tokens. A prompt that finds no room is
  // computed uncached and kept out of the tree (the worker would wait).
  int64_t AcquireCached(Inst& s, int64_t r, int64_t* swap_blocks) {
    SimResult::Cache& st = out_.cache;
    st.query_tokens += reqs_[r].prompt;
    const PromptTokens* in = in_[static_cast<size_t>(r)].content;
    if (in == nullptr || in->tokens.empty()) return 0;
    st.doc_tokens += in->doc_end - in->doc_begin;
    const int64_t bs = c_.cache.block_size;
    const int64_t all = (static_cast<int64_t>(in->tokens.size()) + bs - 1) / bs;
    const int64_t copied = s.store->copied_in;
    absl::StatusOr<kvcache::Admission> a =
        kvcache::Admit(*s.tree, CachePrefix(r), all, [&s] { return s.store->free_device(); });
    if (!a.ok()) return 0;
    const kvcache::Match m = a->match;
    std::vector<int32_t> blocks = std::move(a->blocks);
    s.store->RefDevice(blocks);  // the sequence's, until its blocks join the tree
    *swap_blocks += s.store->copied_in - copied;
    std::vector<int32_t> fresh = s.store->AllocateDevice(all - m.tokens / bs).value();
    blocks.insert(blocks.end(), fresh.begin(), fresh.end());
    cached_[r] = Cached{.match = m, .blocks = std::move(blocks)};
    kvcache::HitCounts hits;
    kvcache::Commit(*s.tree, *a, /*query_tokens=*/0, &hits);  // its query is counted above, admitted or not
    st.hit_device += hits.hits(kvcache::Tier::kDevice);
    st.hit_host += hits.hits(kvcache::Tier::kHost);
    st.doc_hits += std::clamp<int64_t>(m.tokens - in->doc_begin, 0, in->doc_end - in->doc_begin);
    out_.requests[r].cached = m.tokens;
    cached_tokens_ += m.tokens;
    return m.tokens;
  }

  // As a worker completes a prompt: its full blocks join the tree, the
  // sequence's references end (the partial last block's with them: the
  // worker keeps it until decode has pulled it) and so does the pin.
  void InsertComputed(Inst& s, int64_t r) {
    auto it = cached_.find(r);
    if (it == cached_.end()) return;  // no content, or no room at admission
    const Cached q = std::move(it->second);
    cached_.erase(it);
    const PromptTokens& in = *in_[static_cast<size_t>(r)].content;
    const size_t full = in.tokens.size() / static_cast<size_t>(c_.cache.block_size);
    s.tree->Insert(absl::MakeConstSpan(in.tokens).subspan(0, full * static_cast<size_t>(c_.cache.block_size)),
                   absl::MakeConstSpan(q.blocks).subspan(0, full), in.boundaries);
    s.store->UnrefDevice(q.blocks);
    s.tree->Release(q.match);
  }

  void OnPrefillDone(int32_t i, int slot) {
    Inst& s = insts_[i];
    s.in_flight--;
    for (int64_t r : s.batches[slot]) s.computing_tokens -= reqs_[r].prompt - out_.requests[r].cached;
    last_end_ = now_;
    if (s.tree != nullptr) {
      for (int64_t r : s.batches[slot]) InsertComputed(s, r);
    }
    const bool any_decode = AnyDecode();
    for (int64_t r : s.batches[slot]) {
      FirstToken(r);
      reqs_[r].generated = 1;
      s.charged_tokens -= std::exchange(reqs_[r].charged, 0);
      if (reqs_[r].output <= 1 || !any_decode) {
        Finish(r);
        continue;
      }
      const int32_t d = load_index_[static_cast<size_t>(dispatch_.PickDecode(Loads()))];
      insts_[d].waiting.push_back(r);
      TryDecode(d);
    }
    s.free_slots.push_back(slot);
    TryPrefill(i);
    MaybeRetire(i);
  }

  // --- Decode instances, as duet's decode engine runs them: at the start of
  // a step it admits waiting requests that fit (KV reserved) and starts
  // pulling their KV; a request whose pull has ended joins the next step
  // that starts. One arriving mid-step thus waits for that step's end, its
  // pull, and the step in flight when the pull ends, if any.
  void Admit(int32_t i) {
    Inst& s = insts_[i];
    const int64_t cap = s.spec.max_batch_size * std::max(1, s.spec.par.pp);  // a micro-batch per stage
    const int64_t stepping = static_cast<int64_t>(s.step_decode.size());
    while (!s.waiting.empty() && static_cast<int64_t>(s.running.size()) + stepping + s.pulling < cap) {
      const int64_t r = s.waiting.front();
      if (s.kv_used + Need(r) > s.kv_cap && !(s.running.empty() && stepping == 0 && s.pulling == 0)) break;
      s.waiting.pop_front();
      s.kv_used += Need(r);
      s.pulling++;
      const double transfer =
          c_.kv_link_bytes_per_s > 0 ? static_cast<double>(reqs_[r].prompt) * kv_bytes_ / c_.kv_link_bytes_per_s : 0;
      Push(now_ + transfer, kTransferDone, i, r);
    }
  }

  // A colocated instance's decode step over all its running requests.
  void StartDecodeStep(int32_t i, Kind done) {
    Inst& s = insts_[i];
    ctx_.clear();
    for (int64_t r : s.running) ctx_.push_back(reqs_[r].prompt + reqs_[r].generated);
    s.step_decode = s.running;
    const double idle = Idle(s);
    s.busy = true;
    Push(now_ + Contended(s, Lat(s).Decode(s.spec.par, ctx_), /*prefill=*/false) + idle, done, i, 0);
  }

  // A decode instance's steps. With pp stages its ready requests run as up
  // to pp micro-batches of at most max_batch_size each, one per stage, as
  // DistServe and vLLM run pipeline-parallel decode: in the steady state
  // each micro-batch passes every stage once per cycle, so every request
  // gets a token per cycle, and a cycle lasts the slowest micro-batch's way
  // through all stages. One event per cycle (not per micro-batch) keeps the
  // simulator's cost that of pp = 1.
  void TryDecode(int32_t i) {
    Inst& s = insts_[i];
    if (s.busy) return;
    Admit(i);
    if (s.running.empty()) return;  // a pull's end calls again
    const int pp = std::max(1, s.spec.par.pp);
    const size_t take =
        std::min<size_t>(s.running.size(), static_cast<size_t>(s.spec.max_batch_size) * static_cast<size_t>(pp));
    std::vector<int64_t>& batch = s.step_decode;
    batch.assign(s.running.begin(), s.running.begin() + static_cast<long>(take));
    s.running.erase(s.running.begin(), s.running.begin() + static_cast<long>(take));
    // Micro-batches as even as the rows allow.
    const size_t groups = std::min<size_t>(static_cast<size_t>(pp), take);
    double t = 0;
    for (size_t g = 0; g < groups; ++g) {
      ctx_.clear();
      for (size_t k = g; k < take; k += groups) ctx_.push_back(reqs_[batch[k]].prompt + reqs_[batch[k]].generated);
      t = std::max(t, Lat(s).Decode(s.spec.par, ctx_));
    }
    const double idle = Idle(s);
    s.busy = true;
    Push(now_ + Contended(s, t, /*prefill=*/false) + idle, kDecodeDone, i, 0);
  }

  void OnDecodeDone(int32_t i) {
    Inst& s = insts_[i];
    s.busy = false;
    last_end_ = now_;
    for (int64_t r : s.step_decode) {
      if (++reqs_[r].generated >= reqs_[r].output) {
        Finish(r);
        s.kv_used -= Need(r);
      } else {
        s.running.push_back(r);
      }
    }
    s.step_decode.clear();
    TryDecode(i);
    MaybeRetire(i);
  }

  // One generated token for every request of the step; the finished leave.
  void FinishDecodeStep(Inst& s) {
    for (int64_t r : s.step_decode) {
      if (++reqs_[r].generated >= reqs_[r].output) {
        Finish(r);
        s.kv_used -= Need(r);
      }
    }
    s.running.erase(std::remove_if(s.running.begin(), s.running.end(),
                                   [&](int64_t r) { return reqs_[r].generated >= reqs_[r].output; }),
                    s.running.end());
    s.step_decode.clear();
  }

  // --- Colocated instances.
  void TryColoc(int32_t i) {
    Inst& s = insts_[i];
    if (s.busy) return;
    s.step_prefill.clear();
    lens_.clear();
    if (!c_.chunked_prefill) {
      // Prefill first: a batch of waiting prompts that fit.
      int64_t tokens = 0;
      while (!s.waiting.empty() && static_cast<int64_t>(s.running.size() + s.step_prefill.size()) < s.spec.max_batch_size) {
        const int64_t r = s.waiting.front();
        if (!s.step_prefill.empty() && tokens + reqs_[r].prompt > s.spec.max_batch_tokens) break;
        if (s.kv_used + Need(r) > s.kv_cap && !(s.running.empty() && s.step_prefill.empty())) break;
        s.waiting.pop_front();
        s.kv_used += Need(r);
        s.step_prefill.push_back(r);
        lens_.push_back(reqs_[r].prompt);
        tokens += reqs_[r].prompt;
        out_.requests[r].prefill_start = now_;
      }
      if (!s.step_prefill.empty()) {
        const double idle = Idle(s);
        s.busy = true;
        s.step_decode.clear();
        Push(now_ + Lat(s).Prefill(s.spec.par, lens_) + idle, kColocDone, i, 0);
        return;
      }
      if (!s.running.empty()) StartDecodeStep(i, kColocDone);
      return;
    }
    // Chunked: the running requests' decode plus up to chunk_tokens of prompts.
    int64_t budget = std::max<int64_t>(0, c_.chunk_tokens - static_cast<int64_t>(s.running.size()));
    for (size_t k = 0; k < s.waiting.size() && budget > 0; ++k) {
      const int64_t r = s.waiting[k];
      Req& q = reqs_[r];
      if (q.prefilled == 0) {
        if (s.kv_used + Need(r) > s.kv_cap && !(s.running.empty() && k == 0)) break;
        if (static_cast<int64_t>(s.running.size()) + static_cast<int64_t>(k) >= s.spec.max_batch_size) break;
        s.kv_used += Need(r);
        out_.requests[r].prefill_start = now_;
      }
      const int64_t take = std::min(budget, q.prompt - q.prefilled);
      q.prefilled += take;
      budget -= take;
      lens_.push_back(take);
      s.step_prefill.push_back(r);
    }
    if (s.step_prefill.empty() && s.running.empty()) return;
    ctx_.clear();
    for (int64_t r : s.running) ctx_.push_back(reqs_[r].prompt + reqs_[r].generated);
    s.step_decode = s.running;
    // One forward pass: the rows ride in the chunks' prefill (ForwardPassSeconds).
    const double t = Idle(s) + ForwardPassSeconds(Lat(s), s.spec.par, lens_, ctx_);
    s.busy = true;
    Push(now_ + t, kColocDone, i, 0);
  }

  void OnColocDone(int32_t i) {
    Inst& s = insts_[i];
    s.busy = false;
    last_end_ = now_;
    FinishDecodeStep(s);
    for (int64_t r : s.step_prefill) {
      Req& q = reqs_[r];
      if (c_.chunked_prefill && q.prefilled < q.prompt) continue;
      if (c_.chunked_prefill) {
        // Leaves the waiting queue now that its prompt is done.
        auto it = std::find(s.waiting.begin(), s.waiting.end(), r);
        if (it != s.waiting.end()) s.waiting.erase(it);
      }
      FirstToken(r);
      q.generated = 1;
      s.charged_tokens -= std::exchange(q.charged, 0);
      if (q.output <= 1) {
        Finish(r);
        s.kv_used -= Need(r);
      } else {
        s.running.push_back(r);
      }
    }
    s.step_prefill.clear();
    TryColoc(i);
    MaybeRetire(i);
  }

  // --- Autoscaling (AutoscaleOptions).
  const InstanceSpec& Shape(InstanceRole role) const {
    return role == InstanceRole::kPrefill ? a_->prefill : a_->decode;
  }
  // Instances the pool will have: serving or starting in it, or switching to it.
  int Planned(InstanceRole role) const {
    int n = 0;
    for (const Inst& s : insts_) {
      if (!s.alive) continue;
      n += s.switch_to >= 0 ? s.switch_to == static_cast<int>(role) : (s.spec.role == role && !s.draining);
    }
    return n;
  }

  PoolFigures Pool(InstanceRole role) const {
    PoolFigures p;
    for (const Inst& s : insts_) {
      if (!s.alive) continue;
      if (s.switch_to == static_cast<int>(role)) ++p.starting;
      if (s.spec.role != role) continue;
      p.ready += s.accepting;
      p.starting += s.starting;
      p.draining += s.draining;
      if (role == InstanceRole::kPrefill) {
        p.waiting += static_cast<int64_t>(s.waiting.size());
      } else {
        p.waiting += static_cast<int64_t>(s.waiting.size()) + s.pulling;
        p.running += static_cast<int64_t>(s.running.size() + s.step_decode.size());
        p.kv_used += s.kv_used;
        if (std::isfinite(s.kv_cap)) p.kv_capacity += s.kv_cap;
      }
    }
    return p;
  }

  LoadFigures Figures() {
    LoadFigures f;
    f.now = now_;
    f.interval_s = now_ - last_tick_;
    f.arrivals = arrivals_;
    f.prompt_lens = std::move(prompts_);
    f.output_lens = std::move(outputs_);
    f.prompt_tokens = prompt_tokens_;
    f.cached_tokens = cached_tokens_;
    f.first_tokens = static_cast<int64_t>(ttft_.size());
    f.finished = static_cast<int64_t>(tpot_.size());
    SetLatencyQuantiles(f, ttft_, tpot_);
    f.prefill = Pool(InstanceRole::kPrefill);
    f.decode = Pool(InstanceRole::kDecode);
    prompts_.clear();
    outputs_.clear();
    ttft_.clear();
    tpot_.clear();
    arrivals_ = prompt_tokens_ = cached_tokens_ = 0;
    last_tick_ = now_;
    return f;
  }

  int GpusHeld() const {
    int n = 0;
    for (const Inst& s : insts_) n += s.alive ? s.spec.par.gpus() : 0;
    return n;
  }

  void OnControl() {
    const LoadFigures f = Figures();
    const ScaleDecision d = a_->scaler->Decide(f);
    Apply(d);
    out_.timeline.push_back(FleetSample{.t = now_,
                                        .prefill = Planned(InstanceRole::kPrefill),
                                        .decode = Planned(InstanceRole::kDecode),
                                        .prefill_ready = f.prefill.ready,
                                        .decode_ready = f.decode.ready,
                                        .gpus = GpusHeld(),
                                        .arrival_rate = f.arrival_rate()});
    if (arrived_ < static_cast<int64_t>(in_.size()) || finished_ < arrived_) {
      Push(now_ + a_->interval_s, kControl, -1, 0);
    }
  }

  // Between intervals: the arrivals since the last check and the pools.
  void OnCheck() {
    LoadFigures f;
    f.now = now_;
    f.interval_s = now_ - last_check_;
    f.arrivals = check_arrivals_;
    f.prefill = Pool(InstanceRole::kPrefill);
    f.decode = Pool(InstanceRole::kDecode);
    check_arrivals_ = 0;
    last_check_ = now_;
    if (const std::optional<ScaleDecision> d = a_->scaler->Check(f)) Apply(*d);
    if (arrived_ < static_cast<int64_t>(in_.size()) || finished_ < arrived_) Push(now_ + a_->check_s, kCheck, -1, 0);
  }

  // The accepting instance of `role` holding the least work, or -1.
  int32_t LeastLoaded(InstanceRole role) const {
    int32_t best = -1;
    int64_t least = 0;
    for (size_t i = 0; i < insts_.size(); ++i) {
      const Inst& s = insts_[i];
      if (!s.accepting || s.spec.role != role) continue;
      const int64_t load = s.charged_tokens + static_cast<int64_t>(s.waiting.size() + s.running.size() +
                                                                   s.step_decode.size()) + s.pulling;
      if (best < 0 || load < least) best = static_cast<int32_t>(i), least = load;
    }
    return best;
  }

  void Apply(const ScaleDecision& d) {
    // The last serving instance of a pool never leaves it: requests would
    // have nowhere to go.
    auto serving = [&](InstanceRole role) {
      int n = 0;
      for (const Inst& s : insts_) n += s.accepting && s.spec.role == role;
      return n;
    };
    for (int k = 0; k < d.to_prefill + d.to_decode; ++k) {
      const InstanceRole from = k < d.to_prefill ? InstanceRole::kDecode : InstanceRole::kPrefill;
      const InstanceRole to = k < d.to_prefill ? InstanceRole::kPrefill : InstanceRole::kDecode;
      if (serving(from) <= 1) break;
      const int32_t i = LeastLoaded(from);
      if (i < 0) break;
      ++out_.switched;
      Drain(i, static_cast<int>(to));
    }
    for (InstanceRole role : {InstanceRole::kPrefill, InstanceRole::kDecode}) {
      const int target = std::max(1, role == InstanceRole::kPrefill ? d.prefill : d.decode);
      int n = Planned(role);
      for (; n < target; ++n) Start(role);
      for (; n > target; --n) {
        // A starting instance leaves at once; else the least loaded drains.
        int32_t pick = -1;
        for (size_t i = 0; i < insts_.size() && pick < 0; ++i) {
          const Inst& s = insts_[i];
          if (s.alive && s.starting && s.spec.role == role) pick = static_cast<int32_t>(i);
        }
        if (pick >= 0) {
          Retire(pick);
          continue;
        }
        if (serving(role) <= 1) break;
        pick = LeastLoaded(role);
        if (pick < 0) break;
        Drain(pick, -1);
      }
    }
  }

  void Start(InstanceRole role) {
    size_t i = 0;
    while (i < insts_.size() && insts_[i].alive) ++i;  // a retired slot, or a new one
    if (i == insts_.size()) insts_.emplace_back();
    Inst& s = insts_[i];
    Init(s, Shape(role));
    s.alive = true;
    s.accepting = false;
    s.starting = true;
    s.draining = false;
    s.switch_to = -1;
    s.since = now_;
    ++out_.started;
    Push(now_ + a_->startup_s, kReady, static_cast<int32_t>(i), ++s.gen);
  }

  void OnReady(int32_t i, int64_t gen) {
    Inst& s = insts_[i];
    if (!s.alive || !s.starting || gen != s.gen) return;
    s.starting = false;
    s.accepting = true;
  }

  void Drain(int32_t i, int switch_to) {
    Inst& s = insts_[i];
    s.accepting = false;
    s.draining = true;
    s.switch_to = switch_to;
    if (switch_to < 0) ++out_.drained;
    MaybeRetire(i);
  }

  // A draining instance whose last request has ended leaves, or serves in
  // its new role after the switch.
  void MaybeRetire(int32_t i) {
    Inst& s = insts_[i];
    if (!s.draining || !s.idle()) return;
    if (s.switch_to >= 0) {
      const InstanceRole to = static_cast<InstanceRole>(s.switch_to);
      const double since = s.since;
      Init(s, Shape(to));
      s.since = since;  // its GPUs stay held
      s.draining = false;
      s.starting = true;
      s.switch_to = -1;
      Push(now_ + a_->switch_s, kReady, i, ++s.gen);
      return;
    }
    Retire(i);
  }

  void Retire(int32_t i) {
    Inst& s = insts_[i];
    out_.gpu_seconds += s.spec.par.gpus() * (now_ - s.since);
    s.alive = s.accepting = s.starting = s.draining = false;
    s.switch_to = -1;
    ++s.gen;
  }

  const ClusterSpec& c_;
  const ModelSpec& m_;
  LatencyModel& lat_;
  const std::vector<SimRequest>& in_;
  const AutoscaleOptions* a_;
  std::vector<Inst> insts_;
  std::vector<int32_t> entries_;
  std::vector<Req> reqs_;
  std::unordered_map<int64_t, Cached> cached_;  // requests in a cached prefill batch
  SimResult out_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> q_;
  uint64_t seq_ = 0;
  double now_ = 0;
  double kv_bytes_ = 0;
  SimDispatch dispatch_;
  std::vector<InstanceLoad> loads_;
  std::vector<int32_t> load_index_;
  std::vector<int64_t> lens_, ctx_;
  int64_t arrived_ = 0, finished_ = 0;
  // The interval's figures (autoscaled runs).
  double last_tick_ = 0;
  int64_t arrivals_ = 0, prompt_tokens_ = 0, cached_tokens_ = 0;
  double last_check_ = 0;  // and the checks' between intervals
  int64_t check_arrivals_ = 0;
  std::vector<int64_t> prompts_, outputs_;
  std::vector<double> ttft_, tpot_;
  double last_end_ = 0;  // when any instance last ended a batch or step (idle penalty)
};

// Two-sided 99% Student t quantile for `dof` degrees of freedom
// (Cornish-Fisher expansion around the normal's 2.5758; within 1e-3 for dof >= 10).
double T99(int dof) {
  const double z = 2.5758293035489;
  const double v = dof;
  const double z3 = z * z * z, z5 = z3 * z * z;
  return z + (z3 + z) / (4 * v) + (5 * z5 + 16 * z3 + 3 * z) / (96 * v * v);
}

}  // namespace

const char* InstanceRoleName(InstanceRole r) {
  switch (r) {
    case InstanceRole::kPrefill: return "prefill";
    case InstanceRole::kDecode: return "decode";
    case InstanceRole::kColocated: return "colocated";
  }
  return "?";
}

int ClusterSpec::gpus() const {
  int n = 0;
  for (const InstanceSpec& i : instances) n += i.par.gpus();
  return n;
}

SimResult Simulate(const ClusterSpec& cluster, const ModelSpec& model, LatencyModel& latency,
                   const std::vector<SimRequest>& requests) {
  return Sim(cluster, model, latency, requests).Run();
}

SimResult SimulateAutoscaled(const ClusterSpec& initial, const ModelSpec& model, LatencyModel& latency,
                             const std::vector<SimRequest>& requests, const AutoscaleOptions& autoscale) {
  CHECK(autoscale.scaler != nullptr) << "an autoscaled run needs a scaler";
  CHECK(autoscale.interval_s > 0) << "the autoscaler's interval must be positive";
  return Sim(initial, model, latency, requests, &autoscale).Run();
}

double SimResult::Attainment(const Slo& slo) const {
  if (requests.empty()) return 0;
  int64_t ok = 0;
  for (const RequestOutcome& r : requests) ok += r.finish >= 0 && r.ttft() <= slo.ttft && r.tpot() <= slo.tpot;
  return static_cast<double>(ok) / static_cast<double>(requests.size());
}

double SimResult::TtftAttainment(double ttft, size_t from) const {
  if (requests.size() <= from) return 0;
  int64_t ok = 0;
  for (size_t i = from; i < requests.size(); ++i) ok += requests[i].first_token >= 0 && requests[i].ttft() <= ttft;
  return static_cast<double>(ok) / static_cast<double>(requests.size() - from);
}

double SimResult::TpotAttainment(double tpot, size_t from) const {
  if (requests.size() <= from) return 0;
  int64_t ok = 0;
  for (size_t i = from; i < requests.size(); ++i) ok += requests[i].finish >= 0 && requests[i].tpot() <= tpot;
  return static_cast<double>(ok) / static_cast<double>(requests.size() - from);
}

double SimResult::Percentile(double p, bool tpot, size_t from) const {
  std::vector<double> v;
  v.reserve(requests.size());
  for (size_t i = from; i < requests.size(); ++i) {
    const RequestOutcome& r = requests[i];
    if (r.finish < 0) continue;
    if (tpot && r.output <= 1) continue;
    v.push_back(tpot ? r.tpot() : r.ttft());
  }
  return v.empty() ? 0 : Quantile(v, p);
}

SimResult::Interval SimResult::QueueWaitBatchMeans(int batches, double warmup) const {
  Interval out;
  const size_t start = static_cast<size_t>(warmup * static_cast<double>(requests.size()));
  const size_t n = requests.size() - start;
  if (batches < 2 || n < static_cast<size_t>(batches)) return out;
  const size_t per = n / static_cast<size_t>(batches);
  std::vector<double> means;
  for (int b = 0; b < batches; ++b) {
    double sum = 0;
    for (size_t k = 0; k < per; ++k) sum += requests[start + static_cast<size_t>(b) * per + k].queue_wait();
    means.push_back(sum / static_cast<double>(per));
  }
  double mean = 0;
  for (double m : means) mean += m;
  mean /= batches;
  double var = 0;
  for (double m : means) var += (m - mean) * (m - mean);
  var /= batches - 1;
  const double half = T99(batches - 1) * std::sqrt(var / batches);
  out.mean = mean;
  out.lo = mean - half;
  out.hi = mean + half;
  out.batches = batches;
  return out;
}

double MeanRate(const std::vector<SimRequest>& requests) {
  if (requests.size() < 2) return 1.0;
  const double span = requests.back().arrival - requests.front().arrival;
  return span > 0 ? static_cast<double>(requests.size() - 1) / span : 1.0;
}

std::vector<SimRequest> AtRate(const std::vector<SimRequest>& base, double rate) {
  const double k = MeanRate(base) / rate;
  std::vector<SimRequest> out = base;
  for (SimRequest& r : out) r.arrival *= k;
  return out;
}

Goodput FindGoodput(const ClusterSpec& cluster, const ModelSpec& model, LatencyModel& latency,
                    const std::vector<SimRequest>& base, const Slo& slo, double target, double rel_tol, double hint) {
  Goodput g;
  auto attain = [&](double rate) {
    ++g.simulations;
    return Simulate(cluster, model, latency, AtRate(base, rate)).Attainment(slo);
  };
  // Bracket [lo, hi]: lo meets the target, hi misses it. Steps of 2x from
  // the base rate, or of 1.25x from a hint.
  const double step = hint > 0 ? 1.25 : 2.0;
  double lo = 0, hi = hint > 0 ? hint : MeanRate(base);
  double a = attain(hi);
  if (a >= target) {
    lo = hi;
    for (int i = 0; i < 60; ++i) {
      hi = lo * step;
      if (attain(hi) < target) break;
      lo = hi;
    }
  } else {
    // Down to 1/1000 of the base rate: a configuration that misses even
    // there (say a prompt alone outlasts the TTFT target) has no goodput,
    // which one simulation at the floor tells before any stepping down.
    const double floor = MeanRate(base) / 1000;
    if (attain(floor) < target) return g;
    while (a < target && hi > floor) {
      hi /= step;
      a = attain(hi);
    }
    if (a < target) return g;
    lo = hi;
    hi *= step;
  }
  while ((hi - lo) > rel_tol * hi) {
    const double mid = 0.5 * (lo + hi);
    if (attain(mid) >= target) lo = mid;
    else hi = mid;
  }
  g.rate = lo;
  g.per_gpu = lo / std::max(1, cluster.gpus());
  g.attainment = attain(lo);
  return g;
}

}  // namespace duet::placement
