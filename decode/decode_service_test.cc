// DecodeService in-process: the test plays the router (it reads the frames a
// FakeFrameSink captured) and the prefill (it prefills with engine::Model
// into a loopback-registered pool, leases the blocks and delivers KvOffer
// frames through OnFrame). Outputs must equal engine::Generate token for
// token, and every KV block must come back, on both sides.
#include "decode/decode_service.h"

#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "base/metrics.h"
#include "kvtransfer/layout_proto.h"
#include "decode/fake_frame_sink.h"
#include "decode/service_test_util.h"
#include "kernels/cpu/cpu_backend.h"
#include "kvtransfer/lease.h"
#include "kvtransfer/loopback/loopback_transport.h"
#include "engine/testing/tiny_model.h"
#include "proto/frame.h"

namespace duet::decode {
namespace {

constexpr char kPrefillAddress[] = "prefill-test:1";

engine::Model& PrefillModel() { return SharedTinyModel("llama"); }

// The prefill side: computes a prompt's KV, samples token 1 as a prefill
// worker does, leases the blocks and builds the KvOffer. Frees the blocks
// when decode releases them.
class TestPrefill {
 public:
  TestPrefill()
      : transport_(kvtransfer::NewLoopbackTransport()),
        pool_(PrefillModel().KvLayoutFor(16), 256),
        region_(transport_->RegisterRegion(pool_.region_base(), pool_.bytes(),
                                           pool_.num_blocks())
                    .value()),
        leases_(transport_.get(), region_, pool_.num_blocks(), &clock_, nullptr) {}

  ~TestPrefill() { (void)transport_->DeregisterRegion(region_); }

  // The KvOffer for `spec`, with token 1 as its generated id.
  proto::Frame Offer(uint64_t id, const proto::GenerationSpec& spec) {
    engine::Model& m = PrefillModel();
    const int64_t n = spec.prompt_ids_size();
    auto params = DecodeParams(spec, m.config(), n);
    REQUIRE(params.ok());
    auto seq = std::make_unique<engine::SequenceKv>(&pool_);
    REQUIRE(seq->Reserve(n).ok());
    std::vector<int32_t> prompt(spec.prompt_ids().begin(), spec.prompt_ids().end());
    engine::BatchSeq b{.tokens = prompt, .start_pos = 0, .block_table = seq->block_table(),
                       .logit_rows = {static_cast<int32_t>(n - 1)}};
    auto logits = m.Forward({b}, pool_);
    REQUIRE(logits.ok());
    engine::SampleResult t1 = engine::Sample(logits->row(0), m.config().vocab_size, params->sampling,
                                             params->choice_index, n);
    auto lease = leases_.Grant(seq->block_table(), absl::Seconds(30));
    REQUIRE(lease.ok());

    proto::Frame f = proto::NewFrame();
    proto::KvOffer* o = f.mutable_kv_offer();
    o->set_request_id(id);
    *o->mutable_spec() = spec;
    o->add_generated_ids(t1.token);
    proto::KvHandle* h = o->mutable_handle();
    h->set_worker_id("prefill-test");
    h->set_control_address(kPrefillAddress);
    h->set_data_address(transport_->address());
    h->set_region(transport_->ExportRegion(region_).value());
    for (const auto& [block, epoch] : lease->block_epochs) {
      h->add_block_ids(block);
      h->add_block_epochs(epoch);
    }
    *h->mutable_layout() = kvtransfer::WholeModelLayout(pool_.layout());
    h->set_lease_ms(30000);
    h->set_num_tokens(n);
    absl::MutexLock lock(&mu_);
    held_[id] = {std::move(seq), lease->id};
    return f;
  }

  // Ends the lease early (as expiry would): the pull must see the epochs move.
  void EndLease(uint64_t id) {
    absl::MutexLock lock(&mu_);
    REQUIRE(leases_.Cancel(held_.at(id).lease).ok());
  }

