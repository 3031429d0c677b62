// PrefillService in-process: frames go in through OnFrame, come out through a
// recording FrameSink, and KV is pulled back through a loopback transport as
// a decode would. Results are checked against engine::Generate and a local
// prefill of the same prompt.
#include "prefill/prefill_service.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "base/metrics.h"
#include "engine/block_pool.h"
#include "engine/generator.h"
#include "engine/model.h"
#include "kernels/cpu/cpu_backend.h"
#include "kvtransfer/loopback/loopback_transport.h"
#include "engine/testing/tiny_model.h"
#include "worker/frame_sink.h"

namespace duet::prefill {
namespace {

constexpr absl::Duration kWait = absl::Seconds(60);
const char* const kDecode = "127.0.0.1:7001";
const char* const kDeadDecode = "127.0.0.1:7999";

// Records what the service sends; "sends" to kDeadDecode fail at once.
class RecordingSink : public worker::FrameSink {
 public:
  void SendToRouter(const proto::Frame& f) override {
    absl::MutexLock lock(&mu_);
    router_.push_back(f);
  }
  void SendToPeer(const std::string& address, const proto::Frame& f,
                  std::function<void(absl::Status)> on_error) override {
    if (address == kDeadDecode) {
      if (on_error) on_error(absl::UnavailableError("connection refused"));
      return;
    }
    absl::MutexLock lock(&mu_);
    peer_.push_back({address, f});
  }
  std::string worker_id() const override { return "prefill-test"; }
  std::string control_address() const override { return "127.0.0.1:7000"; }

  // The router frame of `kind` for `id`, waiting for it.
  std::optional<proto::Frame> WaitRouter(uint64_t id, proto::Frame::MsgCase kind) {
    std::optional<proto::Frame> out;
    auto found = [&]() {
      for (const auto& f : router_) {
        if (f.msg_case() == kind && IdOf(f) == id) {
          out = f;
          return true;
        }
      }
      return false;
    };
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&found), kWait);
    return out;
  }
  std::optional<proto::KvOffer> WaitOffer(uint64_t id) {
    std::optional<proto::KvOffer> out;
    auto found = [&]() {
      for (const auto& [addr, f] : peer_) {
        if (f.has_kv_offer() && f.kv_offer().request_id() == id && addr == kDecode) {
          out = f.kv_offer();
          return true;
        }
      }
      return false;
    };
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&found), kWait);
    return out;
  }
  // Every frame about `id`, router and peer.
  int CountFor(uint64_t id) {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const auto& f : router_) n += IdOf(f) == id;
    for (const auto& [a, f] : peer_) n += f.has_kv_offer() && f.kv_offer().request_id() == id;
    return n;
  }

 private:
  static uint64_t IdOf(const proto::Frame& f) {
    if (f.has_first_token()) return f.first_token().request_id();
    if (f.has_finish()) return f.finish().request_id();
    return 0;
  }
  absl::Mutex mu_;
  std::vector<proto::Frame> router_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, proto::Frame>> peer_ ABSL_GUARDED_BY(mu_);
};

std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 37 + 11 * salt) % 900;
  return p;
}

proto::Frame Request(uint64_t id, const std::vector<int32_t>& prompt, int max_tokens = 8) {
  proto::Frame f;
  f.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  proto::PrefillRequest* r = f.mutable_prefill();
  r->set_request_id(id);
  for (int32_t t : prompt) r->mutable_spec()->add_prompt_ids(t);
  proto::SamplingParams* s = r->mutable_spec()->mutable_sampling();
  s->set_temperature(0.9f);
  s->set_top_k(50);
  s->set_top_p(0.95f);
  s->set_seed(1000 + id);
  r->mutable_spec()->set_max_tokens(max_tokens);
  r->mutable_spec()->set_ignore_eos(true);
  r->set_decode_worker_id("decode-1");
  r->set_decode_address(kDecode);
  return f;
}

