#include "engine/sampler.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <set>
#include <vector>

namespace duet::engine {
namespace {

TEST_CASE("greedy picks the argmax, ties to the lower id", "[sampler]") {
  std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f};
  spec::SamplingParams p{.temperature = 0};
  REQUIRE(Sample(l.data(), 4, p, 0, 0).token == 1);
}

TEST_CASE("a token mask restricts the choice, not the reported logprobs", "[sampler]") {
  std::vector<float> l = {3.0f, 1.0f, 2.5f, 0.5f, -1.0f};
  const std::vector<uint64_t> allowed = {(1u << 1) | (1u << 3)};  // ids 1 and 3
  const double z = std::log(std::exp(3.0) + std::exp(1.0) + std::exp(2.5) + std::exp(0.5) + std::exp(-1.0));
  spec::SamplingParams greedy{.temperature = 0, .logprobs = 2};
  SampleResult g = Sample(l.data(), 5, greedy, 0, 0, {}, allowed);
  CHECK(g.token == 1);  // the best allowed, not the argmax (0)
  CHECK(g.logprob == Approx(1.0 - z).epsilon(1e-6));
  REQUIRE(g.top_logprobs.size() == 2);
  CHECK(g.top_logprobs[0].first == 0);  // raw: the masked-out best still reported
  CHECK(g.top_logprobs[1].first == 2);
  std::set<int32_t> seen;
  for (int64_t pos = 0; pos < 200; ++pos) {
    spec::SamplingParams t{.temperature = 1.5f, .top_k = 3, .seed = 7};
    const SampleResult r = Sample(l.data(), 5, t, 0, pos, {}, allowed);
    seen.insert(r.token);
    // Still a pure function of (seed, choice, position).
    CHECK(r.token == Sample(l.data(), 5, t, 0, pos, {}, allowed).token);
  }
  CHECK(seen == std::set<int32_t>{1, 3});
  // Ids past the mask's words are not allowed; an empty mask allows nothing.
  std::vector<float> wide(70, 0.0f);
  wide[69] = 5.0f;
  CHECK(Sample(wide.data(), 70, greedy, 0, 0, {}, std::vector<uint64_t>{1}).token == 0);
  CHECK(Sample(l.data(), 5, greedy, 0, 0, {}, std::vector<uint64_t>{0}).token == -1);
}

TEST_CASE("logprobs are the log-softmax of the raw logits, best first", "[sampler]") {
  std::vector<float> l = {1.0f, 3.0f, 2.0f, 0.0f};
  spec::SamplingParams p{.temperature = 0.5f, .top_k = 2, .logprobs = 4};
  SampleResult r = Sample(l.data(), 4, p, 0, 5);
  double z = std::log(std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + std::exp(0.0));
  REQUIRE(r.top_logprobs.size() == 4);
  REQUIRE(r.top_logprobs[0].first == 1);
  REQUIRE(r.top_logprobs[1].first == 2);
  REQUIRE(r.top_logprobs[3].first == 3);
  REQUIRE(r.top_logprobs[0].second == Approx(3.0 - z).epsilon(1e-6));
  REQUIRE(r.top_logprobs[3].second == Approx(0.0 - z).epsilon(1e-6));
  // Temperature and top-k do not change the reported logprob of the pick.
  REQUIRE(r.logprob == Approx(l[r.token] - z).epsilon(1e-6));
}

TEST_CASE("top-k, top-p and min-p restrict the candidates", "[sampler]") {
  std::vector<float> l = {0.0f, 4.0f, 3.9f, 1.0f, 3.8f};
  std::set<int32_t> k2, p_small, minp;
  for (int pos = 0; pos < 400; ++pos) {
    k2.insert(Sample(l.data(), 5, {.temperature = 1, .top_k = 2, .seed = 9}, 0, pos).token);
    p_small.insert(Sample(l.data(), 5, {.temperature = 1, .top_p = 0.01f, .seed = 9}, 0, pos).token);
    minp.insert(Sample(l.data(), 5, {.temperature = 1, .min_p = 0.5f, .seed = 9}, 0, pos).token);
  }
  REQUIRE(k2 == std::set<int32_t>{1, 2});
  REQUIRE(p_small == std::set<int32_t>{1});
  // p(3)/p(1) = e^-3 < 0.5 and p(0)/p(1) = e^-4: only 1, 2, 4 survive.
  REQUIRE(minp == std::set<int32_t>{1, 2, 4});
}

TEST_CASE("temperature 1 samples the softmax distribution", "[sampler]") {
  std::vector<float> l = {0.0f, std::log(2.0f), std::log(5.0f)};  // p = 1/8, 2/8, 5/8
  std::map<int32_t, int> counts;
  const int n = 40000;
  for (int pos = 0; pos < n; ++pos) counts[Sample(l.data(), 3, {.temperature = 1, .seed = 3}, 0, pos).token]++;
  REQUIRE(counts[0] / double(n) == Approx(0.125).margin(0.01));
  REQUIRE(counts[1] / double(n) == Approx(0.25).margin(0.01));
  REQUIRE(counts[2] / double(n) == Approx(0.625).margin(0.01));
}

TEST_CASE("draws are a pure function of (seed, choice, position)", "[sampler]") {
  REQUIRE(UniformDraw(1, 0, 10) == UniformDraw(1, 0, 10));
  std::set<double> seen;
  for (uint64_t seed : {0, 1}) {
    for (uint64_t choice : {0, 1}) {
      for (int64_t pos : {0, 1, 1000000}) {
        double u = UniformDraw(seed, choice, pos);
        REQUIRE(u >= 0.0);
        REQUIRE(u < 1.0);
        seen.insert(u);
      }
    }
  }
  REQUIRE(seen.size() == 12);
  double mean = 0;
  for (int i = 0; i < 10000; ++i) mean += UniformDraw(77, 0, i);
  REQUIRE(mean / 10000 == Approx(0.5).margin(0.01));
}

TEST_CASE("invalid parameters are named", "[sampler]") {
  REQUIRE(spec::SamplingParams{.temperature = -1}.Validate().message().find("temperature") != std::string::npos);
  REQUIRE(spec::SamplingParams{.top_p = 0}.Validate().message().find("top_p") != std::string::npos);
  REQUIRE(spec::SamplingParams{.top_p = 1.5f}.Validate().message().find("top_p") != std::string::npos);
  REQUIRE(spec::SamplingParams{.min_p = 2}.Validate().message().find("min_p") != std::string::npos);
  REQUIRE(spec::SamplingParams{.top_k = -3}.Validate().message().find("top_k") != std::string::npos);
  REQUIRE(spec::SamplingParams{.temperature = NAN}.Validate().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(spec::SamplingParams{}.Validate().ok());
}


TEST_CASE("penalties lower generated tokens' logits, not the reported logprobs", "[sampler]") {
  // Token 0 leads by 1.0 over token 1, by 1.5 over token 2.
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f};
  spec::SamplingParams greedy{.temperature = 0.0f, .logprobs = 2};
  const std::vector<int32_t> once = {0}, twice = {0, 3, 0};
  // No penalty, or nothing generated: the argmax.
  REQUIRE(Sample(logits.data(), 4, greedy, 0, 5, twice).token == 0);
  spec::SamplingParams p = greedy;
  p.frequency_penalty = 0.6f;
  REQUIRE(Sample(logits.data(), 4, p, 0, 5, {}).token == 0);
  REQUIRE(Sample(logits.data(), 4, p, 0, 5, once).token == 0);   // 2.0 - 0.6 > 1.0
  REQUIRE(Sample(logits.data(), 4, p, 0, 5, twice).token == 1);  // 2.0 - 1.2 < 1.0
  p.frequency_penalty = 0.0f;
  p.presence_penalty = 1.2f;  // once is enough, and counts do not matter
  REQUIRE(Sample(logits.data(), 4, p, 0, 5, once).token == 1);
  p.presence_penalty = 0.7f;
  REQUIRE(Sample(logits.data(), 4, p, 0, 5, twice).token == 0);  // 2.0 - 0.7 > 1.0
  // Negative penalties favour repeats.
  p.presence_penalty = -2.0f;
  REQUIRE(Sample(logits.data(), 4, p, 0, 5, std::vector<int32_t>{2}).token == 2);
  // The reported logprobs are of the raw logits either way.
  p.presence_penalty = 1.2f;
  SampleResult r = Sample(logits.data(), 4, p, 0, 5, once);
  SampleResult raw = Sample(logits.data(), 4, greedy, 0, 5, {});
  REQUIRE(r.token == 1);
  REQUIRE(r.top_logprobs == raw.top_logprobs);
  REQUIRE(r.top_logprobs[0].first == 0);
  REQUIRE(r.logprob == raw.top_logprobs[1].second);
  // Out of range is named.
  p.frequency_penalty = 2.5f;
  REQUIRE(p.Validate().message().find("frequency_penalty") != std::string::npos);
}

}  // namespace
}  // namespace duet::engine

