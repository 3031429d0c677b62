#include "tests/serving_util.h"

#include <cmath>
#include <random>
#include <sstream>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "engine/block_pool.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "http/client.h"
#include "http/sse.h"
#include "kernels/cpu/cpu_backend.h"

namespace duet::testing {

std::vector<TestRequest> MixedRequests(int n, int vocab, int max_prompt, int max_tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TestRequest> out;
  for (int i = 0; i < n; ++i) {
    TestRequest r;
    int len = 1 + static_cast<int>(rng() % max_prompt);
    for (int t = 0; t < len; ++t) r.prompt.push_back(static_cast<int32_t>(rng() % (vocab - 8)));
    r.max_tokens = 1 + static_cast<int>(rng() % max_tokens);
    switch (i % 4) {
      case 0: r.temperature = 0; break;
      case 1: r.temperature = 0; r.logprobs = 5; break;
      case 2: r.temperature = 1; r.seed = 1000 + i; break;
      case 3: r.temperature = 1; r.seed = 7 * i + 3; r.logprobs = 2; break;
    }
    r.stream = (i / 4) % 2 == 1;
    r.ignore_eos = i % 7 != 0;
    out.push_back(r);
  }
  return out;
}

std::string CompletionBody(const TestRequest& r, const std::string& model) {
  nlohmann::json j = {{"model", model},          {"prompt", r.prompt},       {"max_tokens", r.max_tokens},
                      {"temperature", r.temperature}, {"seed", r.seed},     {"stream", r.stream},
                      {"ignore_eos", r.ignore_eos}};
  if (r.logprobs > 0) j["logprobs"] = r.logprobs;
  j.update(r.extra);
  return j.dump();
}

namespace {
void Absorb(const nlohmann::json& choice, ParsedCompletion& out) {
  if (choice.contains("token_ids")) {
    for (const auto& id : choice["token_ids"]) out.ids.push_back(id.get<int32_t>());
  }
  if (choice.contains("logprobs") && choice["logprobs"].is_object()) {
    const auto& lp = choice["logprobs"];
    for (const auto& v : lp["token_logprobs"]) out.token_logprobs.push_back(v.is_number() ? v.get<double>() : NAN);
    for (const auto& top : lp["top_logprobs"]) {
      std::vector<double> vals;
      if (top.is_object()) {
        for (auto it = top.begin(); it != top.end(); ++it) vals.push_back(it.value().get<double>());
      }
      out.top_logprobs.push_back(vals);
    }
  }
  if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
    out.finish_reason = choice["finish_reason"];
  }
}
}  // namespace

ParsedCompletion ParseCompletion(const std::string& body, bool stream, int index) {
  ParsedCompletion out;
  if (!stream) {
    auto j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_discarded()) {
      out.error = "not JSON: " + body.substr(0, 200);
    } else if (j.contains("error")) {
      out.error = j["error"].dump();
    } else {
      bool found = false;
      for (const auto& c : j["choices"]) {
        if (c.value("index", -1) == index) {
          Absorb(c, out);
          found = true;
        }
      }
      if (!found) out.error = absl::StrCat("no choice ", index);
      if (j.contains("usage")) out.cached_tokens = j["usage"]["prompt_tokens_details"].value("cached_tokens", -1);
    }
    return out;
  }
  bool done = false;
  http::SseParser events;
  events.Feed(body, [&](absl::string_view data) {
    if (data == "[DONE]") {
      done = true;
      return;
    }
    auto j = nlohmann::json::parse(data.begin(), data.end(), nullptr, false);
    if (j.is_discarded()) {
      out.error = absl::StrCat("bad SSE data: ", data.substr(0, 200));
    } else if (j.contains("error")) {
      out.error = j["error"].dump();
    } else if (j.contains("choices") && !j["choices"].empty() && j["choices"][0].value("index", -1) == index) {
      Absorb(j["choices"][0], out);
    }
  });
  if (!done && out.error.empty()) out.error = "stream ended without [DONE]";
  return out;
}

