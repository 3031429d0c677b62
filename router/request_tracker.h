// RequestTracker: the attempt state machine of every choice the router runs,
// apart from HTTP and sockets. A choice (one of a client request's n per
// prompt) runs as attempts: each a PrefillRequest to a prefill picked by the
// dispatcher, its KV pulled by a decode. The tracker starts attempts,
// matches the workers' FirstToken, Tokens and Finish frames to the current
// one (dropping stale ones, holding decode events that overtook the
// prefill's first token), and when a worker fails or is lost runs the
// choice again, resuming after the tokens the client has, or migrates it off
// a lost decode, or gives up. What reaches the client, and how, is its
// Client's; which workers exist and what they are charged, its Workers'.
//
//   RequestTracker tracker(options, &dispatcher, &workers, &client);
//   RETURN_IF_ERROR(tracker.Start(choices, n, p));   // a new request's first attempts
//   tracker.OnFirstToken(worker_id, frame.first_token(), p);
//   tracker.OnWorkerLost(worker_id, reason, p);
//
// Not thread-safe: the router calls it under its lock.
#ifndef DUET_ROUTER_REQUEST_TRACKER_H_
#define DUET_ROUTER_REQUEST_TRACKER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/metrics.h"
#include "dispatch/dispatch.h"
#include "proto/control.pb.h"
#include "router/completions.h"
#include "router/outbox.h"
#include "router/registry.h"
#include "spec/model_config.h"

namespace duet::router {

class RequestTracker {
 public:
  // One choice of a client request: the unit the workers run. The router's
  // own record of it derives from this.
  struct Choice {
    virtual ~Choice() = default;
    proto::GenerationSpec spec;  // With choice_index set.
    // What the client has of it: the ids a new attempt resumes after.
    std::unique_ptr<ChoiceBuilder> builder;
    bool done = false;  // Ended: completed, failed or dropped.
    int attempts = 0;
    int migrations = 0;  // Attempts started because a decode was lost.
    // The current attempt.
    uint64_t attempt_id = 0;
    std::string prefill_id, decode_id;
    // What the attempt charged to its prefill's queue, taken back when its
    // first token shows the prefill done.
    WorkerRegistry::Charged charged;
    bool first_token = false;
    // The decode has sent something for this attempt: it pulled the KV.
    bool decode_heard = false;
    // Decode events that overtook the prefill's FirstToken (they travel on
    // different connections); replayed once it arrives.
    std::vector<std::variant<proto::Token, proto::Finish>> held;
    std::string last_failure;
  };
  using ChoicePtr = std::shared_ptr<Choice>;

  // The workers as the tracker needs them (the router's WorkerRegistry).
  class Workers {
   public:
    virtual ~Workers() = default;
    virtual std::vector<dispatch::WorkerLoad> LiveLoads() const = 0;
    // False when the worker is not live.
    virtual bool Send(const std::string& worker_id, const proto::Frame& frame) = 0;
    virtual WorkerRegistry::Charged Charge(const dispatch::Assignment& assignment, int64_t tokens,
                                           uint64_t request_id) = 0;
    virtual void Uncharge(const WorkerRegistry::Charged& charged) = 0;
  };

  // The client side of each choice (the router's HTTP answers).
  class Client {
   public:
    virtual ~Client() = default;
    // A token of `c` to give the client (c.builder takes it). True when it
    // ended the choice (a stop string): the tracker then cancels the attempt
    // and completes the choice as STOP.
    virtual bool Deliver(Choice& c, const proto::Token& token, Pending& p) = 0;
    // The prefill of `c`'s current attempt took this many prompt tokens
    // from its cache.
    virtual void Cached(Choice& c, int64_t cached_tokens) = 0;
    // `c` ended (c.done is set, its attempt forgotten).
    virtual void Complete(Choice& c, proto::FinishReason reason, Pending& p) = 0;
    // `c` failed (c.done is set); the request it belongs to is an error, so
    // the client drops its other choices (Drop).
    virtual void Fail(Choice& c, const absl::Status& status, Pending& p) = 0;
  };

  struct Options {
    int max_attempts = 3;    // Per choice, migrations aside.
    int max_migrations = 3;  // Moves off lost decodes per choice.
    // EOS ids and context: the finish rule on a choice's resumed tokens.
    spec::ModelConfig config;
    // The first attempt id (ids only grow; see Router::Impl::Start).
    uint64_t first_attempt_id = 1;
    Counter* migrated_total = nullptr;  // Optional.
  };

  RequestTracker(Options options, dispatch::Dispatcher* dispatcher, Workers* workers, Client* client);

  // The first attempt of every choice of a new request, `n` choices per
  // prompt (choices i*n .. i*n+n-1 share prompt i): one PrefillRequest per
  // prompt whose sibling ids name its other choices, so each prompt is
  // computed once. On an error the caller drops the choices (Drop).
  absl::Status Start(absl::Span<const ChoicePtr> choices, size_t n);

  // The workers' frames about attempts; stale ones (an attempt that ended
  // or moved, a worker that is not the attempt's) are ignored.
  void OnFirstToken(const std::string& from, const proto::FirstToken& ft, Pending& p);
  void OnToken(const std::string& from, const proto::TokenEvent& ev, Pending& p);
  void OnFinish(const std::string& from, const proto::Finish& fin, Pending& p);
  // Every choice with an attempt on `worker_id` runs again elsewhere (or
  // fails when it may not).
  void OnWorkerLost(const std::string& worker_id, const std::string& reason, Pending& p);

  // Ends `c` without telling its client (the client went away, or the
  // request failed): its attempt is cancelled on the workers and forgotten.
  void Drop(const ChoicePtr& c);
  // Forgets every attempt (the router stopping); sends nothing.
  void Clear() { attempts_.clear(); }

  size_t attempts_in_flight() const { return attempts_.size(); }
  // The attempts in flight whose prefill or decode is `worker_id`: those a
  // loss of that worker moves or ends.
  int64_t AttemptsOn(const std::string& worker_id) const;
  int64_t redispatches() const { return redispatches_; }
  int64_t migrations() const { return migrations_; }

 private:
  ChoicePtr Find(uint64_t attempt_id) const;
  absl::Status StartAttempt(const ChoicePtr& c);
  absl::Status StartPrompt(absl::Span<const ChoicePtr> choices);
  // The attempt went to `prefill`/`decode` as `id`; `c` now waits for it.
  void Track(const ChoicePtr& c, uint64_t id, const dispatch::Assignment& a, WorkerRegistry::Charged charged);
  void Redispatch(const ChoicePtr& c, const std::string& reason, Pending& p);
  void Deliver(const ChoicePtr& c, const proto::Token& token, Pending& p);
  void ApplyFinish(const ChoicePtr& c, const proto::Finish& fin, const std::string& from, Pending& p);
  void Complete(const ChoicePtr& c, proto::FinishReason reason, Pending& p);
  void Fail(const ChoicePtr& c, const absl::Status& status, Pending& p);
  void Forget(Choice& c);
  void SendCancel(const Choice& c, const std::string& except);

  const Options options_;
  dispatch::Dispatcher* const dispatcher_;
  Workers* const workers_;
  Client* const client_;
  uint64_t next_attempt_id_;
  std::map<uint64_t, ChoicePtr> attempts_;  // By attempt (request_id).
  int64_t redispatches_ = 0;
  int64_t migrations_ = 0;
};

}  // namespace duet::router

#endif  // DUET_ROUTER_REQUEST_TRACKER_H_
