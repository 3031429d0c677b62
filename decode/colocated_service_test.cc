// ColocatedService in-process, the test playing the router: PrefillRequests
// in, FirstToken / TokenBatch / Finish out, equal to engine::Generate token
// for token, with chunked prefill mixed into running decodes, preemption
// and cancellation.
#include "decode/colocated_service.h"

#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "decode/fake_frame_sink.h"
#include "decode/service_test_util.h"
#include "kernels/cpu/cpu_backend.h"
#include "engine/testing/tiny_model.h"
#include "proto/frame.h"

namespace duet::decode {
namespace {

engine::Model& ReferenceModel() { return SharedTinyModel("qwen2"); }

struct Colocated : ServiceFixture<ColocatedService> {
  explicit Colocated(int64_t kv_blocks, int64_t token_budget = 2048, int64_t max_running = 256) {
    ColocatedOptions o;
    o.max_running = max_running;
    Create(std::move(o), "qwen2", kv_blocks, token_budget);
  }

  void Send(uint64_t id, const proto::GenerationSpec& spec, const std::vector<int32_t>& resume = {}) {
    specs[id] = spec;
    proto::Frame f = proto::NewFrame();
    f.mutable_prefill()->set_request_id(id);
    *f.mutable_prefill()->mutable_spec() = spec;
    for (int32_t t : resume) f.mutable_prefill()->add_resume_ids(t);
    service->OnFrame(nullptr, f);
  }
};

TEST_CASE("colocated: chunked prefill mixed with decodes equals Generate", "[colocated]") {
  Colocated c(256, /*token_budget=*/16);
  // A short request starts decoding, then long prompts prefill 16 tokens a
  // step (less the decodes) while it goes on.
  c.Send(1, TestSpec(TestPrompt(6, 1), 30, /*greedy=*/true));
  REQUIRE(c.sink.WaitForRouter([](const FakeFrameSink::Frames& fs) { return !fs.empty(); }));
  c.Send(2, TestSpec(TestPrompt(90, 2), 12, /*greedy=*/false, /*seed=*/5, /*logprobs=*/2));
  proto::GenerationSpec eos = TestSpec(TestPrompt(45, 3), 25, false, 9, 0);
  eos.set_ignore_eos(false);
  c.Send(3, eos);
  c.Send(4, TestSpec(TestPrompt(3, 4), 10, true, 0, 4));
  REQUIRE(c.WaitFinishes(4));

  const auto frames = c.sink.router();
  auto out = CollectRouterFrames(frames);
  int64_t prompt_tokens = 0;
  for (const auto& [id, spec] : c.specs) {
    INFO("request " << id);
    REQUIRE(out[id].first_tokens == 1);
    REQUIRE(frames.size() > 0);
    CheckAgainstReference(out[id], ReferenceRun(ReferenceModel(), spec), 0);
    prompt_tokens += spec.prompt_ids_size();
  }
  // Request 1 kept decoding while request 2's 90 prompt tokens went through
  // in chunks: several of its tokens lie between 2's arrival and 2's first token.
  int tokens_of_1_before_2 = 0;
  for (const proto::Frame& f : frames) {
    if (f.has_first_token() && f.first_token().request_id() == 2) break;
    for (const auto& e : f.tokens().events()) tokens_of_1_before_2 += e.request_id() == 1;
  }
  REQUIRE(tokens_of_1_before_2 >= 5);
  // The first-token frame names this worker.
  for (const proto::Frame& f : frames) {
    if (f.has_first_token()) REQUIRE(f.first_token().worker_id() == "decode-test");
  }

  proto::WorkerStats s = c.service->Stats();
  REQUIRE(s.role() == proto::ROLE_COLOCATED);
  REQUIRE(s.kv_blocks_free() == 256);
  REQUIRE(s.prompt_tokens_computed() == prompt_tokens);
  REQUIRE(s.preemptions() == 0);
  REQUIRE(s.kv_bytes_moved() == 0);
  REQUIRE(s.queued_prefill_tokens() == 0);
}

TEST_CASE("colocated: resume_ids continue a request where it stopped", "[colocated]") {
  Colocated c(64);
  const proto::GenerationSpec spec = TestSpec(TestPrompt(25, 7), 12, false, 11, 1);
  const engine::GenerateResult ref = ReferenceRun(ReferenceModel(), spec);
  c.Send(1, spec, {ref.ids[0], ref.ids[1], ref.ids[2]});
  auto out = c.Finished(1);
  REQUIRE(out[1].first_tokens == 1);
  CheckAgainstReference(out[1], ref, /*skip=*/3);  // The first token is ref's 4th.
  REQUIRE(c.service->Stats().prompt_tokens_computed() == 25 + 3);
}

int32_t Eos() { return ReferenceModel().config().eos_token_ids.at(0); }

// A sampled request of `max_tokens` that stops at an EOS.
proto::GenerationSpec StopsAtEos(int max_tokens) {
  proto::GenerationSpec spec = TestSpec(TestPrompt(25, 7), max_tokens, false, 11, 1);
  spec.set_ignore_eos(false);
  return spec;
}

// A resumed request that ended without running: no token, a Finish.
void CheckEndedAtOnce(const RequestFrames& r) {
  CHECK(r.first_tokens == 0);
  CHECK(r.tokens.empty());
  REQUIRE(r.finish.has_value());
}

TEST_CASE("colocated: a resumed request whose last token already ended it finishes at once", "[colocated]") {
  // The attempt that sampled the EOS died before its Finish reached the router.
  Colocated c(64);
  proto::GenerationSpec spec = StopsAtEos(12);
  c.Send(1, spec, {5, 6, Eos()});
  // With ignore_eos the EOS is a token like any other: it goes on.
  spec.set_ignore_eos(true);
  c.Send(2, spec, {5, 6, Eos()});
  auto out = c.Finished(2);
  CheckEndedAtOnce(out[1]);
  CHECK(out[1].finish->reason() == proto::FINISH_STOP);
  CHECK(out[2].first_tokens == 1);
  CHECK(out[2].tokens.size() == 12 - 3);
  CHECK(c.service->Stats().prompt_tokens_computed() == 25 + 3);
}

TEST_CASE("colocated: a resumed request whose max_tokens-th token is an EOS stops, not length", "[colocated]") {
  Colocated c(64);
  const proto::GenerationSpec spec = StopsAtEos(3);
  c.Send(1, spec, {5, 6, Eos()});
  c.Send(2, spec, {5, 6, 8});
  auto out = c.Finished(2);
  for (uint64_t id : {1, 2}) CheckEndedAtOnce(out[id]);
  CHECK(out[1].finish->reason() == proto::FINISH_STOP);
  CHECK(out[2].finish->reason() == proto::FINISH_LENGTH);
  CHECK(c.service->Stats().prompt_tokens_computed() == 0);
}

TEST_CASE("colocated: a pool too small preempts, outputs unchanged", "[colocated]") {
  Colocated c(10, /*token_budget=*/32);
  for (uint64_t id = 1; id <= 4; ++id) {
    c.Send(id, TestSpec(TestPrompt(15 + static_cast<int>(id), static_cast<int>(id)), 40, id % 2 == 0, id, 1));
  }
  auto out = c.Finished(4);
  for (const auto& [id, spec] : c.specs) {
    INFO("request " << id);
    REQUIRE(out[id].first_tokens == 1);
    CheckAgainstReference(out[id], ReferenceRun(ReferenceModel(), spec), 0);
  }
  proto::WorkerStats s = c.service->Stats();
  REQUIRE(s.preemptions() > 0);
  REQUIRE(s.kv_blocks_free() == 10);
}

TEST_CASE("colocated: cancel, invalid requests, router loss", "[colocated]") {
  Colocated c(80, 2048, /*max_running=*/1);
  c.Send(1, TestSpec(TestPrompt(10, 1), kUntilContextEnd, true));  // Runs to the context's end unless cancelled.
  c.Send(2, TestSpec(TestPrompt(10, 2), 5, true));  // Waits behind it.
  REQUIRE(c.sink.WaitForRouter([](const FakeFrameSink::Frames& fs) { return !fs.empty(); }));
  c.Cancel(2);
  c.Cancel(1);
  c.service->Sync();
  c.service->Sync();
  const size_t frames = c.sink.router().size();
  proto::WorkerStats s = c.service->Stats();
  REQUIRE(s.kv_blocks_free() == 80);
  REQUIRE(s.running_requests() == 0);
  REQUIRE(s.queued_requests() == 0);
  REQUIRE(s.last_request_id() == 2);  // What the router's charges compare with.

  // Refused with the field named; nothing queued.
  proto::GenerationSpec bad = TestSpec({5, 2000}, 5, true);  // 2000 is outside the vocabulary.
  c.Send(3, bad);
  proto::GenerationSpec long_prompt = TestSpec(TestPrompt(1024, 4), 5, true);  // No room in the context.
  c.Send(4, long_prompt);
  c.Cancel(5);
  c.Send(5, TestSpec(TestPrompt(10, 5), 5, true));  // Cancelled before it came.
  c.service->Sync();
  c.service->Sync();
  auto out = CollectRouterFrames(c.sink.router());
  REQUIRE(out[3].finish->reason() == proto::FINISH_ERROR);
  REQUIRE(out[3].finish->error_code() == static_cast<int>(absl::StatusCode::kInvalidArgument));
  REQUIRE(out[3].finish->error().find("2000") != std::string::npos);
  REQUIRE(out[4].finish->error().find("context") != std::string::npos);
  REQUIRE(out.count(5) == 0);
  REQUIRE(c.sink.router().size() == frames + 2);
  REQUIRE(!out[1].finish.has_value());
  REQUIRE(out.count(2) == 0);
  REQUIRE(c.service->Stats().last_request_id() == 5);  // Taken in, though refused.

  // The router goes away mid-request: everything is dropped, silently.
  c.Send(6, TestSpec(TestPrompt(10, 6), kUntilContextEnd, true));
  REQUIRE(c.sink.WaitForRouter([](const FakeFrameSink::Frames& fs) {
    for (const auto& f : fs) {
      if (f.has_first_token() && f.first_token().request_id() == 6) return true;
    }
    return false;
  }));
  c.service->OnRouterLost();
  c.service->Sync();
  REQUIRE(c.service->Stats().kv_blocks_free() == 80);
  REQUIRE(c.service->Stats().last_request_id() == 0);
  REQUIRE(CountFinishes(c.sink.router()) == 2);

  worker::RegistrationInfo r = c.service->Registration();
  REQUIRE(r.role == proto::ROLE_COLOCATED);
  REQUIRE(r.kv_blocks_total == 80);
  REQUIRE(r.transport.empty());
}

}  // namespace
}  // namespace duet::decode