std::vector<engine::GenerateResult> ReferenceOutputs(const std::string& model_dir,
                                                     const std::vector<TestRequest>& requests) {
  return ReferenceOutputs(model_dir, requests, {}, {});
}

std::vector<engine::GenerateResult> ReferenceOutputs(const std::string& model_dir,
                                                     const std::vector<TestRequest>& requests,
                                                     const engine::LoadOptions& prefill,
                                                     const engine::LoadOptions& decode) {
  auto backend = kernels::NewCpuBackend(2);
  auto decode_model = engine::Model::Load(model_dir, backend.get(), decode);
  auto prefill_model = engine::Model::Load(model_dir, backend.get(), prefill);
  if (!decode_model.ok() || !prefill_model.ok()) std::abort();
  engine::BlockPool pool((*decode_model)->KvLayoutFor(16), 256);
  std::vector<engine::GenerateResult> out;
  for (const TestRequest& r : requests) {
    engine::GenerateOptions o;
    o.max_tokens = r.max_tokens;
    o.ignore_eos = r.ignore_eos;
    o.sampling.temperature = r.temperature;
    o.sampling.seed = r.seed;
    o.sampling.logprobs = r.logprobs;
    o.choice_index = r.choice;
    o.prefill_model = prefill_model->get();
    auto g = engine::Generate(**decode_model, pool, r.prompt, o);
    if (!g.ok()) std::abort();
    out.push_back(*g);
  }
  return out;
}

std::string Compare(const ParsedCompletion& got, const engine::GenerateResult& want, const TestRequest& r) {
  if (!got.error.empty()) return "error: " + got.error;
  if (got.ids != want.ids) {
    return absl::StrCat("ids [", absl::StrJoin(got.ids, ","), "] != reference [", absl::StrJoin(want.ids, ","), "]");
  }
  if (got.finish_reason != want.finish_reason) {
    return absl::StrCat("finish_reason ", got.finish_reason, " != ", want.finish_reason);
  }
  if (r.logprobs > 0) {
    if (got.token_logprobs.size() != want.ids.size() || got.top_logprobs.size() != want.ids.size()) {
      return "logprobs missing";
    }
    for (size_t i = 0; i < want.ids.size(); ++i) {
      if (std::fabs(got.token_logprobs[i] - want.logprobs[i]) > 1e-4) {
        return absl::StrCat("token_logprobs[", i, "] ", got.token_logprobs[i], " != ", want.logprobs[i]);
      }
      // Each reference alternative appears with its value (texts may merge
      // two ids into one key, so match by value).
      for (const auto& [id, lp] : want.top_logprobs[i]) {
        bool found = false;
        for (double v : got.top_logprobs[i]) found |= std::fabs(v - lp) <= 1e-4;
        if (!found && got.top_logprobs[i].size() == want.top_logprobs[i].size()) {
          return absl::StrCat("top_logprobs[", i, "] lacks ", lp, " (token ", id, ")");
        }
      }
    }
  }
  return "";
}

namespace {
struct RefModel {
  kernels::KernelBackendPtr backend;
  std::unique_ptr<engine::Model> model;
};
RefModel& RefModelFor(const std::string& dir) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<RefModel>> models;
  std::lock_guard<std::mutex> lock(mu);
  auto& m = models[dir];
  if (!m) {
    m = std::make_unique<RefModel>();
    m->backend = kernels::NewCpuBackend(2);
    auto loaded = engine::Model::Load(dir, m->backend.get());
    if (!loaded.ok()) std::abort();
    m->model = std::move(*loaded);
  }
  return *m;
}
// Whether float noise could make the reference pick `a` or `b` at `pos`
// given logits L: greedy top logits within 1e-3, or the sampling draw within
// 1e-5 of the CDF boundary between the two (unfiltered sampling walks the CDF
// in vocabulary order).
bool IsNearTie(const float* L, int64_t vocab, int32_t a, int32_t b, const TestRequest& r, int64_t pos) {
  double mx = L[0];
  for (int64_t j = 1; j < vocab; ++j) mx = std::max<double>(mx, L[j]);
  if (r.temperature == 0) return std::fabs(L[a] - L[b]) <= 1e-3 * std::max(1.0, std::fabs(mx));
  std::vector<double> p(vocab);
  double z = 0;
  for (int64_t j = 0; j < vocab; ++j) z += (p[j] = std::exp((L[j] - mx) / r.temperature));
  const int32_t lo = std::min(a, b), hi = std::max(a, b);
  double cum_lo = 0, cum_hi = 0;
  for (int32_t j = 0; j <= lo; ++j) cum_lo += p[j] / z;
  for (int32_t j = 0; j < hi; ++j) cum_hi += p[j] / z;
  const double u = engine::UniformDraw(r.seed, r.choice, pos);
  return std::fabs(u - cum_lo) <= 1e-5 && std::fabs(cum_hi - cum_lo) <= 1e-5;
}

