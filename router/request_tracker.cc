#include "router/request_tracker.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "proto/frame.h"
#include "spec/generation.h"
#include "spec/generation_spec.h"

namespace duet::router {

RequestTracker::RequestTracker(Options options, dispatch::Dispatcher* dispatcher, Workers* workers,
                               Client* client)
    : options_(std::move(options)),
      dispatcher_(dispatcher),
      workers_(workers),
      client_(client),
      next_attempt_id_(options_.first_attempt_id) {}

RequestTracker::ChoicePtr RequestTracker::Find(uint64_t attempt_id) const {
  auto it = attempts_.find(attempt_id);
  return it == attempts_.end() ? nullptr : it->second;
}

void RequestTracker::Track(const ChoicePtr& c, uint64_t id, const dispatch::Assignment& a,
                           WorkerRegistry::Charged charged) {
  c->charged = std::move(charged);
  c->attempts++;
  c->attempt_id = id;
  c->prefill_id = a.prefill_id;
  c->decode_id = a.decode_id;
  c->first_token = false;
  c->decode_heard = false;
  c->held.clear();
  attempts_[id] = c;
}

absl::Status RequestTracker::Start(absl::Span<const ChoicePtr> choices, size_t n) {
  for (size_t first = 0; first < choices.size(); first += n) {
    RETURN_IF_ERROR(StartPrompt(choices.subspan(first, n)));
  }
  return absl::OkStatus();
}

absl::Status RequestTracker::StartPrompt(absl::Span<const ChoicePtr> choices) {
  const proto::GenerationSpec& spec = choices[0]->spec;
  const std::vector<int32_t> tokens(spec.prompt_ids().begin(), spec.prompt_ids().end());
  // The registry may lose the picked worker between LiveLoads and Send; pick again.
  for (int tries = 0; tries < 3; ++tries) {
    auto a = dispatch::Pick(*dispatcher_, workers_->LiveLoads(), {.prompt = tokens});
    if (!a.ok()) return a.status();
    proto::Frame f = proto::NewFrame();
    proto::PrefillRequest* pr = f.mutable_prefill();
    std::vector<uint64_t> ids;
    for (size_t i = 0; i < choices.size(); ++i) ids.push_back(next_attempt_id_++);
    pr->set_request_id(ids[0]);
    *pr->mutable_spec() = spec;
    for (size_t i = 1; i < ids.size(); ++i) pr->add_sibling_request_ids(ids[i]);
    pr->set_decode_worker_id(a->decode_id);
    pr->set_decode_address(a->decode_address);
    if (!workers_->Send(a->prefill_id, f)) continue;
    const WorkerRegistry::Charged charged = workers_->Charge(*a, static_cast<int64_t>(tokens.size()), ids[0]);
    for (size_t i = 0; i < ids.size(); ++i) {
      // The prompt is computed once: the first choice carries the charge.
      Track(choices[i], ids[i], *a, i == 0 ? charged : WorkerRegistry::Charged{});
    }
    return absl::OkStatus();
  }
  return absl::UnavailableError("no live worker accepted the request");
}

absl::Status RequestTracker::StartAttempt(const ChoicePtr& c) {
  if (c->attempts - c->migrations >= options_.max_attempts) {
    return absl::UnavailableError(absl::StrCat("the request failed after ", c->attempts,
                                               " attempts; the last failure: ", c->last_failure));
  }
  const std::vector<int32_t>& resume = c->builder->token_ids();
  std::vector<int32_t> tokens(c->spec.prompt_ids().begin(), c->spec.prompt_ids().end());
  tokens.insert(tokens.end(), resume.begin(), resume.end());
  for (int tries = 0; tries < 3; ++tries) {
    auto a = dispatch::Pick(*dispatcher_, workers_->LiveLoads(), {.prompt = tokens});
    if (!a.ok()) return a.status();
    const uint64_t id = next_attempt_id_++;
    proto::Frame f = proto::NewFrame();
    proto::PrefillRequest* pr = f.mutable_prefill();
    pr->set_request_id(id);
    *pr->mutable_spec() = c->spec;
    pr->mutable_resume_ids()->Assign(resume.begin(), resume.end());
    pr->set_decode_worker_id(a->decode_id);
    pr->set_decode_address(a->decode_address);
    if (!workers_->Send(a->prefill_id, f)) continue;
    Track(c, id, *a, workers_->Charge(*a, static_cast<int64_t>(tokens.size()), id));
    return absl::OkStatus();
  }
  return absl::UnavailableError("no live worker accepted the request");
}

void RequestTracker::Redispatch(const ChoicePtr& c, const std::string& reason, Pending& p) {
  Forget(*c);
  c->last_failure = reason;
  // The client has every token it asked for, or the last of them ended the
  // request (the attempt that sampled it died before its Finish): the one
  // finish rule, as a worker given the resumed tokens would judge them.
  const spec::FinishDecision end = spec::ResumedEnd(spec::ToGenerationParams(c->spec), options_.config,
                                                    c->spec.prompt_ids_size(), c->builder->token_ids());
  if (end != spec::FinishDecision::kContinue) {
    Complete(c, spec::FinishReasonOf(end), p);
    return;
  }
  absl::Status s = StartAttempt(c);
  if (!s.ok()) {
    Fail(c, absl::UnavailableError(absl::StrCat(reason, "; cannot retry: ", s.message())), p);
    return;
  }
  ++redispatches_;
  LOG(INFO) << "re-dispatched a request (" << reason << ") as attempt " << c->attempt_id << " on "
            << c->prefill_id << " -> " << c->decode_id << " with " << c->builder->token_ids().size()
            << " resumed tokens";
}

void RequestTracker::Deliver(const ChoicePtr& c, const proto::Token& token, Pending& p) {
  if (c->done) return;
  if (static_cast<int64_t>(c->builder->token_ids().size()) >= c->spec.max_tokens()) {
    LOG(WARNING) << "attempt " << c->attempt_id << " sent a token past max_tokens; dropped";
    return;
  }
  if (client_->Deliver(*c, token, p)) {
    // A stop string: the choice is complete; the workers stop generating it.
    SendCancel(*c, "");
    Complete(c, proto::FINISH_STOP, p);
  }
}

void RequestTracker::SendCancel(const Choice& c, const std::string& except) {
  proto::Frame f = proto::NewFrame();
  f.mutable_cancel()->set_request_id(c.attempt_id);
  if (c.prefill_id != except) workers_->Send(c.prefill_id, f);
  if (c.decode_id != except && c.decode_id != c.prefill_id) workers_->Send(c.decode_id, f);
}

void RequestTracker::Forget(Choice& c) {
  attempts_.erase(c.attempt_id);
  workers_->Uncharge(c.charged);  // Its prefill will not compute it (or has).
  c.charged = {};
}

void RequestTracker::Drop(const ChoicePtr& c) {
  if (c->done) return;
  c->done = true;
  if (Find(c->attempt_id) == c) SendCancel(*c, "");
  Forget(*c);
}

void RequestTracker::Complete(const ChoicePtr& c, proto::FinishReason reason, Pending& p) {
  Forget(*c);
  if (c->done) return;
  c->done = true;
  client_->Complete(*c, reason, p);
}

void RequestTracker::Fail(const ChoicePtr& c, const absl::Status& status, Pending& p) {
  Forget(*c);
  c->done = true;
  client_->Fail(*c, status, p);
}

void RequestTracker::ApplyFinish(const ChoicePtr& c, const proto::Finish& fin, const std::string& from,
                                 Pending& p) {
  switch (fin.reason()) {
    case proto::FINISH_STOP:
    case proto::FINISH_LENGTH:
      Complete(c, fin.reason(), p);
      return;
    case proto::FINISH_ERROR:
      if (fin.error_code() == static_cast<int>(absl::StatusCode::kUnavailable)) {
        // The KV pull failed (prefill gone, lease expired): prefill again
        // with everything the client already has; it continues seamlessly.
        SendCancel(*c, from);
        Redispatch(c, absl::StrCat("worker ", from, ": ", fin.error()), p);
        return;
      }
      break;
    default:
      break;
  }
  SendCancel(*c, from);
  absl::StatusCode code = fin.reason() == proto::FINISH_ERROR && fin.error_code() > 0 &&
                                  fin.error_code() <= static_cast<int>(absl::StatusCode::kUnauthenticated)
                              ? static_cast<absl::StatusCode>(fin.error_code())
                              : absl::StatusCode::kInternal;
  std::string what = fin.reason() == proto::FINISH_CANCELLED ? "cancelled the request" : "failed the request";
  Fail(c, absl::Status(code, absl::StrCat("worker ", from, " ", what, fin.error().empty() ? "" : ": ", fin.error())),
       p);
}

void RequestTracker::OnFirstToken(const std::string& from, const proto::FirstToken& ft, Pending& p) {
  ChoicePtr c = Find(ft.request_id());
  if (!c || from != c->prefill_id || c->first_token) return;  // Stale or duplicate.
  c->first_token = true;
  workers_->Uncharge(c->charged);
  c->charged = {};
  client_->Cached(*c, ft.cached_tokens());
  Deliver(c, ft.token(), p);
  std::vector<std::variant<proto::Token, proto::Finish>> held;
  held.swap(c->held);
  const uint64_t attempt = c->attempt_id;
  for (auto& e : held) {
    if (Find(attempt) != c) break;  // The choice ended or moved on.
    if (auto* t = std::get_if<proto::Token>(&e)) {
      Deliver(c, *t, p);
    } else {
      ApplyFinish(c, std::get<proto::Finish>(e), c->decode_id, p);
    }
  }
}

void RequestTracker::OnToken(const std::string& from, const proto::TokenEvent& ev, Pending& p) {
  ChoicePtr c = Find(ev.request_id());
  if (!c || from != c->decode_id) return;
  c->decode_heard = true;
  if (!c->first_token) {
    c->held.emplace_back(ev.token());
    return;
  }
  Deliver(c, ev.token(), p);
}

void RequestTracker::OnFinish(const std::string& from, const proto::Finish& fin, Pending& p) {
  ChoicePtr c = Find(fin.request_id());
  if (!c || (from != c->prefill_id && from != c->decode_id)) return;
  if (from == c->decode_id) c->decode_heard = true;
  if (!c->first_token && from != c->prefill_id) {
    c->held.emplace_back(fin);
    return;
  }
  ApplyFinish(c, fin, from, p);
}

int64_t RequestTracker::AttemptsOn(const std::string& worker_id) const {
  int64_t n = 0;
  for (const auto& [id, c] : attempts_) n += c->prefill_id == worker_id || c->decode_id == worker_id;
  return n;
}

void RequestTracker::OnWorkerLost(const std::string& worker_id, const std::string& reason, Pending& p) {
  std::vector<ChoicePtr> affected;
  for (const auto& [id, c] : attempts_) {
    if (c->prefill_id == worker_id || c->decode_id == worker_id) affected.push_back(c);
  }
  for (const ChoicePtr& c : affected) {
    if (c->done || Find(c->attempt_id) != c) continue;  // Ended with an earlier one's request.
    if (c->prefill_id == worker_id &&
        (!c->first_token || (c->decode_id != worker_id && !c->decode_heard))) {
      // Either nothing reached the client, or token 1 did but the decode has
      // not shown that it pulled the KV (the offer may have died with the
      // prefill): run it elsewhere, resuming after the tokens already sent.
      // The old attempt is cancelled on the decode, so if it did pull, its
      // tokens are dropped as stale and the client sees each token once.
      SendCancel(*c, worker_id);
      Redispatch(c, absl::StrCat("prefill worker ", worker_id, " was lost (", reason, ")"), p);
    } else if (c->decode_id == worker_id) {
      SendCancel(*c, worker_id);
      const std::string lost = absl::StrCat("decode worker ", worker_id, " was lost (", reason, ")");
      if (c->migrations >= options_.max_migrations) {
        Fail(c, absl::UnavailableError(absl::StrCat(lost, "; the request has moved ", c->migrations,
                                                    " times, its limit (--max-migrations)")),
             p);
        continue;
      }
      // Migrate: prefill the prompt and the tokens the client has again,
      // then decode elsewhere; the client's stream goes on.
      ++c->migrations;
      ++migrations_;
      if (options_.migrated_total != nullptr) options_.migrated_total->Increment();
      Redispatch(c, lost, p);
    }
  }
}

}  // namespace duet::router
