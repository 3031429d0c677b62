// The attempt state machine on its own: workers and the client are
// recorders, frames are handed in directly, nothing is sent on a socket.
#include "router/request_tracker.h"

#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/testing/tiny_model.h"
#include "proto/frame.h"
#include "text/tokenizer.h"

namespace duet::router {
namespace {

using Choice = RequestTracker::Choice;
using ChoicePtr = RequestTracker::ChoicePtr;

// Two prefills and two decodes; a lost worker is no longer live.
class FakeWorkers : public RequestTracker::Workers {
 public:
  std::vector<dispatch::WorkerLoad> LiveLoads() const override {
    std::vector<dispatch::WorkerLoad> out;
    for (const std::string& id : {"p1", "p2"}) {
      if (!lost.count(id)) out.push_back({.id = id, .role = dispatch::Role::kPrefill});
    }
    for (const std::string& id : {"d1", "d2"}) {
      if (!lost.count(id)) {
        out.push_back({.id = id, .role = dispatch::Role::kDecode, .control_address = id + ":1", .kv_blocks_free = 8});
      }
    }
    return out;
  }
  bool Send(const std::string& worker_id, const proto::Frame& frame) override {
    if (lost.count(worker_id)) return false;
    sent.push_back({worker_id, frame});
    return true;
  }
  WorkerRegistry::Charged Charge(const dispatch::Assignment& a, int64_t, uint64_t request_id) override {
    charged.insert(request_id);
    return {.prefill_id = a.prefill_id, .request_id = request_id};
  }
  void Uncharge(const WorkerRegistry::Charged& c) override {
    if (c.request_id != 0) charged.erase(c.request_id);
  }

  // The prefill requests sent, in order.
  std::vector<std::pair<std::string, proto::PrefillRequest>> Prefills() const {
    std::vector<std::pair<std::string, proto::PrefillRequest>> out;
    for (const auto& [to, f] : sent) {
      if (f.has_prefill()) out.push_back({to, f.prefill()});
    }
    return out;
  }
  // The workers told to cancel `attempt`.
  std::set<std::string> Cancelled(uint64_t attempt) const {
    std::set<std::string> out;
    for (const auto& [to, f] : sent) {
      if (f.has_cancel() && f.cancel().request_id() == attempt) out.insert(to);
    }
    return out;
  }

  std::set<std::string> lost;
  std::vector<std::pair<std::string, proto::Frame>> sent;
  std::set<uint64_t> charged;  // Charges not yet taken back.
};

struct TestChoice : Choice {
  int index = 0;
};

// Records what the client would see; a failure drops the request's other
// choices, as the router does.
class FakeClient : public RequestTracker::Client {
 public:
  bool Deliver(Choice& c, const proto::Token& token, Pending&) override {
    c.builder->AddToken(token, {}, false);
    return c.builder->stopped();
  }
  void Cached(Choice& c, int64_t cached_tokens) override { cached[Index(c)] = cached_tokens; }
  void Complete(Choice& c, proto::FinishReason reason, Pending&) override { finished[Index(c)] = reason; }
  void Fail(Choice& c, const absl::Status& status, Pending&) override {
    failed[Index(c)] = status;
    for (const ChoicePtr& other : choices) tracker->Drop(other);
  }
  static int Index(const Choice& c) { return static_cast<const TestChoice&>(c).index; }

  RequestTracker* tracker = nullptr;
  std::vector<ChoicePtr> choices;
  std::map<int, int64_t> cached;
  std::map<int, proto::FinishReason> finished;
  std::map<int, absl::Status> failed;
};

struct Fixture {
  explicit Fixture(RequestTracker::Options options = {}) {
    tokenizer = text::Tokenizer::Load(duet::testing::TinyModelDir()).value();
    dispatcher = dispatch::NewDispatcher(dispatch::DispatchPolicy::kLeastLoaded).value();
    options.config.vocab_size = tokenizer->vocab_size();
    options.config.max_position_embeddings = 4096;
    options.config.eos_token_ids = {kEos};
    options.first_attempt_id = 1000;
    tracker = std::make_unique<RequestTracker>(options, dispatcher.get(), &workers, &client);
    client.tracker = tracker.get();
  }
  ~Fixture() { CHECK(workers.charged.empty()); }  // Every charge comes back.