proto::Frame Released(uint64_t id, bool pulled = true) {
  proto::Frame f;
  f.mutable_kv_released()->set_request_id(id);
  f.mutable_kv_released()->set_pulled(pulled);
  return f;
}

proto::Frame CancelFrame(uint64_t id) {
  proto::Frame f;
  f.mutable_cancel()->set_request_id(id);
  return f;
}

// The prefill worker plus what a test compares it with.
struct Harness {
  explicit Harness(PrefillServiceOptions o = {}, Clock* clock = nullptr) {
    o.engine.model_dir = testing::TinyModelDir("llama");
    o.engine.threads = 1;
    if (o.engine.kv_blocks == 0) o.engine.kv_blocks = 64;
    if (clock != nullptr) o.clock = clock;
    o.transport = kvtransfer::NewLoopbackTransport();
    auto s = PrefillService::Create(std::move(o), &sink);
    REQUIRE(s.ok());
    svc = std::move(*s);
  }
  ~Harness() {
    svc.reset();  // Pulls after this would find no peer.
  }
  void Send(proto::Frame f) { svc->OnFrame(nullptr, std::move(f)); }
  bool WaitAllFree() {
    return svc->WaitForStats(
        [](const proto::WorkerStats& s) {
          return s.kv_blocks_free() == s.kv_blocks_total() && s.leased_blocks() == 0 &&
                 s.queued_requests() == 0 && s.running_requests() == 0;
        },
        kWait);
  }

  RecordingSink sink;
  std::unique_ptr<PrefillService> svc;
};

// f with `resume` as its resume_ids.
proto::Frame Resumed(proto::Frame f, std::initializer_list<int32_t> resume) {
  for (int32_t t : resume) f.mutable_prefill()->add_resume_ids(t);
  return f;
}

// The reason of request `id`'s Finish, once the router has it.
proto::FinishReason FinishReasonOf(Harness& h, uint64_t id) {
  auto fin = h.sink.WaitRouter(id, proto::Frame::kFinish);
  REQUIRE(fin.has_value());
  return fin->finish().reason();
}

// A decode's side of the data plane: pulls a handle's blocks into its own buffer.
struct Puller {
  explicit Puller(const std::string& exporter_address) : transport(kvtransfer::NewLoopbackTransport()) {
    peer = transport->Connect(exporter_address).value();
  }
  kvtransfer::TransferResult Pull(const proto::KvHandle& h, int64_t block_bytes, std::vector<float>* out) {
    out->assign(h.block_ids_size() * block_bytes / sizeof(float), -1.0f);
    auto region = transport->RegisterRegion(out->data(), out->size() * sizeof(float), 0).value();
    kvtransfer::PullRequest req{.peer = peer, .remote_region = h.region(), .local_region = region};
    for (int i = 0; i < h.block_ids_size(); ++i) {
      req.segments.push_back({static_cast<uint64_t>(h.block_ids(i) * block_bytes),
                              static_cast<uint64_t>(i * block_bytes), static_cast<uint64_t>(block_bytes)});
      req.block_epochs.push_back({h.block_ids(i), h.block_epochs(i)});
    }
    auto id = transport->Pull(req);
    REQUIRE(id.ok());
    kvtransfer::TransferResult r = transport->Wait(*id);
    REQUIRE(transport->DeregisterRegion(region).ok());
    return r;
  }
  kvtransfer::KvTransportPtr transport;
  kvtransfer::PeerId peer = 0;
};

// The reference: the single-process engine on the same model.
struct Reference {
  Reference()
      : backend(kernels::NewCpuBackend(1)),
        model(engine::Model::Load(testing::TinyModelDir("llama"), backend.get()).value()),
        pool(model->KvLayoutFor(16), 64) {}

