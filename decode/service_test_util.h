// Helpers for the batch engine, decode and colocated service tests: the
// tiny model loaded once, prompts, the engine::Generate reference, a service
// fixture on the tiny model, and the per-request view of the frames a
// service sent to the router.
//
//   auto ref = ReferenceRun(model, prompt, spec);
//   auto out = CollectRouterFrames(sink.router());
//   CheckTokens(out[id].tokens, ref, /*skip=*/1);
#ifndef DUET_DECODE_SERVICE_TEST_UTIL_H_
#define DUET_DECODE_SERVICE_TEST_UTIL_H_

#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "decode/engine_loop.h"
#include "decode/fake_frame_sink.h"
#include "engine/generator.h"
#include "engine/model.h"
#include "engine/testing/tiny_model.h"
#include "kernels/cpu/cpu_backend.h"
#include "proto/control.pb.h"
#include "proto/frame.h"

namespace duet::decode {

// The tiny model of `arch` on a CPU backend of `threads` threads, loaded once
// per binary for each (arch, threads).
inline engine::Model& SharedTinyModel(const std::string& arch, int threads = 1) {
  struct Loaded {
    kernels::KernelBackendPtr backend;
    std::unique_ptr<engine::Model> model;
  };
  static absl::Mutex mu;
  static auto* loaded = new std::map<std::pair<std::string, int>, Loaded>();
  absl::MutexLock lock(&mu);
  Loaded& l = (*loaded)[{arch, threads}];
  if (l.model == nullptr) {
    l.backend = kernels::NewCpuBackend(threads);
    auto m = engine::Model::Load(testing::TinyModelDir(arch), l.backend.get());
    REQUIRE(m.ok());
    l.model = std::move(*m);
  }
  return *l.model;
}

inline std::vector<int32_t> TestPrompt(int n, int salt) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 37 + salt * 101 + 11) % 900 + 3;
  return p;
}

// A max_tokens more than any context leaves: the request runs to the context's end.
inline constexpr int kUntilContextEnd = 1 << 20;

inline proto::GenerationSpec TestSpec(const std::vector<int32_t>& prompt, int max_tokens, bool greedy,
                                      uint64_t seed = 0, int logprobs = 0) {
  proto::GenerationSpec s;
  for (int32_t t : prompt) s.add_prompt_ids(t);
  s.set_max_tokens(max_tokens);
  s.set_ignore_eos(true);
  proto::SamplingParams* p = s.mutable_sampling();
  if (greedy) {
    p->set_temperature(0);
    p->set_top_p(1);  // The router's "off"; proto3's 0 would be invalid.
  } else {
    p->set_temperature(0.9f);
    p->set_top_k(40);
    p->set_top_p(0.95f);
    p->set_seed(seed);
    s.set_choice_index(static_cast<uint32_t>(seed % 2));
  }
  p->set_logprobs(logprobs);
  return s;
}

// engine::Generate for what `spec` asks, on its own pool.
inline engine::GenerateResult ReferenceRun(engine::Model& model, const proto::GenerationSpec& spec) {
  absl::StatusOr<GenerationParams> p =
      DecodeParams(spec, model.config(), spec.prompt_ids_size());
  REQUIRE(p.ok());
  engine::BlockPool pool(model.KvLayoutFor(16), 80);
  engine::GenerateOptions o;
  static_cast<spec::GenerationParams&>(o) = *p;
  std::vector<int32_t> prompt(spec.prompt_ids().begin(), spec.prompt_ids().end());
  auto r = engine::Generate(model, pool, prompt, o);
  REQUIRE(r.ok());
  return *r;
}

struct RequestFrames {
  std::vector<proto::Token> tokens;  // FirstToken (if any), then TokenBatch events, in order.
  int first_tokens = 0;
  std::optional<proto::Finish> finish;
  int frames_after_finish = 0;
};