  // A request of `n` choices of one prompt, started.
  void Start(int n, int max_tokens) {
    params.n = n;
    for (int i = 0; i < 4; ++i) params.spec.add_prompt_ids(10 + i);
    params.spec.set_max_tokens(max_tokens);
    for (int i = 0; i < n; ++i) {
      auto c = std::make_shared<TestChoice>();
      c->index = i;
      c->spec = params.spec;
      c->spec.set_choice_index(static_cast<uint32_t>(i));
      c->builder = std::make_unique<ChoiceBuilder>(tokenizer.get(), params, i, "");
      client.choices.push_back(c);
    }
    REQUIRE(tracker->Start(client.choices, static_cast<size_t>(n)).ok());
  }
  static proto::FirstToken First(uint64_t attempt, int32_t token, int64_t cached = 0) {
    proto::FirstToken ft;
    ft.set_request_id(attempt);
    ft.mutable_token()->set_id(token);
    ft.set_cached_tokens(cached);
    return ft;
  }
  static proto::TokenEvent Token(uint64_t attempt, int32_t token) {
    proto::TokenEvent ev;
    ev.set_request_id(attempt);
    ev.mutable_token()->set_id(token);
    return ev;
  }
  static proto::Finish Finish(uint64_t attempt, proto::FinishReason reason, absl::StatusCode code = absl::StatusCode::kOk) {
    proto::Finish f;
    f.set_request_id(attempt);
    f.set_reason(reason);
    f.set_error_code(static_cast<int32_t>(code));
    if (code != absl::StatusCode::kOk) f.set_error("the pull failed");
    return f;
  }
  const std::vector<int32_t>& Tokens(int i) const { return client.choices[static_cast<size_t>(i)]->builder->token_ids(); }
  const Choice& At(int i) const { return *client.choices[static_cast<size_t>(i)]; }