  engine::GenerateResult FirstToken(const std::vector<int32_t>& tokens, const proto::GenerationSpec& spec) {
    engine::GenerateOptions opt;
    opt.max_tokens = 1;
    opt.ignore_eos = spec.ignore_eos();
    opt.choice_index = spec.choice_index();
    opt.sampling = spec::SamplingParams{.temperature = spec.sampling().temperature(),
                                          .top_k = spec.sampling().top_k(),
                                          .top_p = spec.sampling().top_p(),
                                          .seed = spec.sampling().seed(),
                                          .logprobs = spec.sampling().logprobs()};
    auto r = engine::Generate(*model, pool, tokens, opt);
    REQUIRE(r.ok());
    return *r;
  }

  // Largest |a - b| / (1 + |b|) over the KV of positions [0, n): `pulled`
  // holds the handle's blocks in order, compared with a local prefill.
  double KvError(const std::vector<int32_t>& tokens, const std::vector<float>& pulled) {
    engine::SequenceKv seq(&pool);
    REQUIRE(seq.Reserve(tokens.size()).ok());
    engine::BatchSeq b{.tokens = tokens, .start_pos = 0, .block_table = seq.block_table()};
    REQUIRE(model->Forward({b}, pool).ok());
    const kernels::KvLayout& l = pool.layout();
    std::vector<uint8_t> pool_bytes(static_cast<size_t>(pool.bytes()));
    REQUIRE(pool.buffer().Read(0, pool_bytes.data(), pool.bytes()).ok());
    double worst = 0;
    for (int64_t p = 0; p < static_cast<int64_t>(tokens.size()); ++p) {
      const int64_t i = p / l.block_size, slot = p % l.block_size;
      for (int64_t layer = 0; layer < l.num_layers; ++layer) {
        for (int64_t kv = 0; kv < 2; ++kv) {
          for (int64_t h = 0; h < l.num_kv_heads; ++h) {
            const auto* want =
                reinterpret_cast<const float*>(l.At(pool_bytes.data(), l.Offset(seq.block_table()[i], layer, kv, h, slot)));
            const float* got = pulled.data() + l.Offset(i, layer, kv, h, slot);
            for (int64_t d = 0; d < l.head_dim; ++d) {
              worst = std::max(worst, std::abs(double(got[d]) - want[d]) / (1.0 + std::abs(want[d])));
            }
          }
        }
      }
    }
    return worst;
  }

  kernels::KernelBackendPtr backend;
  std::unique_ptr<engine::Model> model;
  engine::BlockPool pool;
};