  void OnPeerFrame(const std::string& address, const proto::Frame& f) {
    if (address != kPrefillAddress || !f.has_kv_released()) return;
    absl::MutexLock lock(&mu_);
    auto it = held_.find(f.kv_released().request_id());
    if (it == held_.end()) return;
    (void)leases_.Release(it->second.lease);  // NotFound when it ended already.
    held_.erase(it);
  }

  int64_t free_blocks() const { return pool_.num_free(); }
  int64_t num_blocks() const { return pool_.num_blocks(); }
  kvtransfer::KvTransportPtr& transport() { return transport_; }

 private:
  struct Held {
    std::unique_ptr<engine::SequenceKv> kv;
    uint64_t lease = 0;
  };
  FakeClock clock_;
  kvtransfer::KvTransportPtr transport_;
  engine::BlockPool pool_;
  kvtransfer::RegionId region_;
  kvtransfer::LeaseTable leases_;
  absl::Mutex mu_;
  std::map<uint64_t, Held> held_;
};

struct Cluster : ServiceFixture<DecodeService> {
  explicit Cluster(int64_t kv_blocks, int64_t max_running = 256, int64_t token_budget = 2048) {
    sink.on_peer = [this](const std::string& a, const proto::Frame& f) { prefill.OnPeerFrame(a, f); };
    DecodeOptions o;
    o.max_running = max_running;
    o.transport = kvtransfer::NewLoopbackTransport();
    Create(std::move(o), "llama", kv_blocks, token_budget);
  }
  ~Cluster() { service.reset(); }

  void Offer(uint64_t id, const proto::GenerationSpec& spec) {
    specs[id] = spec;
    service->OnFrame(nullptr, prefill.Offer(id, spec));
  }
  // Released frames (to the prefill) per request: pulled flags in order.
  std::map<uint64_t, std::vector<bool>> Releases() {
    std::map<uint64_t, std::vector<bool>> r;
    for (const auto& [address, f] : sink.peers()) {
      REQUIRE(address == kPrefillAddress);
      REQUIRE(f.has_kv_released());
      r[f.kv_released().request_id()].push_back(f.kv_released().pulled());
    }
    return r;
  }

