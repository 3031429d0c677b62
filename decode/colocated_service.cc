#include "decode/colocated_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "kvtransfer/layout_proto.h"
#include "spec/generation.h"
#include "spec/generation_spec.h"
#include "proto/frame.h"

namespace duet::decode {

absl::StatusOr<std::unique_ptr<ColocatedService>> ColocatedService::Create(ColocatedOptions options,
                                                                           worker::FrameSink* sink) {
  if (sink == nullptr) return absl::InvalidArgumentError("colocated needs a frame sink");
  std::unique_ptr<ColocatedService> s(new ColocatedService());
  options.engine.served_model_name = options.engine.ServedName();
  ASSIGN_OR_RETURN(s->engine_, worker::LoadEngine(options.engine));
  s->options_ = std::move(options);
  s->sink_ = sink;
  s->layout_ = kvtransfer::WholeModelLayout(s->engine_.pool->layout());
  ASSIGN_OR_RETURN(s->cache_, worker::PrefixCache::Create(s->options_.engine.cache, s->engine_.pool.get(),
                                                          s->options_.engine.model_dir, s->engine_.model()->config()));
  s->constraints_ = std::make_unique<worker::Constraints>(
      s->options_.engine.model_dir, s->engine_.model()->config().eos_token_ids,
      "colocated");
  s->loop_ = std::make_unique<EngineLoop>(
      s->engine_.model(), s->engine_.pool.get(), /*importer=*/nullptr, sink,
      EngineLoopOptions{.role = proto::ROLE_COLOCATED,
                        .engine = {.max_running = s->options_.max_running,
                                   .token_budget = s->options_.engine.token_budget,
                                   .cache = s->cache_->tree(),
                                   .mask_seconds = s->constraints_->mask_seconds()},
                        .cache = s->cache_.get()});
  LOG(INFO) << "colocated worker " << sink->worker_id() << ": " << s->engine_.pool->num_blocks()
            << " KV blocks of " << s->options_.engine.block_size << " tokens, token budget "
            << s->options_.engine.token_budget << ", prefix cache " << (s->cache_->tree() ? "on" : "off");
  return s;
}

ColocatedService::~ColocatedService() {
  if (loop_) loop_->Stop();
  if (cache_) LOG(INFO) << "colocated worker " << sink_->worker_id() << ": " << cache_->Summary();
}

worker::RegistrationInfo ColocatedService::Registration() {
  return {.role = proto::ROLE_COLOCATED,
          .model = options_.engine.served_model_name,
          .kv_blocks_total = engine_.pool->num_blocks(),
          .layout = layout_,
          .max_model_len = engine_.model()->config().max_position_embeddings};
}

void ColocatedService::OnFrame(const rpc::ConnectionPtr&, proto::Frame frame) {
  if (loop_->HandleCommonFrame(frame, [this] { return Stats(); })) return;
  switch (frame.msg_case()) {
    case proto::Frame::kPrefill:
      HandlePrefill(std::move(*frame.mutable_prefill()));
      return;
    case proto::Frame::kCacheSnapshotRequest:
      loop_->Post([this](BatchEngine&) { cache_->RequestSnapshot(); });
      return;
    case proto::Frame::kResetPrefixCache:
      loop_->Post([this](BatchEngine&) {
        LOG(INFO) << "colocated worker " << sink_->worker_id() << ": prefix cache reset, " << cache_->Reset()
                  << " blocks dropped";
      });
      return;
    default:
      LOG(WARNING) << "colocated worker ignores an unexpected frame (case " << frame.msg_case() << ")";
  }
}

void ColocatedService::HandlePrefill(proto::PrefillRequest req) {
  if (req.sibling_request_ids_size() > 0) {
    // Other choices of the prompt: requests of their own here (the engine
    // computes each prompt; only the disaggregated prefill shares it).
    for (int k = 0; k < req.sibling_request_ids_size(); ++k) {
      proto::PrefillRequest r = req;
      r.clear_sibling_request_ids();
      r.set_request_id(req.sibling_request_ids(k));
      r.mutable_spec()->set_choice_index(req.spec().choice_index() + static_cast<uint32_t>(k) + 1);
      HandlePrefill(std::move(r));
    }
    req.clear_sibling_request_ids();
  }
  const uint64_t id = req.request_id();
  const spec::ModelConfig& c = engine_.model()->config();
  const absl::Status valid = spec::CheckTokenIds(req.resume_ids(), "resume_ids", c.vocab_size);
  const int64_t tokens = req.spec().prompt_ids_size() + req.resume_ids_size();
  absl::StatusOr<GenerationParams> params =
      valid.ok() ? DecodeParams(req.spec(), c, tokens) : absl::StatusOr<GenerationParams>(valid);
  if (!params.ok()) {
    LOG(WARNING) << "refusing request " << id << ": " << params.status();
    sink_->SendToRouter(ErrorFinish(id, params.status()));
    return;
  }
  // The client already has every token it asked for, or the last of them
  // ended the request.
  const spec::FinishDecision resumed_end =
      spec::ResumedEnd(*params, c, req.spec().prompt_ids_size(), req.resume_ids());
  if (resumed_end != spec::FinishDecision::kContinue) {
    sink_->SendToRouter(EndFinish(id, resumed_end));
    return;
  }
  absl::StatusOr<std::unique_ptr<grammar::TokenConstraint>> constraint = constraints_->For(req.spec(), req.resume_ids());
  if (!constraint.ok()) {
    LOG(WARNING) << "refusing request " << id << ": " << constraint.status();
    sink_->SendToRouter(ErrorFinish(id, constraint.status()));
    return;
  }
  SequenceRequest r{.request_id = id,
                    .prompt = {req.spec().prompt_ids().begin(), req.spec().prompt_ids().end()},
                    .params = std::move(*params),
                    .generated = {req.resume_ids().begin(), req.resume_ids().end()},
                    .cache_boundaries = {req.spec().cache_boundaries().begin(), req.spec().cache_boundaries().end()},
                    .constraint = std::move(*constraint)};
  loop_->Post([this, r = std::move(r)](BatchEngine& e) mutable {
    const uint64_t id = r.request_id;
    absl::Status added = e.Add(std::move(r));
    if (added.ok()) return;
    LOG(WARNING) << "request " << id << " not queued: " << added;
    // A duplicate must not end the request already here; a request
    // cancelled before it arrived is over for the router already.
    if (added.code() != absl::StatusCode::kAlreadyExists && added.code() != absl::StatusCode::kCancelled) {
      sink_->SendToRouter(ErrorFinish(id, added));
    }
  });
}

void ColocatedService::OnRouterLost() {
  loop_->Post([](BatchEngine& e) { e.DropAll(); });
}

}  // namespace duet::decode