TEST_CASE("prefill: token 1 and KV equal the single-process engine's", "[prefill][service]") {
  // A budget of 24 chunks the 40-token prompt and batches the others with it.
  Harness h({.engine = {.token_budget = 24}});
  Reference ref;
  struct Case {
    uint64_t id;
    std::vector<int32_t> prompt;
    std::vector<int32_t> resume;
    int logprobs;
    uint32_t choice;
  };
  std::vector<Case> cases = {{11, Prompt(40, 1), {}, 3, 0},
                             {12, Prompt(9, 2), {}, 0, 1},
                             {13, Prompt(17, 3), {5, 77, 301}, 0, 0}};
  for (const Case& c : cases) {
    proto::Frame f = Request(c.id, c.prompt);
    f.mutable_prefill()->mutable_spec()->mutable_sampling()->set_logprobs(c.logprobs);
    f.mutable_prefill()->mutable_spec()->set_choice_index(c.choice);
    for (int32_t t : c.resume) f.mutable_prefill()->add_resume_ids(t);
    h.Send(f);
  }
  Puller puller(h.svc->Registration().data_address);
  const int64_t block_bytes = h.svc->pool().block_bytes();
  int64_t leased = 0;
  std::vector<proto::KvOffer> offers;
  for (const Case& c : cases) {
    INFO("request " << c.id);
    proto::Frame f = Request(c.id, c.prompt);
    f.mutable_prefill()->mutable_spec()->mutable_sampling()->set_logprobs(c.logprobs);
    f.mutable_prefill()->mutable_spec()->set_choice_index(c.choice);
    std::vector<int32_t> all = c.prompt;
    all.insert(all.end(), c.resume.begin(), c.resume.end());
    engine::GenerateResult want = ref.FirstToken(all, f.prefill().spec());

    auto first = h.sink.WaitRouter(c.id, proto::Frame::kFirstToken);
    REQUIRE(first.has_value());
    const proto::Token& tok = first->first_token().token();
    REQUIRE(first->first_token().worker_id() == "prefill-test");
    REQUIRE(tok.id() == want.ids[0]);
    REQUIRE(tok.logprob() == Approx(want.logprobs[0]).margin(1e-4));
    REQUIRE(tok.top_size() == c.logprobs);
    for (int i = 0; i < tok.top_size(); ++i) REQUIRE(tok.top(i).id() == want.top_logprobs[0][i].first);

    auto offer = h.sink.WaitOffer(c.id);
    REQUIRE(offer.has_value());
    std::vector<int32_t> gen(offer->generated_ids().begin(), offer->generated_ids().end());
    std::vector<int32_t> want_gen = c.resume;
    want_gen.push_back(tok.id());
    REQUIRE(gen == want_gen);
    REQUIRE(offer->spec().prompt_ids_size() == static_cast<int>(c.prompt.size()));
    const proto::KvHandle& hd = offer->handle();
    REQUIRE(hd.worker_id() == "prefill-test");
    REQUIRE(hd.control_address() == "127.0.0.1:7000");
    REQUIRE(hd.data_address() == h.svc->Registration().data_address);
    REQUIRE(hd.num_tokens() == static_cast<int64_t>(all.size()));
    REQUIRE(hd.block_ids_size() == static_cast<int>((all.size() + 15) / 16));
    REQUIRE(hd.block_epochs_size() == hd.block_ids_size());
    REQUIRE(hd.lease_ms() == 60000);
    REQUIRE(hd.layout().dtype() == "f32");
    REQUIRE(hd.layout().block_size() == 16);
    REQUIRE(hd.layout().num_layers() == ref.model->config().num_layers);
    REQUIRE(hd.layout().head_end() == ref.model->config().num_kv_heads);
    leased += hd.block_ids_size();

    std::vector<float> kv;
    kvtransfer::TransferResult r = puller.Pull(hd, block_bytes, &kv);
    REQUIRE(r.state == kvtransfer::TransferState::kDone);
    REQUIRE(ref.KvError(all, kv) < 1e-4);
    offers.push_back(*offer);
  }
  REQUIRE(h.svc->WaitForStats([&](const proto::WorkerStats& s) { return s.leased_blocks() == leased; }, kWait));
  proto::WorkerStats st = h.svc->Stats();
  REQUIRE(st.role() == proto::ROLE_PREFILL);
  REQUIRE(st.worker_id() == "prefill-test");
  REQUIRE(st.kv_blocks_free() == 64 - leased);
  REQUIRE(st.prompt_tokens_computed() == 40 + 9 + 20);

  for (const proto::KvOffer& o : offers) h.Send(Released(o.request_id()));
  REQUIRE(h.WaitAllFree());
  st = h.svc->Stats();
  REQUIRE(st.kv_blocks_transferred() == leased);
  REQUIRE(st.kv_bytes_moved() == static_cast<uint64_t>(leased * block_bytes));
  // A pull after the release sees the bumped epochs, never stale data.
  std::vector<float> kv;
  REQUIRE(puller.Pull(offers[0].handle(), block_bytes, &kv).state == kvtransfer::TransferState::kLeaseExpired);
  for (const Case& c : cases) REQUIRE(h.sink.CountFor(c.id) == 2);  // FirstToken + KvOffer only

  const std::string metrics = MetricsRegistry::Default().RenderText();
  REQUIRE(metrics.find("duet_requests_waiting{role=\"prefill\",worker=\"prefill-test\"} 0") != std::string::npos);
  REQUIRE(metrics.find("duet_kv_cache_usage_ratio{role=\"prefill\",worker=\"prefill-test\"} 0") != std::string::npos);
  REQUIRE(metrics.find("duet_request_queue_time_seconds_count{role=\"prefill\"}") != std::string::npos);
}