// Also checks that no TokenBatch carries two tokens of one request (one
// token per request per step).
inline std::map<uint64_t, RequestFrames> CollectRouterFrames(const std::vector<proto::Frame>& frames) {
  std::map<uint64_t, RequestFrames> out;
  for (const proto::Frame& f : frames) {
    REQUIRE(f.protocol_version() == proto::PROTOCOL_VERSION_CURRENT);
    if (f.has_first_token()) {
      RequestFrames& r = out[f.first_token().request_id()];
      if (r.finish) ++r.frames_after_finish;
      r.tokens.push_back(f.first_token().token());
      ++r.first_tokens;
    } else if (f.has_tokens()) {
      std::set<uint64_t> ids;
      for (const proto::TokenEvent& e : f.tokens().events()) {
        REQUIRE(ids.insert(e.request_id()).second);
        RequestFrames& r = out[e.request_id()];
        if (r.finish) ++r.frames_after_finish;
        r.tokens.push_back(e.token());
      }
    } else if (f.has_finish()) {
      RequestFrames& r = out[f.finish().request_id()];
      if (r.finish) ++r.frames_after_finish;
      r.finish = f.finish();
    }
  }
  return out;
}

inline size_t CountFinishes(const std::vector<proto::Frame>& frames) {
  size_t n = 0;
  for (const proto::Frame& f : frames) n += f.has_finish() ? 1 : 0;
  return n;
}

// A Service (DecodeService or ColocatedService) on the tiny model, with the
// sink it sends to; the test plays the router.
template <typename Service>
struct ServiceFixture {
  // Creates the service from `o` with its engine on the tiny `arch` model,
  // served as "tiny", one thread.
  template <typename Options>
  void Create(Options o, const std::string& arch, int64_t kv_blocks, int64_t token_budget) {
    o.engine.model_dir = testing::TinyModelDir(arch);
    o.engine.served_model_name = "tiny";
    o.engine.threads = 1;
    o.engine.kv_blocks = kv_blocks;
    o.engine.token_budget = token_budget;
    auto s = Service::Create(std::move(o), &sink);
    REQUIRE(s.ok());
    service = std::move(*s);
  }

  void Cancel(uint64_t id) {
    proto::Frame f = proto::NewFrame();
    f.mutable_cancel()->set_request_id(id);
    service->OnFrame(nullptr, f);
  }
  bool WaitFinishes(size_t n) {
    return sink.WaitForRouter([n](const FakeFrameSink::Frames& fs) { return CountFinishes(fs) >= n; });
  }
  // The router's frames per request, once `n` requests have finished.
  std::map<uint64_t, RequestFrames> Finished(size_t n) {
    REQUIRE(WaitFinishes(n));
    return CollectRouterFrames(sink.router());
  }

  FakeFrameSink sink;
  std::unique_ptr<Service> service;
  std::map<uint64_t, proto::GenerationSpec> specs;
};

// `tokens` equal ref's generated tokens from index `skip` on: ids exactly,
// logprobs and top logprobs within 1e-4; the finish reason matches.
inline void CheckAgainstReference(const RequestFrames& got, const engine::GenerateResult& ref, size_t skip) {
  REQUIRE(got.finish.has_value());
  REQUIRE(got.frames_after_finish == 0);
  REQUIRE(got.finish->reason() == (ref.finish_reason == "stop" ? proto::FINISH_STOP : proto::FINISH_LENGTH));
  REQUIRE(got.tokens.size() + skip == ref.ids.size());
  for (size_t i = 0; i < got.tokens.size(); ++i) {
    INFO("token " << i + skip);
    const proto::Token& t = got.tokens[i];
    REQUIRE(t.id() == ref.ids[i + skip]);
    REQUIRE(std::abs(t.logprob() - ref.logprobs[i + skip]) < 1e-4);
    const auto& top = ref.top_logprobs[i + skip];
    REQUIRE(static_cast<size_t>(t.top_size()) == top.size());
    for (int k = 0; k < t.top_size(); ++k) {
      REQUIRE(t.top(k).id() == top[k].first);
      REQUIRE(std::abs(t.top(k).logprob() - top[k].second) < 1e-4);
    }
  }
}

}  // namespace duet::decode

#endif  // DUET_DECODE_SERVICE_TEST_UTIL_H_
