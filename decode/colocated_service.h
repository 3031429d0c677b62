// ColocatedService: both phases in one worker (worker::WorkerService), the
// classic baseline disaggregation must beat and the simple mode for small
// deployments. PrefillRequests are prefilled in chunks under a per-step token
// budget, in the SAME Forward as the running decodes (continuous batching
// with chunked prefill), on the BatchEngine the decode worker uses.
//
//   ASSIGN_OR_RETURN(auto svc, ColocatedService::Create(options, &runtime));
//   RETURN_IF_ERROR(runtime.Start(svc.get(), on_fatal));
//
// Request flow: PrefillRequest -> validated (else Finish INVALID_ARGUMENT)
// -> FIFO queue -> admission when the pool holds prompt + 1 positions ->
// chunked prefill -> FirstToken (TTFT) -> one TokenBatch per step -> Finish.
// resume_ids are prefilled after the prompt and generation continues after
// them. No KV moves between workers. Prompts start from their longest cached
// prefix (worker::PrefixCache; ResetPrefixCache empties it). Finishing, Cancel, preemption (newest
// first, recomputed locally) and stats are the decode worker's (role
// COLOCATED; prompt_tokens_computed counts every prefilled token).
//
// Ownership and threads as DecodeService: OnFrame (io thread) validates and
// queues; one engine thread does the rest; the FrameSink outlives the service
// and the runtime is stopped before the service is destroyed.
#ifndef DUET_DECODE_COLOCATED_SERVICE_H_
#define DUET_DECODE_COLOCATED_SERVICE_H_

#include <memory>
#include <string>

#include "base/serving_defaults.h"
#include "absl/status/statusor.h"
#include "decode/engine_loop.h"
#include "worker/constraints.h"
#include "worker/frame_sink.h"
#include "worker/prefix_cache.h"
#include "worker/runtime.h"

namespace duet::decode {

struct ColocatedOptions {
  // Model, threads, KV pool, token budget (per step: decodes first, prefill
  // chunks fill the rest) and the prefix cache (on by default; see BatchEngine).
  worker::EngineOptions engine;
  int64_t max_running = 256;
};

class ColocatedService : public worker::WorkerService {
 public:
  static absl::StatusOr<std::unique_ptr<ColocatedService>> Create(ColocatedOptions options,
                                                                  worker::FrameSink* sink);
  ~ColocatedService() override;

  worker::RegistrationInfo Registration() override;
  void OnFrame(const rpc::ConnectionPtr& from, proto::Frame frame) override;
  void OnRouterLost() override;
  proto::WorkerStats Stats() override { return loop_->Stats(); }

  // Returns once every frame delivered before it has been applied (tests).
  void Sync() { loop_->Sync(); }

 private:
  ColocatedService() = default;
  void HandlePrefill(proto::PrefillRequest request);

  ColocatedOptions options_;
  worker::FrameSink* sink_ = nullptr;
  worker::EngineResources engine_;
  std::unique_ptr<worker::PrefixCache> cache_;  // Before loop_: the engine's sequences pin it.
  proto::KvLayout layout_;
  std::unique_ptr<worker::Constraints> constraints_;  // Before loop_: its sequences hold their grammars.
  std::unique_ptr<EngineLoop> loop_;
};

}  // namespace duet::decode

#endif  // DUET_DECODE_COLOCATED_SERVICE_H_
