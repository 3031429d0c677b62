// DecodeService: the decode worker's role logic (worker::WorkerService).
// It takes KvOffers from prefill workers, admits them when its KV pool has
// room, pulls their blocks (KvPuller), decodes them with continuous batching
// (BatchEngine on one engine thread, EngineLoop) and streams tokens to the
// router; it preempts the newest request under memory pressure and
// recomputes it locally.
//
//   ASSIGN_OR_RETURN(auto svc, DecodeService::Create(std::move(options), &runtime));
//   RETURN_IF_ERROR(runtime.Start(svc.get(), on_fatal));
//
// Request flow (proto/README.md): KvOffer -> layout checked (else Finish
// INVALID_ARGUMENT to the router and KvReleased{pulled=false} to the
// prefill) -> FIFO queue -> admission reserves blocks for num_tokens + 1
// positions -> pull -> KvReleased{pulled=true} -> running -> one TokenBatch
// per step -> Finish. A failed pull (peer lost, lease expired, timed out)
// ends the attempt with Finish{FINISH_ERROR, UNAVAILABLE, "KV pull failed:
// <state>: <detail>"}, so the router re-dispatches it. Cancel frees whatever
// the request holds and answers nothing.
//
// Ownership: the service owns the model, the pool, the transport (whose
// region is the pool) and the engine thread; the FrameSink (the runtime, or
// a test's fake) must outlive it, and the runtime must be stopped before
// the service is destroyed. Thread-safety: OnFrame runs on the io
// thread and only validates and queues; all engine work happens on the
// engine thread; Stats and Registration may be called from any thread.
#ifndef DUET_DECODE_DECODE_SERVICE_H_
#define DUET_DECODE_DECODE_SERVICE_H_

#include <memory>
#include <string>

#include "base/serving_defaults.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "decode/engine_loop.h"
#include "worker/constraints.h"
#include "decode/kv_puller.h"
#include "kvtransfer/transport.h"
#include "worker/frame_sink.h"
#include "worker/runtime.h"

namespace duet::decode {

struct DecodeOptions {
  // Model, threads, KV pool (block size: the prefill workers'), token
  // budget (decodes plus recompute chunks per step); its cache is unused.
  worker::EngineOptions engine;
  int64_t max_running = 256;
  absl::Duration pull_timeout = absl::Seconds(5);
  absl::Duration poll_interval = absl::Microseconds(500);  // Pull polling when idle.
  kvtransfer::KvTransportPtr transport;  // UCX in production, loopback in tests.
};

class DecodeService : public worker::WorkerService {
 public:
  static absl::StatusOr<std::unique_ptr<DecodeService>> Create(DecodeOptions options,
                                                               worker::FrameSink* sink);
  ~DecodeService() override;

  worker::RegistrationInfo Registration() override;
  void OnFrame(const rpc::ConnectionPtr& from, proto::Frame frame) override;
  void OnRouterLost() override;
  proto::WorkerStats Stats() override;

  // Returns once every frame delivered before it has been applied (tests).
  void Sync() { loop_->Sync(); }
  const proto::KvLayout& layout() const { return layout_; }

 private:
  DecodeService() = default;
  void HandleOffer(proto::KvOffer offer);

  DecodeOptions options_;
  worker::FrameSink* sink_ = nullptr;
  worker::EngineResources engine_;
  kvtransfer::KvTransportPtr transport_;  // After the pool: destroyed before it.
  std::unique_ptr<engine::TransferRegion> transfer_;  // What the transport writes: the pool or its host mirror.
  kvtransfer::RegionId region_ = 0;
  proto::KvLayout layout_;
  std::unique_ptr<KvPuller> puller_;
  std::unique_ptr<worker::Constraints> constraints_;  // Before loop_: its sequences hold their grammars.
  std::unique_ptr<EngineLoop> loop_;
};

}  // namespace duet::decode

#endif  // DUET_DECODE_DECODE_SERVICE_H_