TEST_CASE("prefill: a first token that ends the request finishes it here", "[prefill][service]") {
  Harness h;
  Reference ref;
  const auto prompt = Prompt(20, 4);
  h.Send(Request(21, prompt, /*max_tokens=*/1));
  REQUIRE(FinishReasonOf(h, 21) == proto::FINISH_LENGTH);
  REQUIRE(h.sink.WaitRouter(21, proto::Frame::kFirstToken).has_value());

  // A stop id equal to the token it will sample.
  proto::Frame f = Request(22, prompt);
  const int32_t want = ref.FirstToken(prompt, f.prefill().spec()).ids[0];
  f.mutable_prefill()->mutable_spec()->add_stop_token_ids(want);
  h.Send(f);
  REQUIRE(FinishReasonOf(h, 22) == proto::FINISH_STOP);
  REQUIRE(h.sink.WaitRouter(22, proto::Frame::kFirstToken)->first_token().token().id() == want);
  REQUIRE(h.WaitAllFree());
  REQUIRE(h.sink.CountFor(21) == 2);
  REQUIRE(h.sink.CountFor(22) == 2);
}

TEST_CASE("prefill: a resumed request whose last token already ended it finishes at once", "[prefill][service]") {
  // The attempt that sampled the EOS (or stop id) died before its Finish
  // reached the router, which resumed with every token the client has.
  Harness h;
  Reference ref;
  const int32_t eos = ref.model->config().eos_token_ids.at(0);
  const auto prompt = Prompt(12, 5);
  proto::Frame f = Request(31, prompt, /*max_tokens=*/8);
  f.mutable_prefill()->mutable_spec()->set_ignore_eos(false);
  h.Send(Resumed(f, {7, 9, eos}));
  CHECK(FinishReasonOf(h, 31) == proto::FINISH_STOP);
  // A stop id ends it regardless of ignore_eos.
  f = Request(32, prompt, /*max_tokens=*/8);
  f.mutable_prefill()->mutable_spec()->add_stop_token_ids(9);
  h.Send(Resumed(f, {7, 9}));
  CHECK(FinishReasonOf(h, 32) == proto::FINISH_STOP);
  // With ignore_eos, or an EOS before min_tokens, the EOS does not end it:
  // the prefill computes its next token.
  f = Request(33, prompt, /*max_tokens=*/8);
  h.Send(Resumed(f, {7, eos}));
  REQUIRE(h.sink.WaitRouter(33, proto::Frame::kFirstToken).has_value());
  f = Request(34, prompt, /*max_tokens=*/8);
  f.mutable_prefill()->mutable_spec()->set_ignore_eos(false);
  f.mutable_prefill()->mutable_spec()->set_min_tokens(3);
  h.Send(Resumed(f, {7, eos}));
  REQUIRE(h.sink.WaitRouter(34, proto::Frame::kFirstToken).has_value());
  for (uint64_t id : {33, 34}) {
    auto offer = h.sink.WaitOffer(id);
    REQUIRE(offer.has_value());
    h.Send(Released(id));
  }
  REQUIRE(h.WaitAllFree());
  CHECK(h.sink.CountFor(31) == 1);  // The Finish alone: nothing computed.
  CHECK(h.sink.CountFor(32) == 1);
  CHECK(h.svc->Stats().prompt_tokens_computed() == 2 * (12 + 2));
}

