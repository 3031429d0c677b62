#include "decode/engine_loop.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "kvtransfer/layout_proto.h"
#include "spec/generation_spec.h"
#include "proto/frame.h"

namespace duet::decode {
namespace {

const char* RoleLabel(proto::Role role) {
  switch (role) {
    case proto::ROLE_DECODE: return "decode";
    case proto::ROLE_COLOCATED: return "colocated";
    case proto::ROLE_PREFILL: return "prefill";
    default: return "unspecified";
  }
}

proto::Token TokenProto(const engine::SampleResult& s) {
  proto::Token t;
  t.set_id(s.token);
  t.set_logprob(s.logprob);
  for (const auto& [id, lp] : s.top_logprobs) {
    proto::TopLogprob* top = t.add_top();
    top->set_id(id);
    top->set_logprob(lp);
  }
  return t;
}

}  // namespace

proto::Frame ErrorFinish(uint64_t request_id, const absl::Status& status) {
  proto::Frame f = proto::NewFrame();
  proto::Finish* fin = f.mutable_finish();
  fin->set_request_id(request_id);
  fin->set_reason(proto::FINISH_ERROR);
  fin->set_error(std::string(status.message()));
  fin->set_error_code(static_cast<int32_t>(status.code()));
  return f;
}

proto::Frame EndFinish(uint64_t request_id, spec::FinishDecision end) {
  proto::Frame f = proto::NewFrame();
  f.mutable_finish()->set_request_id(request_id);
  f.mutable_finish()->set_reason(spec::FinishReasonOf(end));
  return f;
}

absl::StatusOr<GenerationParams> DecodeParams(const proto::GenerationSpec& spec, const spec::ModelConfig& c,
                                              int64_t context_tokens) {
  ASSIGN_OR_RETURN(GenerationParams p, spec::ParamsFromSpec(spec, c));
  // Room for the tokens already in the cache and the next one fed.
  if (context_tokens + 1 > c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("the request has ", context_tokens,
                                                   " tokens; the model's context is ",
                                                   c.max_position_embeddings));
  }
  return p;
}

EngineLoop::EngineLoop(engine::Model* model, engine::BlockPool* pool, KvImporter* importer,
                       worker::FrameSink* sink, EngineLoopOptions options)
    : pool_(pool),
      sink_(sink),
      options_(options),
      worker_id_(sink->worker_id()),
      engine_(model, pool, importer, options.engine) {
  MetricsRegistry& reg = MetricsRegistry::Default();
  const Labels labels = {{"role", RoleLabel(options_.role)}, {"worker", worker_id_}};
  running_gauge_ = reg.GetGauge("duet_requests_running", "Requests running (holding KV blocks)", labels);
  waiting_gauge_ = reg.GetGauge("duet_requests_waiting", "Requests queued for admission", labels);
  usage_gauge_ = reg.GetGauge("duet_kv_cache_usage_ratio", "Fraction of KV blocks in use", labels);
  Publish(engine_);
  thread_ = std::thread([this] { Run(); });
}

EngineLoop::~EngineLoop() { Stop(); }

bool EngineLoop::HandleCommonFrame(const proto::Frame& frame, absl::FunctionRef<proto::WorkerStats()> stats) {
  switch (frame.msg_case()) {
    case proto::Frame::kCancel: {
      const uint64_t id = frame.cancel().request_id();
      Post([id](BatchEngine& e) { e.Cancel(id); });
      return true;
    }
    case proto::Frame::kStatsRequest: {
      proto::Frame f = proto::NewFrame();
      *f.mutable_stats() = stats();
      sink_->SendToRouter(f);
      return true;
    }
    default:
      return false;
  }
}

void EngineLoop::Post(Command command) { inbox_.Post(std::move(command)); }

void EngineLoop::Sync() {
  auto done = std::make_shared<absl::Notification>();
  // Stats show what the commands before it did.
  const bool posted = inbox_.Post([this, done](BatchEngine& e) {
    Publish(e);
    done->Notify();
  });
  if (posted) done->WaitForNotification();
}

void EngineLoop::Stop() {
  if (!inbox_.Stop()) return;
  if (thread_.joinable()) thread_.join();
}