// Teacher-forced reference logits for every generated position of `ids`.
absl::StatusOr<engine::Logits> TeacherForcedLogits(RefModel& ref, const TestRequest& r,
                                                   const std::vector<int32_t>& ids) {
  std::vector<int32_t> seq = r.prompt;
  seq.insert(seq.end(), ids.begin(), ids.end() - 1);
  engine::BlockPool pool(ref.model->KvLayoutFor(16), (seq.size() + 16) / 16 + 1);
  engine::SequenceKv kv(&pool);
  if (auto st = kv.Reserve(seq.size()); !st.ok()) return st;
  engine::BatchSeq b{.tokens = seq, .start_pos = 0, .block_table = kv.block_table()};
  for (size_t i = 0; i < ids.size(); ++i) b.logit_rows.push_back(static_cast<int32_t>(r.prompt.size() - 1 + i));
  return ref.model->Forward({b}, pool);
}

std::mutex& ForwardMutex() {
  static std::mutex mu;
  return mu;
}

}  // namespace

std::string CheckTeacherForced(const std::string& model_dir, const ParsedCompletion& got, const TestRequest& r,
                               int* near_ties) {
  if (!got.error.empty()) return "error: " + got.error;
  if (got.ids.empty()) return "no tokens";
  RefModel& ref = RefModelFor(model_dir);
  std::lock_guard<std::mutex> lock(ForwardMutex());  // One Forward at a time per model.
  const int64_t vocab = ref.model->config().vocab_size;
  auto logits = TeacherForcedLogits(ref, r, got.ids);
  if (!logits.ok()) return "reference forward failed: " + logits.status().ToString();
  spec::SamplingParams sp{.temperature = r.temperature, .seed = r.seed, .logprobs = r.logprobs};
  for (size_t i = 0; i < got.ids.size(); ++i) {
    const float* L = logits->row(i);
    const int64_t pos = static_cast<int64_t>(r.prompt.size() + i);
    const engine::SampleResult want = engine::Sample(L, vocab, sp, r.choice, pos);
    const int32_t g = got.ids[i];
    if (g < 0 || g >= vocab) return absl::StrCat("token ", i, " id ", g, " outside the vocabulary");
    if (r.logprobs > 0 && i < got.token_logprobs.size()) {
      double mx = L[0], z = 0;
      for (int64_t j = 1; j < vocab; ++j) mx = std::max<double>(mx, L[j]);
      for (int64_t j = 0; j < vocab; ++j) z += std::exp(L[j] - mx);
      const double lp = L[g] - mx - std::log(z);
      if (std::fabs(got.token_logprobs[i] - lp) > 1e-4) {
        return absl::StrCat("token_logprobs[", i, "] ", got.token_logprobs[i], " != teacher-forced ", lp);
      }
    }
    if (want.token == g) continue;
    // A difference is tolerated only at a near-tie.
    const bool tie = IsNearTie(L, vocab, want.token, g, r, pos);
    if (!tie) {
      return absl::StrCat("token ", i, " is ", g, " but the teacher-forced reference samples ", want.token,
                          " and it is no near-tie");
    }
    ++*near_ties;
  }
  return "";
}

