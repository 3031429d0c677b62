// EngineLoop: the engine thread shared by the decode and colocated services.
// It owns a BatchEngine, applies commands that the io thread queued, steps
// the engine while it has work, and turns each StepResult into frames for the
// router: FirstToken per first token, ONE TokenBatch per step with every
// other new token, then Finish per ended request.
//
//   EngineLoop loop(model, pool, importer, sink, {.role = proto::ROLE_DECODE});
//   loop.Post([req](BatchEngine& e) { ... e.Add(req) ... });   // from OnFrame
//   proto::WorkerStats s = loop.Stats();                       // any thread
//
// Who owns what: model, pool, importer and sink belong to the service and
// outlive the loop. The engine and everything it holds are touched only on
// the loop's thread; commands run there, in the order posted, before the
// next step. Stats are a snapshot taken after each step and before its
// frames are sent, so a test that saw a Finish also sees its blocks free.
//
// Metrics (MetricsRegistry::Default()): duet_requests_running,
// duet_requests_waiting and duet_kv_cache_usage_ratio (blocks requests
// hold; the prefix cache's own are in duet_prefix_cache_usage_ratio),
// labelled {role, worker}, and the prefix cache's.
//
// Thread-safe: Post, Sync, Stats and Stop may be called from any thread.
#ifndef DUET_DECODE_ENGINE_LOOP_H_
#define DUET_DECODE_ENGINE_LOOP_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/metrics.h"
#include "decode/batch_engine.h"
#include "engine/model.h"
#include "spec/model_config.h"
#include "proto/control.pb.h"
#include "worker/engine_core.h"
#include "worker/frame_sink.h"
#include "worker/inbox.h"
#include "worker/prefix_cache.h"

namespace duet::decode {

struct EngineLoopOptions {
  proto::Role role = proto::ROLE_DECODE;
  BatchEngineOptions engine;  // engine.cache: cache->tree()
  // The worker's prefix cache (not owned), or nullptr: its metrics are
  // published each step and its unpinned blocks count as free in Stats.
  worker::PrefixCache* cache = nullptr;
  // How often the loop looks at pulls in flight when it has nothing to run.
  absl::Duration poll_interval = absl::Microseconds(500);
};

class EngineLoop {
 public:
  using Command = std::function<void(BatchEngine&)>;

  EngineLoop(engine::Model* model, engine::BlockPool* pool, KvImporter* importer,
             worker::FrameSink* sink, EngineLoopOptions options);
  ~EngineLoop();  // Stop().
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Runs `command` on the engine thread before its next step.
  void Post(Command command);
  // Returns once every command posted before it has run and Stats show
  // their effect (tests, shutdown).
  void Sync();
  // Drops every request (abandoning imports, freeing blocks) and joins the thread.
  void Stop();

  // Role, blocks, queue and counters; the services add their own fields.
  proto::WorkerStats Stats() const;

  // The frames both engine roles answer alike: Cancel (posted to the engine)
  // and StatsRequest (answered to the router with `stats()`, the service's
  // own snapshot). Returns whether `frame` was one of them.
  bool HandleCommonFrame(const proto::Frame& frame, absl::FunctionRef<proto::WorkerStats()> stats);

 private:
  void Run();
  void Publish(const BatchEngine& engine);
  void Emit(StepResult& result);

  engine::BlockPool* const pool_;
  worker::FrameSink* const sink_;
  const EngineLoopOptions options_;
  const std::string worker_id_;
  Gauge* running_gauge_;
  Gauge* waiting_gauge_;
  Gauge* usage_gauge_;

  worker::Inbox<Command> inbox_;
  mutable absl::Mutex mu_;
  EngineCounts counts_ ABSL_GUARDED_BY(mu_);
  int64_t kv_blocks_free_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t prefix_cache_blocks_ ABSL_GUARDED_BY(mu_) = 0;

  BatchEngine engine_;  // Engine thread only.
  std::thread thread_;
};

// The engine's parameters for a request (spec::ParamsFromSpec), or
// InvalidArgument naming what is wrong: what that refuses, or a request of
// `context_tokens` that leaves no room in the context for the next token.
absl::StatusOr<GenerationParams> DecodeParams(const proto::GenerationSpec& spec, const spec::ModelConfig& config,
                                              int64_t context_tokens);


// Finish{FINISH_ERROR, error_code, error} for `request_id`.
proto::Frame ErrorFinish(uint64_t request_id, const absl::Status& status);
// Finish{STOP or LENGTH} for a request the finish rule ended (not kContinue).
proto::Frame EndFinish(uint64_t request_id, spec::FinishDecision end);

}  // namespace duet::decode

#endif  // DUET_DECODE_ENGINE_LOOP_H_