proto::WorkerStats EngineLoop::Stats() const {
  proto::WorkerStats s;
  s.set_worker_id(worker_id_);
  s.set_role(options_.role);
  s.set_kv_blocks_total(pool_->num_blocks());
  absl::MutexLock lock(&mu_);
  s.set_kv_blocks_free(kv_blocks_free_);
  s.set_prefix_cache_blocks(prefix_cache_blocks_);
  const EngineCounts& c = counts_;
  s.set_queued_requests(c.waiting + c.pulling);
  s.set_running_requests(c.prefilling + c.running);
  s.set_queued_prefill_tokens(c.queued_prefill_tokens);
  s.set_prompt_tokens_computed(c.prompt_tokens_computed);
  s.set_preemptions(c.preemptions);
  s.set_last_request_id(c.last_request_id);
  return s;
}

void EngineLoop::Publish(const BatchEngine& engine) {
  EngineCounts c = engine.counts();
  running_gauge_->Set(static_cast<double>(c.prefilling + c.running));
  waiting_gauge_->Set(static_cast<double>(c.waiting + c.pulling));
  const int64_t total = pool_->num_blocks();
  // Blocks only the prefix cache holds are free for the taking.
  const int64_t free = options_.cache != nullptr ? options_.cache->AvailableBlocks() : pool_->num_free();
  usage_gauge_->Set(total == 0 ? 0.0 : 1.0 - static_cast<double>(free) / total);
  if (options_.cache != nullptr) {
    options_.cache->Publish(c.cache_query_tokens, c.cache_hit_tokens[0], c.cache_hit_tokens[1]);
    // The router's index of where prefixes are cached.
    if (proto::Frame f = proto::NewFrame(); options_.cache->TakeEvents(f.mutable_cache_events())) sink_->SendToRouter(f);
  }
  absl::MutexLock lock(&mu_);
  counts_ = c;
  kv_blocks_free_ = free;
  prefix_cache_blocks_ = options_.cache != nullptr ? options_.cache->device_blocks() : 0;
}

void EngineLoop::Emit(StepResult& r) {
  proto::Frame batch = proto::NewFrame();
  for (TokenOut& t : r.tokens) {
    if (t.first) {
      proto::Frame f = proto::NewFrame();
      f.mutable_first_token()->set_request_id(t.request_id);
      *f.mutable_first_token()->mutable_token() = TokenProto(t.sample);
      f.mutable_first_token()->set_worker_id(worker_id_);
      f.mutable_first_token()->set_cached_tokens(t.cached_tokens);
      sink_->SendToRouter(f);
      continue;
    }
    proto::TokenEvent* e = batch.mutable_tokens()->add_events();
    e->set_request_id(t.request_id);
    *e->mutable_token() = TokenProto(t.sample);
  }
  if (batch.tokens().events_size() > 0) sink_->SendToRouter(batch);
  for (FinishOut& fin : r.finishes) {
    if (fin.kind == FinishKind::kError) {
      LOG(WARNING) << "request " << fin.request_id << " failed: " << fin.error;
      sink_->SendToRouter(ErrorFinish(fin.request_id, fin.error));
      continue;
    }
    proto::Frame f = proto::NewFrame();
    f.mutable_finish()->set_request_id(fin.request_id);
    f.mutable_finish()->set_reason(fin.kind == FinishKind::kStop ? proto::FINISH_STOP : proto::FINISH_LENGTH);
    sink_->SendToRouter(f);
  }
}

void EngineLoop::Run() {
  // How long to wait for commands before the next step: not at all while
  // the engine computes, a poll interval while only pulls are in flight,
  // until a command arrives when there is nothing to do.
  absl::Duration wait = absl::InfiniteDuration();
  std::vector<Command> commands;
  while (inbox_.Take(wait, &commands)) {
    for (Command& c : commands) c(engine_);
    StepResult r;
    if (engine_.HasWork()) r = engine_.Step();
    // Counts first, frames second: whoever reacts to a frame sees its effect.
    Publish(engine_);
    Emit(r);
    if (r.ran_forward || !r.finishes.empty()) {
      wait = absl::ZeroDuration();
    } else if (engine_.counts().pulling > 0) {
      wait = options_.poll_interval;
    } else {
      wait = absl::InfiniteDuration();
    }
  }
  // Shutdown: nothing may still write the pool once the service frees it.
  for (Command& c : inbox_.Drain()) c(engine_);  // Sync waiters must not hang.
  engine_.DropAll();
  Publish(engine_);
}

}  // namespace duet::decode
