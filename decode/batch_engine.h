// BatchEngine: the continuous-batching core shared by the decode and the
// colocated worker. It owns the scheduling of one engine: a FIFO waiting
// queue, admission when the KV pool has room, one Forward per step over every
// running request's next token plus chunked prefills under a token budget,
// sampling and finishing exactly as engine::Generate does (spec::FinishAfter), and preemption
// (newest first, recomputed locally) when a running request needs a block
// and none is free.
//
//   BatchEngine engine(model, pool, importer, {.max_running = 256});
//   RETURN_IF_ERROR(engine.Add(std::move(request)));
//   while (engine.HasWork()) { StepResult r = engine.Step(); /* emit r */ }
//
// Where it sits: the services (decode_service.h, colocated_service.h) queue
// requests from the control plane into it and turn each StepResult into
// frames; it has no sockets, threads or protobuf, so scheduling is tested
// directly. A request whose KV another worker computed (decode) is filled by
// a KvImporter (kv_importer.h) after admission; any other request, and any
// preempted one, is prefilled here.
//
// A request's life: waiting -> (pulling | prefilling) -> running -> finished,
// and running/prefilling -> waiting (head of the queue) when preempted. Its
// output does not depend on batching, chunking or preemption: sampling is
// keyed by (seed, choice index, position) and recompute rebuilds the same KV.
//
// Not thread-safe: one owner (the engine thread) makes every call.
#ifndef DUET_DECODE_BATCH_ENGINE_H_
#define DUET_DECODE_BATCH_ENGINE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/serving_defaults.h"
#include "absl/status/status.h"
#include "decode/kv_importer.h"
#include "engine/block_pool.h"
#include "spec/generation.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "base/metrics.h"
#include "grammar/constraint.h"
#include "kvcache/admission.h"
#include "kvcache/prefix_tree.h"

namespace duet::decode {

using spec::GenerationParams;

struct SequenceRequest {
  uint64_t request_id = 0;
  std::vector<int32_t> prompt;
  GenerationParams params;
  // Tokens generated so far. With import_kv, the last one was sampled by the
  // KV's source and is fed next; otherwise they are resumed tokens, prefilled
  // after the prompt, and the next sampled token is this attempt's first.
  std::vector<int32_t> generated;
  // The KV of positions [0, prompt + generated - 1) comes from the importer.
  bool import_kv = false;
  // Prompt positions where the prefix cache starts its nodes (documents).
  std::vector<int64_t> cache_boundaries;
  // The grammar its output follows, already fed `generated`
  // (worker/constraints.h); null: free text. Each sample is made among the
  // tokens its mask allows, and fed to it.
  std::shared_ptr<grammar::TokenConstraint> constraint;
};

enum class FinishKind { kStop, kLength, kError };

struct TokenOut {
  uint64_t request_id = 0;
  engine::SampleResult sample;
  bool first = false;  // This attempt's first sampled token (TTFT): colocated only.
  int64_t cached_tokens = 0;  // With `first`: prompt tokens its prefill found in the prefix cache.
};

struct FinishOut {
  uint64_t request_id = 0;
  FinishKind kind = FinishKind::kLength;
  absl::Status error;  // For kError.
};

struct StepResult {
  std::vector<TokenOut> tokens;  // Batch order: one per request that sampled.
  std::vector<FinishOut> finishes;
  bool ran_forward = false;
  int64_t batch_tokens = 0;  // Tokens fed to the model this step.
};

struct BatchEngineOptions {
  int64_t max_running = 256;    // Requests holding blocks (pulling, prefilling, running).
  int64_t token_budget = kDefaultMaxBatchTokens;  // Tokens per Forward: decodes first, prefill chunks fill the rest.
  // The knowledge tree over the pool (not owned; outlives the engine), or
  // nullptr. With it, a request prefilled here starts from the longest
  // cached block-aligned prefix of its tokens but the last (shared blocks,
  // swapped in from host first, its path pinned until it ends or is
  // preempted); its full blocks join the tree when its prefill completes and
  // again, with the generated tokens, when it finishes (the next turn of a
  // chat finds its answer). The tree gives up unpinned blocks before any
  // request is preempted or kept waiting.
  kvcache::PrefixTree* cache = nullptr;
  // Where each grammar mask's time is observed (not owned), or nullptr.
  Histogram* mask_seconds = nullptr;
};

struct EngineCounts {
  int64_t waiting = 0;
  int64_t pulling = 0;
  int64_t prefilling = 0;
  int64_t running = 0;
  int64_t queued_prefill_tokens = 0;   // Still to prefill, waiting and prefilling.
  int64_t prompt_tokens_computed = 0;  // Prefilled here (prompts, resumes, recomputes).
  int64_t preemptions = 0;
  uint64_t last_request_id = 0;        // The highest id Add has taken since DropAll.
  // Prompt tokens of admitted prefills looked up in the cache (all, with no
  // cache), and found on device and on host.
  int64_t cache_query_tokens = 0;
  int64_t cache_hit_tokens[2] = {0, 0};
};

class BatchEngine {
 public:
  // model, pool and importer (null when nothing is imported) must outlive
  // the engine; the pool's layout must be the model's.
  BatchEngine(engine::Model* model, engine::BlockPool* pool, KvImporter* importer,
              BatchEngineOptions options);
  ~BatchEngine();
  BatchEngine(const BatchEngine&) = delete;
  BatchEngine& operator=(const BatchEngine&) = delete;

