#include "router/registry.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "router/fake_worker.h"
#include "base/io_thread.h"
#include "proto/frame.h"

namespace duet::router {
namespace {

using testing::FakeWorker;
using testing::kWaitLimit;
using testing::FakeWorkerOptions;

// Records what the registry tells its listener.
class Recorder : public RegistryListener {
 public:
  void OnWorkerLive(const std::string& id, proto::Role, bool restarted) override {
    absl::MutexLock lock(&mu_);
    live_.push_back(id);
    restarted_.push_back(restarted);
  }
  std::vector<bool> restarted() {
    absl::MutexLock lock(&mu_);
    return restarted_;
  }
  void OnWorkerLost(const std::string& id, proto::Role, const std::string& reason) override {
    absl::MutexLock lock(&mu_);
    lost_.push_back(id);
    reasons_.push_back(reason);
  }
  void OnWorkerFrame(const std::string& id, proto::Frame f) override {
    absl::MutexLock lock(&mu_);
    frames_.emplace_back(id, std::move(f));
  }
  void OnHeartbeat(const std::string& id, const proto::WorkerStats&) override {
    absl::MutexLock lock(&mu_);
    heartbeats_++;
  }

  bool WaitLive(size_t n) { return Wait([&] { return live_.size() >= n; }); }
  bool WaitLost(size_t n) { return Wait([&] { return lost_.size() >= n; }); }
  bool WaitFrames(size_t n) { return Wait([&] { return frames_.size() >= n; }); }
  bool WaitHeartbeats(int n) { return Wait([&] { return heartbeats_ >= n; }); }

  int heartbeats() {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }
  std::vector<std::string> live() {
    absl::MutexLock lock(&mu_);
    return live_;
  }
  std::vector<std::string> lost() {
    absl::MutexLock lock(&mu_);
    return lost_;
  }
  std::string reason(size_t i) {
    absl::MutexLock lock(&mu_);
    return reasons_.at(i);
  }
  std::pair<std::string, proto::Frame> frame(size_t i) {
    absl::MutexLock lock(&mu_);
    return frames_.at(i);
  }

 private:
  template <typename F>
  bool Wait(F pred) {
    absl::MutexLock lock(&mu_);
    auto cond = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pred(); };
    return mu_.AwaitWithTimeout(absl::Condition(&cond), kWaitLimit);
  }

  absl::Mutex mu_;
  std::vector<std::string> live_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> restarted_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> lost_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> reasons_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, proto::Frame>> frames_ ABSL_GUARDED_BY(mu_);
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
};

struct Fixture {
  explicit Fixture(Clock* clock = RealClock()) {
    registry = std::make_unique<WorkerRegistry>(
        io.context(),
        RegistryOptions{.model = "tiny",
                        .heartbeat_interval = absl::Milliseconds(500),
                        .refuse_close_delay = absl::Milliseconds(20),
                        .clock = clock},
        &recorder);
    REQUIRE(registry->Start().ok());
  }
  ~Fixture() {
    workers.clear();
    registry->Stop();
  }

  // A worker of `role` serving "tiny", registered under `id`, once the
  // listener has heard it go live.
  FakeWorker& Live(const std::string& id, proto::Role role) {
    const size_t live = recorder.live().size();
    workers.push_back(std::make_unique<FakeWorker>(io, FakeWorkerOptions{.id = id, .role = role, .model = "tiny"}));
    REQUIRE(workers.back()->Register(registry->address())->ok());
    REQUIRE(recorder.WaitLive(live + 1));
    return *workers.back();
  }

  // Sends w's heartbeat and waits until the listener has it.
  void Beat(FakeWorker& w, const proto::WorkerStats& stats) {
    const int heard = recorder.heartbeats();
    w.Heartbeat(stats);
    REQUIRE(recorder.WaitHeartbeats(heard + 1));
  }

  // The error of the reply refusing w's Register.
  std::string Refusal(FakeWorker& w) {
    auto reply = w.Register(registry->address());
    REQUIRE(reply.ok());
    CHECK_FALSE(reply->ok());
    return reply->error();
  }