  TestPrefill prefill;
};

int64_t BlocksFor(int64_t tokens) { return (tokens + 15) / 16; }

TEST_CASE("decode: greedy and seeded outputs equal Generate; every block comes back", "[decode]") {
  Cluster c(256);
  c.Offer(1, TestSpec(TestPrompt(20, 1), 12, /*greedy=*/true));
  c.Offer(2, TestSpec(TestPrompt(33, 2), 15, /*greedy=*/false, /*seed=*/42, /*logprobs=*/3));
  proto::GenerationSpec eos = TestSpec(TestPrompt(7, 3), 30, /*greedy=*/false, 7, 1);
  eos.set_ignore_eos(false);
  c.Offer(3, eos);
  c.Offer(4, TestSpec(TestPrompt(48, 4), 9, /*greedy=*/true, 0, 2));
  auto out = c.Finished(4);
  int64_t blocks = 0;
  for (const auto& [id, spec] : c.specs) {
    INFO("request " << id);
    const engine::GenerateResult ref = ReferenceRun(PrefillModel(), spec);
    REQUIRE(out[id].first_tokens == 0);  // Token 1 is the prefill's to send.
    CheckAgainstReference(out[id], ref, /*skip=*/1);
    blocks += BlocksFor(spec.prompt_ids_size());
  }
  // Pulled, then released as pulled, once each.
  auto releases = c.Releases();
  for (uint64_t id = 1; id <= 4; ++id) REQUIRE(releases[id] == std::vector<bool>{true});
  REQUIRE(c.prefill.free_blocks() == c.prefill.num_blocks());

  proto::WorkerStats s = c.service->Stats();
  REQUIRE(s.role() == proto::ROLE_DECODE);
  REQUIRE(s.worker_id() == "decode-test");
  REQUIRE(s.kv_blocks_total() == 256);
  REQUIRE(s.kv_blocks_free() == 256);
  REQUIRE(s.queued_requests() == 0);
  REQUIRE(s.running_requests() == 0);
  REQUIRE(s.kv_blocks_transferred() == blocks);
  const int64_t block_bytes = 4 * 2 * 2 * 16 * 32 * 4;  // layers x K|V x kv heads x slots x head_dim x f32
  REQUIRE(s.kv_bytes_moved() == static_cast<uint64_t>(blocks * block_bytes));
  REQUIRE(s.prompt_tokens_computed() == 0);
  REQUIRE(s.preemptions() == 0);
  Gauge* usage = MetricsRegistry::Default().GetGauge("duet_kv_cache_usage_ratio", "",
                                                     {{"role", "decode"}, {"worker", "decode-test"}});
  REQUIRE(usage->Value() == 0.0);
}

TEST_CASE("decode: an offer whose max_tokens-th token is an EOS stops, not length", "[decode]") {
  // A resumed request's last generated token, sampled by an attempt that
  // died before its Finish, is both the max_tokens-th and an EOS: the one
  // finish rule says STOP, as every other path does.
  Cluster c(64);
  const int32_t eos = PrefillModel().config().eos_token_ids.at(0);
  proto::GenerationSpec spec = TestSpec(TestPrompt(20, 1), 1, /*greedy=*/true);
  spec.set_ignore_eos(false);
  for (uint64_t id : {1, 2}) {
    proto::Frame f = c.prefill.Offer(id, spec);
    f.mutable_kv_offer()->set_generated_ids(0, id == 1 ? eos : eos + 1);
    c.specs[id] = spec;
    c.service->OnFrame(nullptr, f);
  }
  auto out = c.Finished(2);
  for (uint64_t id : {1, 2}) {
    CHECK(out[id].tokens.empty());
    REQUIRE(out[id].finish.has_value());
  }
  CHECK(out[1].finish->reason() == proto::FINISH_STOP);
  CHECK(out[2].finish->reason() == proto::FINISH_LENGTH);
  // Nothing pulled: both handles go back to the prefill unpulled.
  auto releases = c.Releases();
  CHECK(releases[1] == std::vector<bool>{false});
  CHECK(releases[2] == std::vector<bool>{false});
}

TEST_CASE("decode: a pool too small preempts and recomputes, outputs unchanged", "[decode]") {
  // Each request ends at 8 blocks of the 12 (40 tokens, 4 blocks, left it
  // to scheduling: one could finish before the last was offered). Offered
  // together, the four cannot run one after another, and two that run at
  // once outgrow the pool.
  Cluster c(12, 256, /*token_budget=*/24);
  for (uint64_t id = 1; id <= 4; ++id) {
    c.Offer(id, TestSpec(TestPrompt(18 + static_cast<int>(id), static_cast<int>(id)), 100, id % 2 == 1, id, 1));
  }
  auto out = c.Finished(4);
  for (const auto& [id, spec] : c.specs) {
    INFO("request " << id);
    CheckAgainstReference(out[id], ReferenceRun(PrefillModel(), spec), 1);
  }
  proto::WorkerStats s = c.service->Stats();
  REQUIRE(s.preemptions() > 0);
  REQUIRE(s.prompt_tokens_computed() > 0);  // The recomputes.
  REQUIRE(s.kv_blocks_free() == 12);
  REQUIRE(c.prefill.free_blocks() == c.prefill.num_blocks());
}

TEST_CASE("decode: a handle with another layout is refused, naming the field", "[decode]") {
  Cluster c(64);
  struct Case {
    const char* field;
    std::function<void(proto::KvLayout*)> change;
  };
  const std::vector<Case> cases = {
      {"block_size", [](proto::KvLayout* l) { l->set_block_size(8); }},
      {"dtype", [](proto::KvLayout* l) { l->set_dtype("bf16"); }},
      {"num_layers", [](proto::KvLayout* l) { l->set_num_layers(l->num_layers() + 1); }},
      {"num_kv_heads", [](proto::KvLayout* l) { l->set_num_kv_heads(1); }},
      {"head_dim", [](proto::KvLayout* l) { l->set_head_dim(64); }},
      {"head range", [](proto::KvLayout* l) { l->set_head_end(1); }},
  };
  uint64_t id = 0;
  for (const Case& k : cases) {
    ++id;
    INFO(k.field);
    proto::Frame offer = c.prefill.Offer(id, TestSpec(TestPrompt(20, 1), 5, true));
    k.change(offer.mutable_kv_offer()->mutable_handle()->mutable_layout());
    c.service->OnFrame(nullptr, offer);
    auto out = c.Finished(id);
    const proto::Finish& f = *out[id].finish;
    REQUIRE(f.reason() == proto::FINISH_ERROR);
    REQUIRE(f.error_code() == static_cast<int>(absl::StatusCode::kInternal));
    REQUIRE(f.error().find(k.field) != std::string::npos);
    REQUIRE(out[id].tokens.empty());
    REQUIRE(c.Releases()[id] == std::vector<bool>{false});
  }
  REQUIRE(c.prefill.free_blocks() == c.prefill.num_blocks());
  REQUIRE(c.service->Stats().kv_blocks_free() == 64);
}

TEST_CASE("decode: a failed pull ends the attempt UNAVAILABLE and frees its blocks", "[decode]") {
  Cluster c(64);
  SECTION("the lease ended before the pull") {
    proto::Frame offer = c.prefill.Offer(1, TestSpec(TestPrompt(20, 1), 5, true));
    c.prefill.EndLease(1);
    c.service->OnFrame(nullptr, offer);
    const proto::Finish f = *c.Finished(1)[1].finish;
    REQUIRE(f.reason() == proto::FINISH_ERROR);
    REQUIRE(f.error_code() == static_cast<int>(absl::StatusCode::kUnavailable));
    REQUIRE(f.error().rfind("KV pull failed: lease_expired: ", 0) == 0);
  }
  SECTION("the prefill's transport is gone") {
    proto::Frame offer = c.prefill.Offer(1, TestSpec(TestPrompt(20, 1), 5, true));
    offer.mutable_kv_offer()->mutable_handle()->set_data_address("no such loopback transport");
    c.service->OnFrame(nullptr, offer);
    const proto::Finish f = *c.Finished(1)[1].finish;
    REQUIRE(f.error_code() == static_cast<int>(absl::StatusCode::kUnavailable));
    REQUIRE(f.error().rfind("KV pull failed: ", 0) == 0);
  }
  REQUIRE(c.Releases()[1] == std::vector<bool>{false});
  REQUIRE(c.service->Stats().kv_blocks_free() == 64);
  REQUIRE(c.prefill.free_blocks() == c.prefill.num_blocks());
  // The worker goes on serving.
  c.Offer(2, TestSpec(TestPrompt(10, 2), 4, true));
  CheckAgainstReference(c.Finished(2)[2], ReferenceRun(PrefillModel(), c.specs[2]), 1);
}

TEST_CASE("decode: cancel while waiting, while running, and before the offer", "[decode]") {
  // max_running 1 keeps B waiting behind A, which runs to the context's end
  // unless cancelled.
  Cluster c(80, /*max_running=*/1);
  c.Offer(1, TestSpec(TestPrompt(20, 1), kUntilContextEnd, true));
  c.Offer(2, TestSpec(TestPrompt(20, 2), 5, true));
  REQUIRE(c.sink.WaitForRouter([](const FakeFrameSink::Frames& fs) { return !fs.empty(); }));

  c.Cancel(2);
  c.service->Sync();
  REQUIRE(c.Releases()[2] == std::vector<bool>{false});  // Never pulled: the prefill may reuse them.

  c.Cancel(1);
  c.service->Sync();
  c.service->Sync();  // The step after the cancel has published its counts.
  proto::WorkerStats s = c.service->Stats();
  REQUIRE(s.kv_blocks_free() == 80);
  REQUIRE(s.queued_requests() == 0);
  REQUIRE(s.running_requests() == 0);
  const size_t frames = c.sink.router().size();

  // A cancel that overtook its offer: the late offer is released, not run.
  c.Cancel(3);
  c.Offer(3, TestSpec(TestPrompt(20, 3), 5, true));
  c.service->Sync();
  c.service->Sync();
  REQUIRE(c.Releases()[3] == std::vector<bool>{false});

  auto out = CollectRouterFrames(c.sink.router());
  REQUIRE(c.sink.router().size() == frames);  // Nothing after the cancels.
  REQUIRE(CountFinishes(c.sink.router()) == 0);
  REQUIRE(out[1].tokens.size() < 1000);
  REQUIRE(out.count(2) == 0);
  REQUIRE(c.Releases()[1] == std::vector<bool>{true});
  REQUIRE(c.prefill.free_blocks() == c.prefill.num_blocks());
}

TEST_CASE("decode: losing the router drops every request", "[decode]") {
  Cluster c(80, /*max_running=*/1);
  c.Offer(1, TestSpec(TestPrompt(20, 1), kUntilContextEnd, true));
  c.Offer(2, TestSpec(TestPrompt(20, 2), 5, true));
  REQUIRE(c.sink.WaitForRouter([](const FakeFrameSink::Frames& fs) { return !fs.empty(); }));
  c.service->OnRouterLost();
  c.service->Sync();
  REQUIRE(c.service->Stats().kv_blocks_free() == 80);
  REQUIRE(CountFinishes(c.sink.router()) == 0);
  REQUIRE(c.Releases()[2] == std::vector<bool>{false});
  REQUIRE(c.prefill.free_blocks() == c.prefill.num_blocks());
}

TEST_CASE("decode: registration, stats requests and malformed offers", "[decode]") {
  Cluster c(32);
  worker::RegistrationInfo r = c.service->Registration();
  REQUIRE(r.role == proto::ROLE_DECODE);
  REQUIRE(r.model == "tiny");
  REQUIRE(r.transport == "loopback");
  REQUIRE(!r.data_address.empty());
  REQUIRE(r.kv_blocks_total == 32);
  REQUIRE(r.layout.dtype() == "f32");
  REQUIRE(r.layout.block_size() == 16);
  REQUIRE(r.layout.layer_end() == r.layout.num_layers());
  REQUIRE(r.max_model_len == 1024);

  proto::Frame stats = proto::NewFrame();
  stats.mutable_stats_request();
  c.service->OnFrame(nullptr, stats);
  REQUIRE(c.sink.router().size() == 1);
  REQUIRE(c.sink.router()[0].stats().kv_blocks_total() == 32);

  // num_tokens that disagrees with the prompt, and a penalty out of range.
  proto::Frame bad = c.prefill.Offer(1, TestSpec(TestPrompt(20, 1), 5, true));
  bad.mutable_kv_offer()->mutable_handle()->set_num_tokens(19);
  c.service->OnFrame(nullptr, bad);
  proto::Frame penalty = c.prefill.Offer(2, TestSpec(TestPrompt(20, 1), 5, true));
  penalty.mutable_kv_offer()->mutable_spec()->mutable_sampling()->set_presence_penalty(5.0f);
  c.service->OnFrame(nullptr, penalty);
  auto out = CollectRouterFrames(c.sink.router());
  REQUIRE(out[1].finish->error().find("num_tokens") != std::string::npos);
  REQUIRE(out[2].finish->error().find("penalties") != std::string::npos);
  REQUIRE(out[2].finish->error_code() == static_cast<int>(absl::StatusCode::kInvalidArgument));
  REQUIRE(c.Releases()[1] == std::vector<bool>{false});

  // An offer with nothing left to generate ends at once.
  c.service->OnFrame(nullptr, c.prefill.Offer(3, TestSpec(TestPrompt(20, 3), 1, true)));
  out = CollectRouterFrames(c.sink.router());
  REQUIRE(out[3].finish->reason() == proto::FINISH_LENGTH);
  REQUIRE(out[3].tokens.empty());
  REQUIRE(c.Releases()[3] == std::vector<bool>{false});
  REQUIRE(c.prefill.free_blocks() == c.prefill.num_blocks());
}

}  // namespace
}  // namespace duet::decode