TEST_CASE("prefill: a resumed request whose max_tokens-th token is an EOS stops, not length", "[prefill][service]") {
  // Every token the client asked for is resumed and the last is an EOS:
  // the one finish rule says STOP (a guard on the count alone said LENGTH,
  // or refused the request as having nothing left to generate).
  Harness h;
  Reference ref;
  const int32_t eos = ref.model->config().eos_token_ids.at(0);
  proto::Frame f = Request(41, Prompt(12, 5), /*max_tokens=*/3);
  f.mutable_prefill()->mutable_spec()->set_ignore_eos(false);
  h.Send(Resumed(f, {7, 9, eos}));
  CHECK(FinishReasonOf(h, 41) == proto::FINISH_STOP);
  // The same count ending on an ordinary token is LENGTH.
  f = Request(42, Prompt(12, 5), /*max_tokens=*/3);
  f.mutable_prefill()->mutable_spec()->set_ignore_eos(false);
  h.Send(Resumed(f, {7, 9, 11}));
  CHECK(FinishReasonOf(h, 42) == proto::FINISH_LENGTH);
  CHECK(h.sink.CountFor(41) == 1);  // The Finish alone: nothing computed.
  CHECK(h.sink.CountFor(42) == 1);
  CHECK(h.svc->Stats().prompt_tokens_computed() == 0);
}

TEST_CASE("prefill: invalid requests get INVALID_ARGUMENT", "[prefill][service]") {
  Harness h;
  auto expect = [&](uint64_t id, proto::Frame f, const std::string& needle) {
    f.mutable_prefill()->set_request_id(id);
    h.Send(f);
    auto fin = h.sink.WaitRouter(id, proto::Frame::kFinish);
    REQUIRE(fin.has_value());
    REQUIRE(fin->finish().reason() == proto::FINISH_ERROR);
    REQUIRE(fin->finish().error_code() == static_cast<int>(absl::StatusCode::kInvalidArgument));
    INFO(fin->finish().error());
    REQUIRE(fin->finish().error().find(needle) != std::string::npos);
  };
  expect(31, Request(0, {}), "prompt is empty");
  expect(32, Request(0, {1, 2, 5000}), "outside the vocabulary");
  expect(33, Request(0, Prompt(1025, 1)), "more than the model's context of 1024");
  proto::Frame f = Request(0, Prompt(4, 1));
  f.mutable_prefill()->mutable_spec()->mutable_sampling()->set_top_p(0);
  expect(34, f, "top_p");
  REQUIRE(h.svc->Stats().queued_requests() == 0);
}

TEST_CASE("prefill: requests wait for leased blocks; a full queue rejects; cancel frees",
          "[prefill][service]") {
  Harness h({.engine = {.kv_blocks = 4}, .max_queued_requests = 1});
  h.Send(Request(41, Prompt(60, 5)));  // All 4 blocks, then leased.
  REQUIRE(h.sink.WaitOffer(41).has_value());
  h.Send(Request(42, Prompt(10, 6)));  // Waits for a block.
  REQUIRE(h.svc->WaitForStats([](const proto::WorkerStats& s) { return s.queued_requests() == 1; }, kWait));
  REQUIRE(h.svc->Stats().queued_prefill_tokens() == 10);
  REQUIRE(h.svc->Stats().last_request_id() == 42);  // The router's charges up to 42 are in these numbers.
  h.Send(Request(43, Prompt(5, 7)));  // The queue is full.
  auto fin = h.sink.WaitRouter(43, proto::Frame::kFinish);
  REQUIRE(fin.has_value());
  REQUIRE(fin->finish().error_code() == static_cast<int>(absl::StatusCode::kResourceExhausted));
  REQUIRE(fin->finish().error() == "prefill queue full");

  h.Send(CancelFrame(42));  // Queued: dropped silently.
  REQUIRE(h.svc->WaitForStats([](const proto::WorkerStats& s) { return s.queued_requests() == 0; }, kWait));
  h.Send(Request(44, Prompt(10, 8)));
  REQUIRE(h.svc->WaitForStats([](const proto::WorkerStats& s) { return s.queued_requests() == 1; }, kWait));
  h.Send(Released(41));  // Blocks come back; 44 runs.
  REQUIRE(h.sink.WaitOffer(44).has_value());
  h.Send(CancelFrame(44));  // Leased: the lease is cancelled, blocks freed.
  REQUIRE(h.WaitAllFree());
  REQUIRE(h.sink.CountFor(42) == 0);
  REQUIRE(h.sink.CountFor(44) == 2);
}