std::string Verify(const std::string& model_dir, const ParsedCompletion& got, const engine::GenerateResult& want,
                   const TestRequest& r, Verdicts* v) {
  if (Compare(got, want, r).empty()) {
    ++v->exact;
    return "";
  }
  int ties = 0;
  std::string why = CheckTeacherForced(model_dir, got, r, &ties);
  if (!why.empty()) return absl::StrCat(Compare(got, want, r), "; teacher-forced check: ", why);
  if (ties == 0) {
    // The cluster followed the reference's distribution everywhere: then the
    // single-request reference itself took a branch at a near-tie. Find the
    // first difference and check that it is one.
    size_t k = 0;
    while (k < got.ids.size() && k < want.ids.size() && got.ids[k] == want.ids[k]) ++k;
    if (k == got.ids.size() || k == want.ids.size()) {
      return absl::StrCat(Compare(got, want, r), "; the outputs differ in length only");
    }
    RefModel& ref = RefModelFor(model_dir);
    std::lock_guard<std::mutex> lock(ForwardMutex());
    auto logits = TeacherForcedLogits(ref, r, got.ids);
    if (!logits.ok()) return logits.status().ToString();
    const int64_t pos = static_cast<int64_t>(r.prompt.size() + k);
    if (!IsNearTie(logits->row(k), ref.model->config().vocab_size, got.ids[k], want.ids[k], r, pos)) {
      return absl::StrCat(Compare(got, want, r), "; and no near-tie explains it at token ", k);
    }
  }
  ++v->near_tie;
  return "";
}

std::vector<ParsedCompletion> SendAll(int port, const std::vector<TestRequest>& reqs, const std::string& model) {
  std::vector<ParsedCompletion> got(reqs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i) {
    threads.emplace_back([&, i] {
      auto r = http::HttpCall("127.0.0.1", port, "POST", "/v1/completions", CompletionBody(reqs[i], model),
                              absl::Seconds(120));
      if (!r.ok()) {
        got[i].error = r.status().ToString();
      } else if (r->status != 200) {
        got[i].error = absl::StrCat("HTTP ", r->status, ": ", r->body);
      } else {
        got[i] = ParseCompletion(r->body, reqs[i].stream);
      }
    });
  }
  for (auto& t : threads) t.join();
  return got;
}

absl::StatusOr<nlohmann::json> PollStats(int port, const std::function<bool(const nlohmann::json&)>& pred,
                                         absl::Duration timeout) {
  nlohmann::json last;
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    auto r = http::HttpCall("127.0.0.1", port, "GET", "/stats", "", absl::Seconds(10));
    if (r.ok() && r->status == 200) {
      last = nlohmann::json::parse(r->body, nullptr, false);
      if (!last.is_discarded() && pred(last)) return last;
    }
  }
  return absl::DeadlineExceededError(absl::StrCat("condition not reached within ", absl::FormatDuration(timeout),
                                                  "; last /stats: ", last.dump()));
}

absl::StatusOr<double> ScrapeMetric(int port, const std::string& name, const std::string& label) {
  auto r = http::HttpCall("127.0.0.1", port, "GET", "/metrics", "", absl::Seconds(10));
  if (!r.ok()) return r.status();
  if (r->status != 200) return absl::UnavailableError(absl::StrCat("GET /metrics: HTTP ", r->status));
  double sum = 0;
  std::istringstream in(r->body);
  for (std::string line; std::getline(in, line);) {
    if ((line.rfind(name + "{", 0) == 0 || line.rfind(name + " ", 0) == 0) && line.find(label) != std::string::npos) {
      double v = 0;
      if (!absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) {
        return absl::InvalidArgumentError(absl::StrCat("bad sample: ", line));
      }
      sum += v;
    }
  }
  return sum;
}

bool AllIdle(const nlohmann::json& stats) {
  for (auto& [id, w] : stats["workers"].items()) {
    if (w["kv_blocks_free"] != w["kv_blocks_total"] || w["queued_requests"] != 0 || w["running_requests"] != 0 ||
        w.value("leased_blocks", 0) != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace duet::testing