namespace duet::engine {
namespace {

TEST_CASE("a mask chooses as the disallowed logits at -inf would, filtered or not", "[sampler]") {
  // Many ids, a sparse mask over several words: the choice among the
  // allowed ids alone must be the choice over the whole vocabulary with
  // the others at -inf, draw for draw.
  constexpr int64_t kVocab = 300;
  std::vector<float> logits(kVocab);
  for (int64_t i = 0; i < kVocab; ++i) logits[i] = static_cast<float>(std::sin(i * 1.7) * 3);
  std::vector<uint64_t> mask((kVocab + 63) / 64, 0);
  std::vector<float> forced = logits;
  for (int64_t i = 0; i < kVocab; ++i) {
    if (i % 7 == 3 || i % 11 == 5) {
      mask[i / 64] |= uint64_t{1} << (i % 64);
    } else {
      forced[i] = -std::numeric_limits<float>::infinity();
    }
  }
  int differ_from_free = 0;
  for (const char* filter : {"none", "top_k", "top_p", "min_p", "greedy"}) {
    for (int64_t pos = 0; pos < 200; ++pos) {
      spec::SamplingParams p{.temperature = 0.8f, .seed = 42};
      if (std::string(filter) == "top_k") p.top_k = 5;
      if (std::string(filter) == "top_p") p.top_p = 0.7f;
      if (std::string(filter) == "min_p") p.min_p = 0.2f;
      if (std::string(filter) == "greedy") p.temperature = 0;
      const SampleResult masked = Sample(logits.data(), kVocab, p, 0, pos, {}, mask);
      const SampleResult reference = Sample(forced.data(), kVocab, p, 0, pos);
      INFO(filter << " position " << pos);
      REQUIRE(masked.token == reference.token);
      CHECK((mask[masked.token / 64] >> (masked.token % 64)) & 1);
      differ_from_free += masked.token != Sample(logits.data(), kVocab, p, 0, pos).token;
    }
  }
  CHECK(differ_from_free > 100);  // the mask mattered
}

}  // namespace
}  // namespace duet::engine
