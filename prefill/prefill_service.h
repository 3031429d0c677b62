// PrefillService: the prefill role of a disaggregated cluster (proto/README.md).
// It batches prompts (FCFS, token budget, chunking), runs the model on its own
// KV pool, samples token 1 and sends it to the router, then lends the
// request's KV blocks to the chosen decode under a lease until the decode
// pulls them (KvReleased), the lease expires, or the request is cancelled.
//
//   WorkerRuntime rt(runtime_options);
//   ASSIGN_OR_RETURN(auto svc, PrefillService::Create(std::move(options), &rt));
//   RETURN_IF_ERROR(rt.Start(svc.get(), on_fatal));
//
// Threads: OnFrame runs on the runtime's io thread and only validates and
// queues (an invalid request is answered at once with Finish{FINISH_ERROR}).
// One engine thread owns the model, the scheduler and the leases: it drains
// the inbox, ends leases past their deadline (at least every 100 ms), runs one
// step, sends FirstToken / Finish / KvOffer, and publishes stats. Stats() and
// Registration() may be called from any thread.
//
// Ownership: the service owns the backend, model, KV pool, transport and
// scheduler; the FrameSink must outlive it, and the runtime must stop
// delivering frames (WorkerRuntime::Stop) before the service is destroyed.
// Destruction cancels every lease (epochs bumped) and returns every block.
#ifndef DUET_PREFILL_PREFILL_SERVICE_H_
#define DUET_PREFILL_PREFILL_SERVICE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "base/serving_defaults.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/metrics.h"
#include "engine/block_pool.h"
#include "engine/model.h"
#include "kernels/backend.h"
#include "kvtransfer/transport.h"
#include "prefill/scheduler.h"
#include "proto/control.pb.h"
#include "worker/engine_core.h"
#include "worker/frame_sink.h"
#include "worker/inbox.h"
#include "worker/constraints.h"
#include "worker/prefix_cache.h"
#include "worker/runtime.h"

namespace duet::prefill {

struct PrefillServiceOptions {
  // Model, threads, KV pool, token budget (prompt tokens per step; longer
  // prompts are chunked) and the knowledge tree (reuse of cached prompt
  // prefixes, on by default).
  worker::EngineOptions engine;
  int64_t max_queued_requests = 1024;  // Beyond this, Finish{RESOURCE_EXHAUSTED}.
  absl::Duration lease_duration = absl::Seconds(60);
  int64_t reorder_window = 0;  // SchedulerOptions::reorder_window
  Clock* clock = RealClock();  // Leases and queue times run on it.
  kvtransfer::KvTransportPtr transport;  // UCX in production; required.
};

class PrefillService : public worker::WorkerService {
 public:
  // Loads the model, allocates and registers the pool, starts the engine
  // thread. `sink` (usually the WorkerRuntime) must outlive the service.
  static absl::StatusOr<std::unique_ptr<PrefillService>> Create(PrefillServiceOptions options,
                                                                worker::FrameSink* sink);
  ~PrefillService() override;
  PrefillService(const PrefillService&) = delete;
  PrefillService& operator=(const PrefillService&) = delete;

  worker::RegistrationInfo Registration() override;
  void OnFrame(const rpc::ConnectionPtr& from, proto::Frame frame) override;
  void OnRouterLost() override;
  proto::WorkerStats Stats() override;

  // Blocks until the stats the engine thread last published satisfy `pred`
  // or `timeout` passes; returns whether they did. For tests and tools that
  // wait for the worker to drain instead of sleeping.
  bool WaitForStats(const std::function<bool(const proto::WorkerStats&)>& pred,
                    absl::Duration timeout);

  const spec::ModelConfig& model_config() const { return model()->config(); }
  // The pool, for tests that compare KV bytes (read it only while idle).
  const engine::BlockPool& pool() const { return *pool_; }
  const proto::KvLayout& layout() const { return layout_; }

 private:
  struct Event;

  PrefillService(PrefillServiceOptions options, worker::FrameSink* sink);
  absl::Status Init();
  void Post(Event event);
  void EngineLoop();
  void Handle(Event& event);
  void RunStep(const Step& step);
  void HandleFirstToken(uint64_t id, const engine::Logits& logits, int64_t row);
  void Offer(uint64_t id, const proto::Token& token);
  void SendFinish(uint64_t id, proto::FinishReason reason, const absl::Status& error = absl::OkStatus());
  void PublishStats();

  PrefillServiceOptions options_;
  worker::FrameSink* const sink_;
  const std::string worker_id_;
  std::shared_ptr<const worker::LoadedModel> loaded_;  // the backend and the model
  engine::Model* model() const { return loaded_->model.get(); }
  std::unique_ptr<engine::BlockPool> pool_;
  std::unique_ptr<engine::TransferRegion> transfer_;  // What the transport reads: the pool or its host mirror.
  kvtransfer::RegionId region_ = 0;
  bool region_registered_ = false;
  std::string region_bytes_;  // ExportRegion(region_), sent in every KvHandle.
  proto::KvLayout layout_;
  // Engine thread only; the tree outlives the scheduler, whose sequences pin it.
  std::unique_ptr<worker::PrefixCache> cache_;
  std::unique_ptr<PrefillScheduler> scheduler_;
  std::unique_ptr<worker::Constraints> constraints_;

  // Shared with callbacks (offer errors) that may outlive the service.
  std::shared_ptr<worker::Inbox<Event>> inbox_;
  std::thread engine_;

  Gauge* waiting_gauge_ = nullptr;
  Gauge* running_gauge_ = nullptr;
  Gauge* usage_gauge_ = nullptr;
  Histogram* queue_time_ = nullptr;
  // Choices (sibling ids) cancelled before their prompt completed.
  std::set<uint64_t> cancelled_siblings_;
  bool IsPendingSibling(uint64_t id) const;
  absl::Mutex stats_mu_;
  proto::WorkerStats stats_ ABSL_GUARDED_BY(stats_mu_);
  uint64_t kv_bytes_moved_ = 0;         // Engine thread only.
  uint64_t last_request_id_ = 0;        // Engine thread only: WorkerStats.last_request_id.
  int64_t kv_blocks_transferred_ = 0;   // Engine thread only.
};

}  // namespace duet::prefill

#endif  // DUET_PREFILL_PREFILL_SERVICE_H_