TEST_CASE("prefill: an unreachable decode ends the request with UNAVAILABLE", "[prefill][service]") {
  Harness h;
  proto::Frame f = Request(51, Prompt(30, 9));
  f.mutable_prefill()->set_decode_address(kDeadDecode);
  h.Send(f);
  auto fin = h.sink.WaitRouter(51, proto::Frame::kFinish);
  REQUIRE(fin.has_value());
  REQUIRE(fin->finish().reason() == proto::FINISH_ERROR);
  REQUIRE(fin->finish().error_code() == static_cast<int>(absl::StatusCode::kUnavailable));
  REQUIRE(fin->finish().error().find(std::string("decode ") + kDeadDecode + " unreachable") != std::string::npos);
  REQUIRE(h.WaitAllFree());
}

TEST_CASE("prefill: an expired lease frees its blocks and fails late pulls", "[prefill][service]") {
  FakeClock clock;
  Harness h({.lease_duration = absl::Seconds(5)}, &clock);
  h.Send(Request(61, Prompt(33, 10)));
  auto offer = h.sink.WaitOffer(61);
  REQUIRE(offer.has_value());
  REQUIRE(offer->handle().lease_ms() == 5000);
  REQUIRE(h.svc->WaitForStats([](const proto::WorkerStats& s) { return s.leased_blocks() == 3; }, kWait));
  clock.Advance(absl::Seconds(5));
  REQUIRE(h.WaitAllFree());  // The engine loop's periodic ExpireDue.
  Puller puller(h.svc->Registration().data_address);
  std::vector<float> kv;
  REQUIRE(puller.Pull(offer->handle(), h.svc->pool().block_bytes(), &kv).state ==
          kvtransfer::TransferState::kLeaseExpired);
  h.Send(Released(61));  // Late: harmless.
  REQUIRE(h.WaitAllFree());
  REQUIRE(h.svc->Stats().kv_bytes_moved() == 0);
}

TEST_CASE("prefill: router loss drops queued work; leases stay until released", "[prefill][service]") {
  Harness h({.engine = {.kv_blocks = 4}});
  h.Send(Request(71, Prompt(60, 11)));
  REQUIRE(h.sink.WaitOffer(71).has_value());
  h.Send(Request(72, Prompt(10, 12)));
  REQUIRE(h.svc->WaitForStats([](const proto::WorkerStats& s) { return s.queued_requests() == 1; }, kWait));
  REQUIRE(h.svc->Stats().last_request_id() == 72);
  h.svc->OnRouterLost();
  REQUIRE(h.svc->WaitForStats(
      [](const proto::WorkerStats& s) { return s.queued_requests() == 0 && s.leased_blocks() == 4; }, kWait));
  REQUIRE(h.svc->Stats().last_request_id() == 0);  // The next router's ids start afresh.
  h.Send(Released(71));
  REQUIRE(h.WaitAllFree());
  REQUIRE(h.sink.CountFor(72) == 0);

  proto::Frame req;
  req.mutable_stats_request();
  h.Send(req);  // No connection given: the reply goes to the router.
}

TEST_CASE("prefill: registration describes the pool and the model", "[prefill][service]") {
  Harness h({.engine = {.served_model_name = "tiny-llama", .kv_blocks = 32}});
  worker::RegistrationInfo r = h.svc->Registration();
  REQUIRE(r.role == proto::ROLE_PREFILL);
  REQUIRE(r.model == "tiny-llama");
  REQUIRE(r.transport == "loopback");
  REQUIRE(!r.data_address.empty());
  REQUIRE(r.kv_blocks_total == 32);
  REQUIRE(r.max_model_len == 1024);
  REQUIRE(r.layout.layer_end() == r.layout.num_layers());
  REQUIRE(r.layout.head_dim() == h.svc->model_config().head_dim);
}

}  // namespace
}  // namespace duet::prefill