  static constexpr int32_t kEos = 2;
  std::unique_ptr<text::Tokenizer> tokenizer;
  std::unique_ptr<dispatch::Dispatcher> dispatcher;
  FakeWorkers workers;
  FakeClient client;
  std::unique_ptr<RequestTracker> tracker;
  CompletionRequest params;
  Pending p;
};

TEST_CASE("tokens reach the client in order though the decode's overtake the first token; stale frames are dropped",
          "[router][tracker]") {
  Fixture f;
  f.Start(1, 5);
  auto prefills = f.workers.Prefills();
  REQUIRE(prefills.size() == 1);
  CHECK(prefills[0].first == "p1");
  CHECK(prefills[0].second.request_id() == 1000);
  CHECK(prefills[0].second.decode_worker_id() == "d1");
  CHECK(prefills[0].second.decode_address() == "d1:1");
  CHECK(f.workers.charged == std::set<uint64_t>{1000});

  f.tracker->OnToken("d1", Fixture::Token(1000, 21), f.p);  // before the first token: held
  f.tracker->OnToken("d2", Fixture::Token(1000, 99), f.p);  // not the attempt's decode
  f.tracker->OnToken("d1", Fixture::Token(7, 99), f.p);     // no such attempt
  CHECK(f.Tokens(0).empty());
  f.tracker->OnFirstToken("p1", Fixture::First(1000, 20, /*cached=*/3), f.p);
  CHECK(f.Tokens(0) == std::vector<int32_t>{20, 21});
  CHECK(f.client.cached[0] == 3);
  CHECK(f.workers.charged.empty());  // The prefill is done.
  f.tracker->OnFirstToken("p1", Fixture::First(1000, 99), f.p);  // a duplicate
  f.tracker->OnToken("d1", Fixture::Token(1000, 22), f.p);
  CHECK(f.Tokens(0) == std::vector<int32_t>{20, 21, 22});
  f.tracker->OnFinish("d1", Fixture::Finish(1000, proto::FINISH_LENGTH), f.p);
  CHECK(f.client.finished.at(0) == proto::FINISH_LENGTH);
  CHECK(f.At(0).done);
  CHECK(f.tracker->attempts_in_flight() == 0);
  f.tracker->OnToken("d1", Fixture::Token(1000, 23), f.p);  // after the end
  CHECK(f.Tokens(0).size() == 3);
}

TEST_CASE("n choices of a prompt go out as one prefill request with sibling ids, charged once", "[router][tracker]") {
  Fixture f;
  f.Start(3, 4);
  auto prefills = f.workers.Prefills();
  REQUIRE(prefills.size() == 1);
  CHECK(prefills[0].second.request_id() == 1000);
  CHECK(std::vector<uint64_t>(prefills[0].second.sibling_request_ids().begin(),
                              prefills[0].second.sibling_request_ids().end()) == std::vector<uint64_t>{1001, 1002});
  CHECK(f.workers.charged == std::set<uint64_t>{1000});
  CHECK(f.tracker->attempts_in_flight() == 3);
  CHECK(f.tracker->AttemptsOn("p1") == 3);
  CHECK(f.tracker->AttemptsOn("d1") == 3);
  CHECK(f.tracker->AttemptsOn("p2") == 0);
  for (uint64_t a = 1000; a < 1003; ++a) f.tracker->OnFirstToken("p1", Fixture::First(a, 30 + static_cast<int32_t>(a - 1000)), f.p);
  CHECK(f.Tokens(2) == std::vector<int32_t>{32});
  // A worker's error fails the request: every choice ends, the others cancelled on their workers.
  f.tracker->OnFinish("d1", Fixture::Finish(1001, proto::FINISH_ERROR, absl::StatusCode::kInvalidArgument), f.p);
  REQUIRE(f.client.failed.count(1) == 1);
  CHECK(f.client.failed.at(1).code() == absl::StatusCode::kInvalidArgument);
  CHECK(f.client.failed.at(1).message() == "worker d1 failed the request: the pull failed");
  CHECK(f.workers.Cancelled(1001) == std::set<std::string>{"p1"});  // not d1, which reported it
  CHECK(f.workers.Cancelled(1000) == std::set<std::string>{"p1", "d1"});
  CHECK(f.workers.Cancelled(1002) == std::set<std::string>{"p1", "d1"});
  CHECK(f.tracker->attempts_in_flight() == 0);
}

TEST_CASE("a failed pull runs the choice again after the tokens the client has", "[router][tracker]") {
  Fixture f;
  f.Start(1, 6);
  f.tracker->OnFirstToken("p1", Fixture::First(1000, 20), f.p);
  f.tracker->OnToken("d1", Fixture::Token(1000, 21), f.p);
  f.tracker->OnFinish("d1", Fixture::Finish(1000, proto::FINISH_ERROR, absl::StatusCode::kUnavailable), f.p);
  CHECK(f.workers.Cancelled(1000) == std::set<std::string>{"p1"});
  auto prefills = f.workers.Prefills();
  REQUIRE(prefills.size() == 2);
  const proto::PrefillRequest& again = prefills[1].second;
  CHECK(again.request_id() == 1001);
  CHECK(std::vector<int32_t>(again.resume_ids().begin(), again.resume_ids().end()) == std::vector<int32_t>{20, 21});
  CHECK(f.tracker->redispatches() == 1);
  CHECK(f.At(0).attempts == 2);
  f.tracker->OnToken("d1", Fixture::Token(1000, 99), f.p);  // the old attempt's: stale
  f.tracker->OnFirstToken(prefills[1].first, Fixture::First(1001, 22), f.p);
  CHECK(f.Tokens(0) == std::vector<int32_t>{20, 21, 22});
  f.tracker->OnFinish(again.decode_worker_id(), Fixture::Finish(1001, proto::FINISH_STOP), f.p);
  CHECK(f.client.finished.at(0) == proto::FINISH_STOP);
}

TEST_CASE("when the client's tokens already end the choice, a lost decode finishes it without a new attempt",
          "[router][tracker]") {
  Fixture f;
  SECTION("the max_tokens-th token is an EOS: STOP") {
    f.Start(1, 3);
    f.tracker->OnFirstToken("p1", Fixture::First(1000, 20), f.p);
    f.tracker->OnToken("d1", Fixture::Token(1000, 21), f.p);
    f.tracker->OnToken("d1", Fixture::Token(1000, Fixture::kEos), f.p);
    f.workers.lost.insert("d1");
    f.tracker->OnWorkerLost("d1", "gone", f.p);
    CHECK(f.client.finished.at(0) == proto::FINISH_STOP);
  }
  SECTION("max_tokens reached with another token: LENGTH") {
    f.Start(1, 2);
    f.tracker->OnFirstToken("p1", Fixture::First(1000, 20), f.p);
    f.tracker->OnToken("d1", Fixture::Token(1000, 21), f.p);
    f.workers.lost.insert("d1");
    f.tracker->OnWorkerLost("d1", "gone", f.p);
    CHECK(f.client.finished.at(0) == proto::FINISH_LENGTH);
  }
  CHECK(f.workers.Prefills().size() == 1);
  CHECK(f.tracker->redispatches() == 0);
  CHECK(f.tracker->attempts_in_flight() == 0);
}

TEST_CASE("a lost decode's choice migrates at most max_migrations times, then the request fails",
          "[router][tracker]") {
  Fixture f({.max_migrations = 1});
  f.Start(1, 10);
  f.tracker->OnFirstToken("p1", Fixture::First(1000, 20), f.p);
  f.tracker->OnToken("d1", Fixture::Token(1000, 21), f.p);
  f.workers.lost.insert("d1");
  f.tracker->OnWorkerLost("d1", "heartbeats missed", f.p);
  CHECK(f.tracker->migrations() == 1);
  auto prefills = f.workers.Prefills();
  REQUIRE(prefills.size() == 2);
  CHECK(prefills[1].second.decode_worker_id() == "d2");
  CHECK(prefills[1].second.resume_ids_size() == 2);
  f.tracker->OnFirstToken(prefills[1].first, Fixture::First(1001, 22), f.p);
  f.workers.lost.insert("d2");
  f.tracker->OnWorkerLost("d2", "heartbeats missed", f.p);
  REQUIRE(f.client.failed.count(0) == 1);
  CHECK(f.client.failed.at(0).code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(f.client.failed.at(0).message()).find("--max-migrations") != std::string::npos);
  CHECK(f.Tokens(0) == std::vector<int32_t>{20, 21, 22});
}

TEST_CASE("a lost prefill's choice runs elsewhere until max_attempts, then fails naming the last failure",
          "[router][tracker]") {
  Fixture f({.max_attempts = 2});
  f.Start(1, 10);
  f.workers.lost.insert("p1");
  f.tracker->OnWorkerLost("p1", "killed", f.p);
  auto prefills = f.workers.Prefills();
  REQUIRE(prefills.size() == 2);
  CHECK(prefills[1].first == "p2");
  CHECK(prefills[1].second.resume_ids_size() == 0);
  CHECK(f.workers.Cancelled(1000) == std::set<std::string>{"d1"});
  f.workers.lost.erase("p1");
  f.workers.lost.insert("p2");
  f.tracker->OnWorkerLost("p2", "killed", f.p);
  REQUIRE(f.client.failed.count(0) == 1);
  CHECK(std::string(f.client.failed.at(0).message()) ==
        "prefill worker p2 was lost (killed); cannot retry: the request failed after 2 attempts; the last "
        "failure: prefill worker p2 was lost (killed)");
}

TEST_CASE("a dropped choice is cancelled on its workers and its charge taken back", "[router][tracker]") {
  Fixture f;
  f.Start(1, 10);
  CHECK(f.workers.charged.size() == 1);
  f.tracker->Drop(f.client.choices[0]);
  CHECK(f.At(0).done);
  CHECK(f.workers.Cancelled(1000) == std::set<std::string>{"p1", "d1"});
  CHECK(f.tracker->attempts_in_flight() == 0);
  f.tracker->OnFirstToken("p1", Fixture::First(1000, 20), f.p);  // too late
  CHECK(f.Tokens(0).empty());
  CHECK(f.client.finished.empty());
}

}  // namespace
}  // namespace duet::router
