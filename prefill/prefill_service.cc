#include "prefill/prefill_service.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "spec/generation.h"
#include "engine/sampler.h"
#include "kvtransfer/layout_proto.h"
#include "prefill/request.h"
#include "spec/generation_spec.h"
#include "proto/frame.h"

namespace duet::prefill {

// What the io thread (and offer-error callbacks) hand to the engine thread,
// applied in arrival order so that a Cancel never overtakes its request.
struct PrefillService::Event {
  enum class Kind { kRequest, kCancel, kReleased, kOfferFailed, kRouterLost, kResetCache, kCacheSnapshot };
  Kind kind;
  uint64_t request_id = 0;
  proto::PrefillRequest request;  // kRequest
  spec::GenerationParams params;  // kRequest
  bool pulled = false;            // kReleased
  std::string decode_address;     // kOfferFailed
  absl::Status error;             // kOfferFailed
};

namespace {

const char* const kRole = "prefill";

}  // namespace

absl::StatusOr<std::unique_ptr<PrefillService>> PrefillService::Create(PrefillServiceOptions options,
                                                                       worker::FrameSink* sink) {
  if (sink == nullptr) return absl::InvalidArgumentError("PrefillService needs a FrameSink");
  std::unique_ptr<PrefillService> svc(new PrefillService(std::move(options), sink));
  RETURN_IF_ERROR(svc->Init());
  return svc;
}

PrefillService::PrefillService(PrefillServiceOptions options, worker::FrameSink* sink)
    : options_(std::move(options)),
      sink_(sink),
      worker_id_(sink->worker_id()),
      inbox_(std::make_shared<worker::Inbox<Event>>()) {}

absl::Status PrefillService::Init() {
  if (options_.transport == nullptr) return absl::InvalidArgumentError("PrefillService needs a KV transport");
  if (options_.max_queued_requests < 0) return absl::InvalidArgumentError("max_queued_requests must be >= 0");
  if (options_.lease_duration <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the lease duration must be positive");
  }
  if (options_.clock == nullptr) options_.clock = RealClock();
  options_.engine.served_model_name = options_.engine.ServedName();
  ASSIGN_OR_RETURN(worker::EngineResources r, worker::LoadEngine(options_.engine));
  loaded_ = std::move(r.loaded);
  pool_ = std::move(r.pool);
  const int64_t blocks = pool_->num_blocks();
  kvtransfer::KvTransport& t = *options_.transport;
  ASSIGN_OR_RETURN(transfer_, engine::TransferRegion::For(pool_.get()));
  ASSIGN_OR_RETURN(region_, t.RegisterRegion(transfer_->base(), transfer_->bytes(), blocks));
  region_registered_ = true;
  ASSIGN_OR_RETURN(region_bytes_, t.ExportRegion(region_));

  layout_ = kvtransfer::WholeModelLayout(pool_->layout());

  if (options_.reorder_window < 0) return absl::InvalidArgumentError("reorder_window must be >= 0");
  constraints_ = std::make_unique<worker::Constraints>(options_.engine.model_dir, model()->config().eos_token_ids,
                                                       "prefill");
  ASSIGN_OR_RETURN(cache_, worker::PrefixCache::Create(options_.engine.cache, pool_.get(), options_.engine.model_dir,
                                                      model()->config()));
  scheduler_ = std::make_unique<PrefillScheduler>(
      SchedulerOptions{.max_batch_tokens = options_.engine.token_budget,
                       .max_queued_requests = options_.max_queued_requests,
                       .lease_duration = options_.lease_duration,
                       .cache = cache_->tree(),
                       .reorder_window = options_.reorder_window},
      pool_.get(), options_.transport.get(), region_, options_.clock);

  MetricsRegistry& m = MetricsRegistry::Default();
  const Labels labels = {{"role", kRole}, {"worker", worker_id_}};
  waiting_gauge_ = m.GetGauge("duet_requests_waiting", "Requests waiting to be scheduled", labels);
  running_gauge_ = m.GetGauge("duet_requests_running", "Requests being computed", labels);
  usage_gauge_ = m.GetGauge("duet_kv_cache_usage_ratio", "Fraction of KV blocks in use", labels);
  queue_time_ = m.GetHistogram("duet_request_queue_time_seconds", "Time from arrival to scheduling",
                               {{"role", kRole}}, LatencyBucketsSeconds());
  PublishStats();
  engine_ = std::thread([this] { EngineLoop(); });
  LOG(INFO) << "prefill " << worker_id_ << ": " << options_.engine.served_model_name << ", " << blocks
            << " KV blocks of " << options_.engine.block_size << " tokens, budget " << options_.engine.token_budget
            << " tokens/step, transport " << t.Name();
  return absl::OkStatus();
}

PrefillService::~PrefillService() {
  inbox_->Stop();
  if (engine_.joinable()) engine_.join();
  // Leases end (epochs bumped) and blocks return before the pool's memory
  // leaves the transport.
  scheduler_.reset();
  if (cache_ != nullptr) LOG(INFO) << "prefill " << worker_id_ << ": " << cache_->Summary();
  cache_.reset();
  if (region_registered_) {
    absl::Status s = options_.transport->DeregisterRegion(region_);
    if (!s.ok()) LOG(WARNING) << "deregistering the KV pool: " << s;
  }
}

worker::RegistrationInfo PrefillService::Registration() {
  worker::RegistrationInfo info;
  info.role = proto::ROLE_PREFILL;
  info.model = options_.engine.served_model_name;
  info.data_address = options_.transport->address();
  info.transport = options_.transport->Name();
  info.kv_blocks_total = pool_->num_blocks();
  info.layout = layout_;
  info.max_model_len = model()->config().max_position_embeddings;
  return info;
}

void PrefillService::SendFinish(uint64_t id, proto::FinishReason reason, const absl::Status& error) {
  proto::Frame f = proto::NewFrame();
  proto::Finish* fin = f.mutable_finish();
  fin->set_request_id(id);
  fin->set_reason(reason);
  if (!error.ok()) {
    fin->set_error(std::string(error.message()));
    fin->set_error_code(static_cast<int32_t>(error.code()));
  }
  sink_->SendToRouter(f);
}

void PrefillService::OnFrame(const rpc::ConnectionPtr& from, proto::Frame frame) {
  switch (frame.msg_case()) {
    case proto::Frame::kPrefill: {
      const proto::PrefillRequest& r = frame.prefill();
      absl::StatusOr<AcceptedRequest> accepted = AcceptPrefillRequest(r, model()->config());
      if (!accepted.ok()) {
        LOG(WARNING) << "request " << r.request_id() << " rejected: " << accepted.status();
        SendFinish(r.request_id(), proto::FINISH_ERROR, accepted.status());
        return;
      }
      if (accepted->end != spec::FinishDecision::kContinue) {
        SendFinish(r.request_id(), spec::FinishReasonOf(accepted->end));
        return;
      }
      // Compiled here, off the engine thread: the first token finds it cached.
      if (absl::Status g = constraints_->Check(r.spec(), r.resume_ids()); !g.ok()) {
        LOG(WARNING) << "request " << r.request_id() << " rejected: " << g;
        SendFinish(r.request_id(), proto::FINISH_ERROR, g);
        return;
      }
      Event e{.kind = Event::Kind::kRequest, .request_id = r.request_id()};
      e.request = std::move(*frame.mutable_prefill());
      e.params = std::move(accepted->params);
      Post(std::move(e));
      return;
    }
    case proto::Frame::kCancel:
      Post(Event{.kind = Event::Kind::kCancel, .request_id = frame.cancel().request_id()});
      return;
    case proto::Frame::kKvReleased:
      Post(Event{.kind = Event::Kind::kReleased,
                 .request_id = frame.kv_released().request_id(),
                 .pulled = frame.kv_released().pulled()});
      return;
    case proto::Frame::kResetPrefixCache:
      Post(Event{.kind = Event::Kind::kResetCache});
      return;
    case proto::Frame::kCacheSnapshotRequest:
      Post(Event{.kind = Event::Kind::kCacheSnapshot});
      return;
    case proto::Frame::kStatsRequest: {
      proto::Frame reply = proto::NewFrame();
      *reply.mutable_stats() = Stats();
      if (from != nullptr) {
        from->Send(reply);
      } else {
        sink_->SendToRouter(reply);
      }
      return;
    }
    default:
      LOG(WARNING) << "prefill " << worker_id_ << ": ignoring an unexpected frame (case "
                   << frame.msg_case() << ")";
  }
}

void PrefillService::OnRouterLost() { Post(Event{.kind = Event::Kind::kRouterLost}); }

void PrefillService::Post(Event event) { inbox_->Post(std::move(event)); }

void PrefillService::EngineLoop() {
  // Leases must end on time even when no frame arrives.
  constexpr absl::Duration kExpiryPeriod = absl::Milliseconds(100);
  bool idle = false;
  std::vector<Event> events;
  while (inbox_->Take(idle ? kExpiryPeriod : absl::ZeroDuration(), &events)) {
    for (Event& e : events) Handle(e);
    scheduler_->ExpireDue();
    Step step = scheduler_->Schedule();
    idle = step.empty();
    if (!idle) {
      PublishStats();  // So /stats shows the step while it runs.
      RunStep(step);
    }
    PublishStats();
  }
}

void PrefillService::Handle(Event& e) {
  switch (e.kind) {
    case Event::Kind::kRequest: {
      const uint64_t id = e.request_id;
      last_request_id_ = std::max(last_request_id_, id);  // Taken in, queued or refused.
      absl::Status s = scheduler_->Enqueue(std::move(e.request), std::move(e.params));
      if (!s.ok()) {
        LOG(WARNING) << "request " << id << " rejected: " << s;
        SendFinish(id, proto::FINISH_ERROR, s);
      }
      return;
    }
    case Event::Kind::kCancel:
      if (!scheduler_->Cancel(e.request_id) && IsPendingSibling(e.request_id)) {
        // A choice not forked yet: it is skipped when its prompt completes.
        cancelled_siblings_.insert(e.request_id);
      }
      return;
    case Event::Kind::kReleased: {
      const int64_t blocks = scheduler_->Release(e.request_id);
      if (e.pulled && blocks > 0) {
        kv_blocks_transferred_ += blocks;
        kv_bytes_moved_ += static_cast<uint64_t>(blocks * pool_->block_bytes());
      }
      return;
    }
    case Event::Kind::kOfferFailed:
      // Only a request still leased here: the same callback may fire late,
      // when a connection that carried long-released offers drops.
      if (scheduler_->CancelLease(e.request_id)) {
        LOG(WARNING) << "request " << e.request_id << ": decode " << e.decode_address
                     << " unreachable: " << e.error;
        SendFinish(e.request_id, proto::FINISH_ERROR,
                   absl::UnavailableError(absl::StrCat("decode ", e.decode_address, " unreachable: ",
                                                       e.error.message())));
      }
      return;
    case Event::Kind::kResetCache:
      LOG(INFO) << "prefill " << worker_id_ << ": prefix cache reset, " << cache_->Reset() << " blocks dropped";
      return;
    case Event::Kind::kCacheSnapshot:
      cache_->RequestSnapshot();
      return;
    case Event::Kind::kRouterLost: {
      const auto dropped = scheduler_->DropUnleased();
      last_request_id_ = 0;  // A new router numbers its requests afresh.
      if (!dropped.empty()) LOG(WARNING) << "router lost: dropped " << dropped.size() << " requests";
      return;
    }
  }
}

void PrefillService::RunStep(const Step& step) {
  for (absl::Duration d : step.queue_times) queue_time_->Observe(absl::ToDoubleSeconds(d));
  std::vector<engine::BatchSeq> batch;
  batch.reserve(step.chunks.size());
  for (const Step::Chunk& c : step.chunks) {
    engine::BatchSeq b{.tokens = c.tokens, .start_pos = c.start_pos, .block_table = c.block_table};
    if (c.last) b.logit_rows = {static_cast<int32_t>(c.tokens.size() - 1)};
    batch.push_back(std::move(b));
  }
  absl::StatusOr<engine::Logits> logits = model()->Forward(batch, *pool_);
  if (!logits.ok()) {
    LOG(ERROR) << "prefill step of " << step.chunks.size() << " sequences failed: " << logits.status();
    for (uint64_t id : scheduler_->Fail(step)) {
      SendFinish(id, proto::FINISH_ERROR,
                 absl::InternalError(absl::StrCat("prefill failed: ", logits.status().message())));
    }
    return;
  }
  // Logit rows come in batch order, one per last chunk: the order Complete returns.
  const std::vector<uint64_t> done = scheduler_->Complete(step);
  for (size_t i = 0; i < done.size(); ++i) {
    // The other choices of an n > 1 request share this prompt's blocks and
    // logits: forked before the first choice's token can end it.
    std::vector<uint64_t> choices = {done[i]};
    const PrefillSequence* s = scheduler_->Find(done[i]);
    if (s != nullptr && s->request.sibling_request_ids_size() > 0) {
      const proto::PrefillRequest parent = s->request;
      for (int k = 0; k < parent.sibling_request_ids_size(); ++k) {
        const uint64_t sib = parent.sibling_request_ids(k);
        if (cancelled_siblings_.erase(sib) > 0) continue;
        proto::PrefillRequest r = parent;
        r.clear_sibling_request_ids();
        r.set_request_id(sib);
        r.mutable_spec()->set_choice_index(parent.spec().choice_index() + static_cast<uint32_t>(k) + 1);
        absl::Status forked = scheduler_->Fork(done[i], std::move(r));
        if (!forked.ok()) {
          LOG(WARNING) << "request " << sib << " (a choice of " << done[i] << "): " << forked;
          SendFinish(sib, proto::FINISH_ERROR,
                     absl::UnavailableError(absl::StrCat("cannot share the prompt's KV: ", forked.message())));
          continue;
        }
        choices.push_back(sib);
      }
    }
    for (uint64_t id : choices) HandleFirstToken(id, *logits, static_cast<int64_t>(i));
  }
}

bool PrefillService::IsPendingSibling(uint64_t id) const { return scheduler_->IsPendingSibling(id); }

void PrefillService::HandleFirstToken(uint64_t id, const engine::Logits& logits, int64_t row) {
  const PrefillSequence* s = scheduler_->Find(id);
  CHECK(s != nullptr) << "completed request " << id << " vanished";
  const spec::GenerationParams& params = s->params;
  // Position = tokens before the sampled one, as engine::Generate keys it.
  // Tokens already generated (a resumed request) count for penalties.
  const absl::Span<const int32_t> resumed =
      absl::MakeConstSpan(s->request.resume_ids().data(), s->request.resume_ids().size());
  // The grammar, after any resumed tokens, masks the first token; the decode
  // worker rebuilds it from the tokens it is handed.
  absl::StatusOr<std::unique_ptr<grammar::TokenConstraint>> constraint = constraints_->For(s->request.spec(), resumed);
  absl::Span<const uint64_t> allowed;
  if (constraint.ok() && *constraint != nullptr) {
    const absl::Time mask_start = absl::Now();
    allowed = (*constraint)->Mask();
    if (!allowed.empty()) constraints_->mask_seconds()->Observe(absl::ToDoubleSeconds(absl::Now() - mask_start));
  }
  const engine::SampleResult r =
      engine::Sample(logits.row(row), logits.vocab_size, params.sampling, params.choice_index, s->num_tokens(),
                     resumed, allowed);
  if (constraint.ok() && *constraint != nullptr && r.token < 0 && (*constraint)->ended()) {
    SendFinish(id, proto::FINISH_STOP);  // Its resumed tokens ended the grammar: nothing may follow.
    scheduler_->Finish(id);
    return;
  }
  if (!constraint.ok() || r.token < 0) {
    const absl::Status why =
        !constraint.ok() ? constraint.status()
                         : absl::InternalError("the request's grammar allows no first token");
    LOG(WARNING) << "request " << id << ": " << why;
    SendFinish(id, proto::FINISH_ERROR, why);
    scheduler_->Finish(id);
    return;
  }
  proto::Token token;
  token.set_id(r.token);
  token.set_logprob(r.logprob);
  if (params.sampling.logprobs > 0) {
    for (const auto& [tid, lp] : r.top_logprobs) {
      proto::TopLogprob* t = token.add_top();
      t->set_id(tid);
      t->set_logprob(lp);
    }
  }
  proto::Frame f = proto::NewFrame();
  proto::FirstToken* ft = f.mutable_first_token();
  ft->set_request_id(id);
  *ft->mutable_token() = token;
  ft->set_worker_id(worker_id_);
  // What usage reports as cached: prompt tokens, not resumed ones.
  ft->set_cached_tokens(std::min<int64_t>(s->cached.tokens, s->request.spec().prompt_ids_size()));
  sink_->SendToRouter(f);

  switch (DecideFirstTokenEnd(s->request, params, model()->config(), r.token)) {
    case spec::FinishDecision::kStop:
      SendFinish(id, proto::FINISH_STOP);
      scheduler_->Finish(id);
      return;
    case spec::FinishDecision::kLength:
      SendFinish(id, proto::FINISH_LENGTH);
      scheduler_->Finish(id);
      return;
    case spec::FinishDecision::kContinue:
      Offer(id, token);
      return;
  }
}

void PrefillService::Offer(uint64_t id, const proto::Token& token) {
  absl::StatusOr<kvtransfer::LeaseTable::Lease> lease = scheduler_->Lease(id);
  if (!lease.ok()) {
    LOG(ERROR) << "request " << id << ": cannot lease its blocks: " << lease.status();
    SendFinish(id, proto::FINISH_ERROR,
               absl::InternalError(absl::StrCat("cannot lease KV blocks: ", lease.status().message())));
    scheduler_->Finish(id);
    return;
  }
  std::vector<int32_t> leased;
  for (const auto& [block, epoch] : lease->block_epochs) leased.push_back(block);
  if (absl::Status staged = transfer_->Stage(leased); !staged.ok()) {
    LOG(ERROR) << "request " << id << ": cannot stage its KV for transfer: " << staged;
    SendFinish(id, proto::FINISH_ERROR,
               absl::InternalError(absl::StrCat("cannot stage KV for transfer: ", staged.message())));
    scheduler_->CancelLease(id);
    return;
  }
  const PrefillSequence* s = scheduler_->Find(id);
  proto::Frame f = proto::NewFrame();
  proto::KvOffer* offer = f.mutable_kv_offer();
  offer->set_request_id(id);
  *offer->mutable_spec() = s->request.spec();
  *offer->mutable_generated_ids() = s->request.resume_ids();
  offer->add_generated_ids(token.id());
  proto::KvHandle* h = offer->mutable_handle();
  h->set_worker_id(worker_id_);
  h->set_control_address(sink_->control_address());
  h->set_data_address(options_.transport->address());
  h->set_region(region_bytes_);
  for (const auto& [block, epoch] : lease->block_epochs) {
    h->add_block_ids(block);
    h->add_block_epochs(epoch);
  }
  *h->mutable_layout() = layout_;
  h->set_lease_ms(absl::ToInt64Milliseconds(options_.lease_duration));
  h->set_num_tokens(s->num_tokens());

  const std::string address = s->request.decode_address();
  std::weak_ptr<worker::Inbox<Event>> weak = inbox_;
  sink_->SendToPeer(address, f, [weak, id, address](absl::Status error) {
    std::shared_ptr<worker::Inbox<Event>> inbox = weak.lock();
    if (inbox == nullptr) return;  // The service is gone; its leases ended with it.
    inbox->Post(Event{.kind = Event::Kind::kOfferFailed,
                      .request_id = id,
                      .decode_address = address,
                      .error = std::move(error)});
  });
}

void PrefillService::PublishStats() {
  proto::WorkerStats s;
  s.set_worker_id(worker_id_);
  s.set_role(proto::ROLE_PREFILL);
  s.set_kv_blocks_total(pool_->num_blocks());
  s.set_kv_blocks_free(cache_->AvailableBlocks());
  s.set_queued_requests(scheduler_->num_queued());
  s.set_running_requests(scheduler_->num_running());
  s.set_queued_prefill_tokens(scheduler_->queued_prefill_tokens());
  s.set_prompt_tokens_computed(scheduler_->prompt_tokens_computed());
  s.set_kv_bytes_moved(kv_bytes_moved_);
  s.set_kv_blocks_transferred(kv_blocks_transferred_);
  s.set_leased_blocks(scheduler_->leased_blocks());
  s.set_prefix_cache_blocks(cache_->device_blocks());
  s.set_last_request_id(last_request_id_);
  cache_->Publish(scheduler_->cache_query_tokens(), scheduler_->cache_hit_tokens(kvcache::Tier::kDevice),
                  scheduler_->cache_hit_tokens(kvcache::Tier::kHost));
  // The router's index of where prefixes are cached.
  if (proto::Frame f = proto::NewFrame(); cache_->TakeEvents(f.mutable_cache_events())) {
    sink_->SendToRouter(f);
  }
  waiting_gauge_->Set(static_cast<double>(s.queued_requests()));
  running_gauge_->Set(static_cast<double>(s.running_requests()));
  usage_gauge_->Set(1.0 - static_cast<double>(s.kv_blocks_free()) / static_cast<double>(s.kv_blocks_total()));
  absl::MutexLock lock(&stats_mu_);
  stats_ = std::move(s);
}

proto::WorkerStats PrefillService::Stats() {
  absl::MutexLock lock(&stats_mu_);
  return stats_;
}

bool PrefillService::WaitForStats(const std::function<bool(const proto::WorkerStats&)>& pred,
                                  absl::Duration timeout) {
  struct Ctx {
    const std::function<bool(const proto::WorkerStats&)>* pred;
    const proto::WorkerStats* stats;
  } ctx{&pred, nullptr};
  absl::MutexLock lock(&stats_mu_);
  ctx.stats = &stats_;
  return stats_mu_.AwaitWithTimeout(
      absl::Condition(+[](Ctx* c) { return (*c->pred)(*c->stats); }, &ctx), timeout);
}

}  // namespace duet::prefill
