#include "decode/decode_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "kvtransfer/layout_proto.h"
#include "proto/frame.h"
#include "spec/generation_spec.h"

namespace duet::decode {
namespace {

void SendReleased(worker::FrameSink* sink, uint64_t request_id, const std::string& address) {
  if (address.empty()) return;
  proto::Frame f = proto::NewFrame();
  f.mutable_kv_released()->set_request_id(request_id);
  f.mutable_kv_released()->set_pulled(false);
  sink->SendToPeer(address, f, [request_id, address](absl::Status s) {
    LOG(WARNING) << "cannot release request " << request_id << " to prefill " << address << ": " << s;
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<DecodeService>> DecodeService::Create(DecodeOptions options,
                                                                     worker::FrameSink* sink) {
  if (options.transport == nullptr) return absl::InvalidArgumentError("decode needs a KV transport");
  if (sink == nullptr) return absl::InvalidArgumentError("decode needs a frame sink");
  std::unique_ptr<DecodeService> s(new DecodeService());
  options.engine.served_model_name = options.engine.ServedName();
  ASSIGN_OR_RETURN(s->engine_, worker::LoadEngine(options.engine));
  s->sink_ = sink;
  s->transport_ = std::move(options.transport);
  s->options_ = std::move(options);
  engine::BlockPool& pool = *s->engine_.pool;
  // The pool (or its host mirror) is a pull destination only: no epochs
  // (those guard exports).
  ASSIGN_OR_RETURN(s->transfer_, engine::TransferRegion::For(&pool));
  ASSIGN_OR_RETURN(s->region_, s->transport_->RegisterRegion(s->transfer_->base(), s->transfer_->bytes(), 0));
  s->layout_ = kvtransfer::WholeModelLayout(pool.layout());
  s->puller_ = std::make_unique<KvPuller>(KvPuller::Options{.transport = s->transport_.get(),
                                                            .local_region = s->region_,
                                                            .local_layout = s->layout_,
                                                            .timeout = s->options_.pull_timeout,
                                                            .sink = sink,
                                                            .landing = s->transfer_.get()});
  s->constraints_ = std::make_unique<worker::Constraints>(
      s->options_.engine.model_dir, s->engine_.model()->config().eos_token_ids,
      "decode");
  s->loop_ = std::make_unique<EngineLoop>(
      s->engine_.model(), &pool, s->puller_.get(), sink,
      EngineLoopOptions{.role = proto::ROLE_DECODE,
                        .engine = {.max_running = s->options_.max_running,
                                   .token_budget = s->options_.engine.token_budget,
                                   .mask_seconds = s->constraints_->mask_seconds()},
                        .poll_interval = s->options_.poll_interval});
  LOG(INFO) << "decode worker " << sink->worker_id() << ": " << pool.num_blocks() << " KV blocks of "
            << s->options_.engine.block_size << " tokens, transport " << s->transport_->Name();
  return s;
}

DecodeService::~DecodeService() {
  // The loop abandons every pull (waiting for transfers to end) before the
  // pool's region goes away.
  if (loop_) loop_->Stop();
  loop_.reset();
  puller_.reset();
  if (transport_) {
    absl::Status s = transport_->DeregisterRegion(region_);
    if (!s.ok()) LOG(WARNING) << "deregistering the KV pool: " << s;
  }
}

worker::RegistrationInfo DecodeService::Registration() {
  return {.role = proto::ROLE_DECODE,
          .model = options_.engine.served_model_name,
          .data_address = transport_->address(),
          .transport = transport_->Name(),
          .kv_blocks_total = engine_.pool->num_blocks(),
          .layout = layout_,
          .max_model_len = engine_.model()->config().max_position_embeddings};
}

proto::WorkerStats DecodeService::Stats() {
  proto::WorkerStats s = loop_->Stats();
  s.set_kv_bytes_moved(puller_->bytes_moved());
  s.set_kv_blocks_transferred(puller_->blocks_transferred());
  return s;
}

void DecodeService::OnFrame(const rpc::ConnectionPtr&, proto::Frame frame) {
  if (loop_->HandleCommonFrame(frame, [this] { return Stats(); })) return;
  switch (frame.msg_case()) {
    case proto::Frame::kKvOffer:
      HandleOffer(std::move(*frame.mutable_kv_offer()));
      return;
    case proto::Frame::kPrefill:
      sink_->SendToRouter(ErrorFinish(frame.prefill().request_id(),
                                      absl::FailedPreconditionError("this is a decode worker; it does not prefill")));
      return;
    default:
      LOG(WARNING) << "decode worker ignores an unexpected frame (case " << frame.msg_case() << ")";
  }
}

void DecodeService::HandleOffer(proto::KvOffer offer) {
  const uint64_t id = offer.request_id();
  const proto::KvHandle& h = offer.handle();
  const spec::ModelConfig& c = engine_.model()->config();
  absl::Status valid = kvtransfer::CheckHandle(h, layout_);
  if (valid.ok() && offer.generated_ids_size() == 0) {
    valid = absl::InvalidArgumentError("KvOffer: no generated token to continue from");
  }
  if (valid.ok()) valid = spec::CheckTokenIds(offer.generated_ids(), "generated_ids", c.vocab_size);
  const int64_t tokens = offer.spec().prompt_ids_size() + offer.generated_ids_size() - 1;
  if (valid.ok() && h.num_tokens() != tokens) {
    valid = absl::InvalidArgumentError(absl::StrCat("KV handle: num_tokens is ", h.num_tokens(),
                                                    "; prompt plus generated tokens before the last is ", tokens));
  }
  // A handle this worker cannot take is the cluster's fault (pools built with
  // different layouts or KV dtypes, a prefill worker's bug), not the
  // client's: Internal, a 500, not a 400.
  if (!valid.ok()) valid = absl::InternalError(valid.message());
  absl::StatusOr<GenerationParams> params =
      valid.ok() ? DecodeParams(offer.spec(), c, tokens) : absl::StatusOr<GenerationParams>(valid);
  if (!params.ok()) {
    LOG(WARNING) << "refusing the KvOffer of request " << id << ": " << params.status();
    sink_->SendToRouter(ErrorFinish(id, params.status()));
    SendReleased(sink_, id, h.control_address());
    return;
  }
  // The last token already ended the request (a prefill would normally
  // have finished it): the one finish rule, not a guard of this worker's.
  const spec::FinishDecision end =
      spec::ResumedEnd(*params, c, offer.spec().prompt_ids_size(), offer.generated_ids());
  if (end != spec::FinishDecision::kContinue) {
    sink_->SendToRouter(EndFinish(id, end));
    SendReleased(sink_, id, h.control_address());
    return;
  }
  absl::StatusOr<std::unique_ptr<grammar::TokenConstraint>> constraint = constraints_->For(offer.spec(), offer.generated_ids());
  if (!constraint.ok()) {
    LOG(WARNING) << "refusing request " << id << ": " << constraint.status();
    sink_->SendToRouter(ErrorFinish(id, constraint.status()));
    SendReleased(sink_, id, h.control_address());
    return;
  }
  SequenceRequest r{.request_id = id,
                    .prompt = {offer.spec().prompt_ids().begin(), offer.spec().prompt_ids().end()},
                    .params = std::move(*params),
                    .generated = {offer.generated_ids().begin(), offer.generated_ids().end()},
                    .import_kv = true,
                    .constraint = std::move(*constraint)};
  auto handle = std::make_shared<proto::KvHandle>(std::move(*offer.mutable_handle()));
  loop_->Post([this, r = std::move(r), handle](BatchEngine& e) mutable {
    const uint64_t id = r.request_id;
    if (e.Contains(id)) {
      // A duplicate must not disturb the request already here.
      LOG(WARNING) << "a second KvOffer for request " << id << "; releasing it";
      SendReleased(sink_, id, handle->control_address());
      return;
    }
    puller_->Track(id, std::move(*handle));
    absl::Status added = e.Add(std::move(r));
    if (added.ok()) return;
    puller_->Abandon(id);  // Releases the blocks, pulled=false.
    // A request cancelled before its offer arrived is over for the router already.
    if (added.code() != absl::StatusCode::kCancelled) sink_->SendToRouter(ErrorFinish(id, added));
  });
}

void DecodeService::OnRouterLost() {
  loop_->Post([](BatchEngine& e) { e.DropAll(); });
}

}  // namespace duet::decode