  // Queues a request at the tail. AlreadyExists for an id in the engine,
  // Cancelled for one cancelled before it arrived, InvalidArgument for an
  // empty prompt or an import without an importer. The caller validated the
  // parameters (ids in the vocabulary, sampling ranges).
  absl::Status Add(SequenceRequest request);
  // Drops the request wherever it is, freeing its blocks and abandoning its
  // import; nothing is reported. An unknown id is remembered for a while, so
  // that a request arriving after its cancel (a KvOffer racing a Cancel) is
  // refused. Returns whether the request was here.
  bool Cancel(uint64_t request_id);
  // Drops every request (the router is gone, or shutdown).
  void DropAll();

  // One iteration: collect finished imports, grow running requests (preempting
  // under pressure), admit from the queue, then one Forward and its samples.
  StepResult Step();

  bool HasWork() const { return !waiting_.empty() || !active_.empty(); }
  bool Contains(uint64_t request_id) const { return seqs_.count(request_id) > 0; }
  EngineCounts counts() const;

 private:
  enum class Phase { kWaiting, kPulling, kPrefilling, kRunning };
  struct Seq;

  void PollImports(StepResult& out);
  void ReserveRunning();
  void Admit(StepResult& out);
  // Reserves `positions` for a request being admitted, starting from its
  // cached prefix, with `reserve` blocks left free beyond; false (nothing
  // held) when they do not fit.
  bool Reserve(Seq* s, int64_t positions, int64_t reserve);
  // Unpins its cached path, if any.
  void Unpin(Seq* s);
  // Adds the full blocks of its first `tokens` tokens to the tree.
  void Insert(Seq* s, int64_t tokens);
  void Preempt(Seq* victim);
  // Blocks the running requests will need in the next step beyond what they hold.
  int64_t GrowthNextStep() const;
  void Finish(Seq* seq, FinishKind kind, absl::Status error, StepResult& out);
  // Forgets the request: abandons its import, frees its blocks.
  void Remove(Seq* seq);
  void RememberCancelled(uint64_t request_id);

  engine::Model* const model_;
  engine::BlockPool* const pool_;
  KvImporter* const importer_;
  const BatchEngineOptions options_;

  uint64_t next_arrival_ = 0;
  std::unordered_map<uint64_t, std::unique_ptr<Seq>> seqs_;  // By request id; owns.
  std::deque<Seq*> waiting_;
  std::map<uint64_t, Seq*> active_;  // By arrival: oldest first.
  int64_t prompt_tokens_computed_ = 0;
  int64_t preemptions_ = 0;
  uint64_t last_request_id_ = 0;
  kvcache::HitCounts cache_hits_;
  // Ids cancelled before they arrived, oldest first (bounded).
  std::deque<uint64_t> cancelled_order_;
  std::unordered_set<uint64_t> cancelled_;
};

}  // namespace duet::decode

#endif  // DUET_DECODE_BATCH_ENGINE_H_