  IoThread io;
  Recorder recorder;
  std::unique_ptr<WorkerRegistry> registry;
  std::vector<std::unique_ptr<FakeWorker>> workers;
};

TEST_CASE("a worker speaking another protocol version is refused and closed") {
  Fixture fx;
  FakeWorker w(fx.io, {.id = "p0", .role = proto::ROLE_PREFILL, .model = "tiny", .protocol_version = 2});
  CHECK(fx.Refusal(w) == "protocol version mismatch: the worker speaks version 2, this router speaks version 1");
  CHECK(w.WaitRegistrationClosed());
  CHECK(fx.registry->LiveLoads().empty());
  CHECK(fx.recorder.live().empty());
}

TEST_CASE("a worker serving another model is refused and closed") {
  Fixture fx;
  FakeWorker w(fx.io, {.id = "d0", .role = proto::ROLE_DECODE, .model = "llama-70b"});
  CHECK(fx.Refusal(w) == "model mismatch: worker d0 serves model \"llama-70b\" but this router serves \"tiny\"");
  CHECK(w.WaitRegistrationClosed());
  CHECK(fx.registry->LiveLoads().empty());
}

TEST_CASE("a worker whose control address is unreachable is refused") {
  Fixture fx;
  // A port nobody listens on: take one, then free it.
  std::string dead;
  {
    auto s = rpc::Server::Listen(fx.io.context(), "127.0.0.1:0", [](rpc::ConnectionPtr) {});
    REQUIRE(s.ok());
    dead = (*s)->address();
  }
  FakeWorker w(fx.io, {.id = "c0", .model = "tiny", .control_address = dead});
  CHECK(fx.Refusal(w).find("cannot connect to control_address " + dead) != std::string::npos);
  CHECK(fx.registry->LiveLoads().empty());
}

TEST_CASE("registration: greeting on the worker's port, then the reply; events flow both ways") {
  Fixture fx;
  FakeWorker w(fx.io, {.id = "c0", .role = proto::ROLE_COLOCATED, .model = "tiny", .kv_blocks_total = 64});
  auto reply = w.Register(fx.registry->address());
  REQUIRE(reply.ok());
  CHECK(reply->ok());
  CHECK(reply->heartbeat_interval_ms() == 500);
  REQUIRE(w.WaitGreeting());
  REQUIRE(fx.recorder.WaitLive(1));
  CHECK(fx.recorder.live() == std::vector<std::string>{"c0"});

  auto loads = fx.registry->LiveLoads();
  REQUIRE(loads.size() == 1);
  CHECK(loads[0].id == "c0");
  CHECK(loads[0].role == dispatch::Role::kColocated);
  CHECK(loads[0].control_address == w.control_address());
  CHECK(loads[0].kv_blocks_free == 64);  // Before any heartbeat: the whole pool.

  // Router -> worker on the greeting connection.
  proto::Frame cancel = proto::NewFrame();
  cancel.mutable_cancel()->set_request_id(42);
  REQUIRE(fx.registry->Send("c0", cancel));
  CHECK_FALSE(fx.registry->Send("nobody", cancel));
  auto got = w.NextFrame();
  REQUIRE(got.ok());
  CHECK(got->cancel().request_id() == 42);

  // Worker -> router events reach the listener tagged with the worker.
  proto::Frame ft = proto::NewFrame();
  ft.mutable_first_token()->set_request_id(7);
  ft.mutable_first_token()->mutable_token()->set_id(99);
  w.Send(ft);
  REQUIRE(fx.recorder.WaitFrames(1));
  auto [from, frame] = fx.recorder.frame(0);
  CHECK(from == "c0");
  CHECK(frame.first_token().token().id() == 99);
}

TEST_CASE("a prefill's queue is the router's charges until their first tokens; decode loads follow heartbeats") {
  Fixture fx;
  FakeWorker& p = fx.Live("p0", proto::ROLE_PREFILL);
  FakeWorker& d = fx.Live("d0", proto::ROLE_DECODE);

  // The worker's own count (whole prompts, cached parts included, as of its
  // last heartbeat) is not the router's queue.
  proto::WorkerStats ps;
  ps.set_queued_prefill_tokens(100);
  fx.Beat(p, ps);
  proto::WorkerStats ds;
  ds.set_kv_blocks_free(50);
  ds.set_running_requests(2);
  fx.Beat(d, ds);
  CHECK(fx.registry->LiveLoads()[1].queued_prefill_tokens == 0);

  const WorkerRegistry::Charged first =
      fx.registry->Charge({.prefill_id = "p0", .decode_id = "d0"}, 40, 1);  // 41 tokens -> 3 blocks of 16.
  auto loads = fx.registry->LiveLoads();
  REQUIRE(loads.size() == 2);
  CHECK(loads[0].id == "d0");
  CHECK(loads[0].kv_blocks_free == 47);
  CHECK(loads[0].running_requests == 3);
  CHECK(loads[0].queued_prefill_tokens == 0);
  CHECK(loads[1].id == "p0");
  CHECK(loads[1].queued_prefill_tokens == 40);

  // A policy that knows the cached part charges only what is computed.
  const WorkerRegistry::Charged second =
      fx.registry->Charge({.prefill_id = "p0", .decode_id = "d0", .prefill_tokens = 8}, 30, 2);
  CHECK(fx.registry->LiveLoads()[1].queued_prefill_tokens == 48);

  // Heartbeats that include both requests do not take their prefills off
  // the queue: they are not done until their first tokens.
  ps.set_queued_prefill_tokens(70);
  ps.set_last_request_id(2);
  fx.Beat(p, ps);
  loads = fx.registry->LiveLoads();
  CHECK(loads[1].queued_prefill_tokens == 48);
  CHECK(loads[0].kv_blocks_free == 47 - 2);  // d0 has not heartbeaten since.
  fx.registry->Uncharge(second);
  CHECK(fx.registry->LiveLoads()[1].queued_prefill_tokens == 40);
  fx.registry->Uncharge(second);  // Twice (a request forgotten after its first token): no change.
  CHECK(fx.registry->LiveLoads()[1].queued_prefill_tokens == 40);
  fx.registry->Uncharge(first);
  CHECK(fx.registry->LiveLoads()[1].queued_prefill_tokens == 0);
  // The decode's blocks stay charged after the prefills are done, until its
  // heartbeat counts them all (a decode hears of requests from prefills).
  CHECK(fx.registry->LiveLoads()[0].kv_blocks_free == 45);
  fx.Beat(d, ds);
  CHECK(fx.registry->LiveLoads()[0].kv_blocks_free == 50);
  // Every charge counted a dispatch on both workers (heartbeats do not reset it).
  for (const WorkerSnapshot& w : fx.registry->Snapshot()) {
    INFO(w.id);
    CHECK(w.dispatched == 2);
  }
}

TEST_CASE("a colocated worker's charge holds its prefill tokens and its blocks, counted once") {
  Fixture fx;
  FakeWorker& c = fx.Live("c0", proto::ROLE_COLOCATED);
  proto::WorkerStats cs;
  cs.set_kv_blocks_free(20);
  fx.Beat(c, cs);
  const WorkerRegistry::Charged charged = fx.registry->Charge({.prefill_id = "c0", .decode_id = "c0"}, 40, 5);
  auto loads = fx.registry->LiveLoads();
  REQUIRE(loads.size() == 1);
  CHECK(loads[0].queued_prefill_tokens == 40);
  CHECK(loads[0].kv_blocks_free == 17);
  CHECK(loads[0].running_requests == 1);
  // Its heartbeat counts request 5's blocks; the prefill counts until done.
  cs.set_kv_blocks_free(17);
  cs.set_running_requests(1);
  cs.set_last_request_id(5);
  fx.Beat(c, cs);
  loads = fx.registry->LiveLoads();
  CHECK(loads[0].kv_blocks_free == 17);
  CHECK(loads[0].running_requests == 1);
  CHECK(loads[0].queued_prefill_tokens == 40);
  fx.registry->Uncharge(charged);
  CHECK(fx.registry->LiveLoads()[0].queued_prefill_tokens == 0);
  CHECK(fx.registry->Snapshot()[0].dispatched == 1);
}

TEST_CASE("a worker silent for three heartbeat intervals is removed") {
  FakeClock clock;
  Fixture fx(&clock);
  FakeWorker& w = fx.Live("d0", proto::ROLE_DECODE);

  clock.Advance(absl::Milliseconds(1400));
  fx.registry->CheckHeartbeats();
  CHECK(fx.registry->LiveLoads().size() == 1);  // 1.4 s < 3 x 500 ms.

  fx.Beat(w, proto::WorkerStats());
  clock.Advance(absl::Milliseconds(1500));  // Exactly three intervals since the heartbeat.
  fx.registry->CheckHeartbeats();
  CHECK(fx.registry->LiveLoads().size() == 1);
  CHECK(fx.recorder.lost().empty());

  clock.Advance(absl::Milliseconds(1));
  fx.registry->CheckHeartbeats();
  REQUIRE(fx.recorder.WaitLost(1));
  CHECK(fx.recorder.lost() == std::vector<std::string>{"d0"});
  CHECK(fx.recorder.reason(0).find("no heartbeat for 1.501s") != std::string::npos);
  CHECK(fx.registry->LiveLoads().empty());
  // Both of its connections are closed.
  CHECK(w.WaitRegistrationClosed());
  CHECK(w.WaitRouterConnectionClosed());
  proto::Frame f = proto::NewFrame();
  f.mutable_cancel();
  CHECK_FALSE(fx.registry->Send("d0", f));
}

TEST_CASE("closing either connection removes the worker") {
  Fixture fx;
  FakeWorker a(fx.io, {.id = "a", .role = proto::ROLE_COLOCATED, .model = "tiny"});
  FakeWorker b(fx.io, {.id = "b", .role = proto::ROLE_COLOCATED, .model = "tiny"});
  REQUIRE(a.Register(fx.registry->address())->ok());
  REQUIRE(b.Register(fx.registry->address())->ok());
  REQUIRE(a.WaitGreeting());
  REQUIRE(fx.recorder.WaitLive(2));

  a.CloseRouterConnection();  // The router's connection to a.
  REQUIRE(fx.recorder.WaitLost(1));
  CHECK(fx.recorder.lost()[0] == "a");
  CHECK(a.WaitRegistrationClosed());  // The registry closes the other one.

  b.CloseRegistration();
  REQUIRE(fx.recorder.WaitLost(2));
  CHECK(fx.recorder.lost()[1] == "b");
  CHECK(b.WaitRouterConnectionClosed());
  CHECK(fx.registry->LiveLoads().empty());
}

TEST_CASE("a worker registering again under its id replaces the old entry") {
  Fixture fx;
  FakeWorker& old_w = fx.Live("x", proto::ROLE_COLOCATED);
  FakeWorker& new_w = fx.Live("x", proto::ROLE_COLOCATED);
  CHECK(fx.recorder.lost() == std::vector<std::string>{"x"});
  auto loads = fx.registry->LiveLoads();
  REQUIRE(loads.size() == 1);
  CHECK(loads[0].control_address == new_w.control_address());
  CHECK(old_w.WaitRegistrationClosed());
}

TEST_CASE("a new incarnation under a known id is a restart; the same one a reconnection") {
  Fixture fx;
  std::vector<std::unique_ptr<FakeWorker>> ws;
  for (uint64_t incarnation : {7, 7, 8}) {
    ws.push_back(std::make_unique<FakeWorker>(
        fx.io, FakeWorkerOptions{.id = "p", .role = proto::ROLE_PREFILL, .model = "tiny", .incarnation = incarnation}));
    REQUIRE(ws.back()->Register(fx.registry->address())->ok());
    REQUIRE(fx.recorder.WaitLive(ws.size()));
  }
  CHECK(fx.recorder.restarted() == std::vector<bool>{false, false, true});
}

TEST_CASE("a draining worker gets nothing new: it leaves the live loads, and its stats say so") {
  Fixture fx;
  FakeWorker& p = fx.Live("p0", proto::ROLE_PREFILL);
  FakeWorker& d = fx.Live("d0", proto::ROLE_DECODE);
  proto::WorkerStats s;
  s.set_draining(true);
  fx.Beat(d, s);
  auto loads = fx.registry->LiveLoads();
  REQUIRE(loads.size() == 1);
  CHECK(loads[0].id == "p0");
  auto snap = fx.registry->Snapshot();
  REQUIRE(snap.size() == 2);  // Still live: its requests run on.
  CHECK(snap[0].id == "d0");
  CHECK(snap[0].draining);
  CHECK_FALSE(snap[1].draining);
}

}  // namespace
}  // namespace duet::router
