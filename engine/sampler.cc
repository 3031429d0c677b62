#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace duet::engine {
namespace {

// Philox-4x32-10 (Salmon et al., SC'11): ten rounds of multiply-xorshift on
// a 128-bit counter under a 64-bit key.
void Philox(uint32_t ctr[4], uint32_t key[2]) {
  constexpr uint32_t kM0 = 0xD2511F53, kM1 = 0xCD9E8D57;
  constexpr uint32_t kW0 = 0x9E3779B9, kW1 = 0xBB67AE85;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * ctr[0];
    uint64_t p1 = static_cast<uint64_t>(kM1) * ctr[2];
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0];
    uint32_t n1 = static_cast<uint32_t>(p1);
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1];
    uint32_t n3 = static_cast<uint32_t>(p0);
    ctr[0] = n0; ctr[1] = n1; ctr[2] = n2; ctr[3] = n3;
    key[0] += kW0;
    key[1] += kW1;
  }
}

}  // namespace

double UniformDraw(uint64_t seed, uint64_t choice_index, int64_t position) {
  uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  uint64_t pos = static_cast<uint64_t>(position);
  uint32_t ctr[4] = {static_cast<uint32_t>(pos), static_cast<uint32_t>(pos >> 32),
                     static_cast<uint32_t>(choice_index), static_cast<uint32_t>(choice_index >> 32)};
  Philox(ctr, key);
  uint64_t bits = (static_cast<uint64_t>(ctr[0]) << 21) ^ (ctr[1] >> 11);  // 53 bits
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) / static_cast<double>(uint64_t{1} << 53);
}

SampleResult Sample(const float* logits, int64_t vocab, const spec::SamplingParams& p,
                    uint64_t choice_index, int64_t position, absl::Span<const int32_t> generated,
                    absl::Span<const uint64_t> allowed) {
  SampleResult out;
  // Penalties apply to a copy that the choice is made from; logprobs stay
  // those of the raw logits.
  const float* raw = logits;
  // The choice's own logits, when penalties change them: one buffer per
  // thread, reused (a fresh vocabulary-sized vector per row and step costs
  // its pages' faults and zeroing).
  thread_local std::vector<float> penalized_buffer;
  std::vector<float>& penalized = penalized_buffer;
  bool changed = false;
  if ((p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) && !generated.empty()) {
    penalized.assign(logits, logits + vocab);
    changed = true;
    std::vector<int32_t> seen(generated.begin(), generated.end());
    std::sort(seen.begin(), seen.end());
    for (size_t i = 0; i < seen.size();) {
      size_t j = i;
      while (j < seen.size() && seen[j] == seen[i]) ++j;
      const int32_t id = seen[i];
      if (id >= 0 && id < vocab) {
        penalized[id] -= p.frequency_penalty * static_cast<float>(j - i) + p.presence_penalty;
      }
      i = j;
    }
  }
  // The candidates, in id order: every id, or under a grammar's mask the
  // allowed ones alone (the rest would have probability 0 exactly, so no
  // sum, order or draw changes). A buffer per thread, as `penalized`.
  thread_local std::vector<int32_t> cand_buffer;
  std::vector<int32_t>& cand = cand_buffer;
  cand.clear();
  if (allowed.empty()) {
    cand.resize(vocab);
    std::iota(cand.begin(), cand.end(), 0);
  } else {
    for (int64_t w = 0; w < static_cast<int64_t>(allowed.size()) && w * 64 < vocab; ++w) {
      for (uint64_t bits = allowed[w]; bits != 0; bits &= bits - 1) {
        const int64_t id = w * 64 + __builtin_ctzll(bits);
        if (id < vocab) cand.push_back(static_cast<int32_t>(id));
      }
    }
    if (cand.empty()) return out;  // token -1
  }
  // Log-softmax of the raw logits, in double.
  double mx = raw[0];
  for (int64_t i = 1; i < vocab; ++i) mx = std::max<double>(mx, raw[i]);
  // Each exp kept: at temperature 1 over the raw logits the draw's
  // weights are these very values, not computed twice.
  thread_local std::vector<double> exps_buffer;
  std::vector<double>& exps = exps_buffer;
  exps.resize(vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += (exps[i] = std::exp(raw[i] - mx));
  const double log_z = mx + std::log(sum);
  auto logprob = [&](int32_t id) { return static_cast<float>(raw[id] - log_z); };
  auto raw_better = [&](int32_t a, int32_t b) {
    return raw[a] != raw[b] ? raw[a] > raw[b] : a < b;
  };

  // Candidates ordered by logit, best first, ties to the lower id.
  auto better = [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  };
  if (p.logprobs > 0) {
    const int64_t n = std::min<int64_t>(p.logprobs, vocab);
    std::vector<int32_t> ids(vocab);
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), raw_better);
    for (int64_t i = 0; i < n; ++i) out.top_logprobs.push_back({ids[i], logprob(ids[i])});
  }
  // From here on the choice: from the penalized logits when there are any.
  if (changed) logits = penalized.data();

  if (p.temperature == 0.0f) {
    int32_t best = cand[0];
    for (int32_t i : cand) if (better(i, best)) best = i;
    out.token = best;
    out.logprob = logprob(best);
    return out;
  }

  // Filtering needs the candidates sorted; without it, vocabulary order is
  // as deterministic and saves the sort.
  thread_local std::vector<double> probs_buffer;  // As `penalized`.
  const bool filtered = p.top_k > 0 || p.top_p < 1.0f || p.min_p > 0.0f;
  if (p.top_k > 0 && p.top_k < static_cast<int64_t>(cand.size())) {
    std::partial_sort(cand.begin(), cand.begin() + p.top_k, cand.end(), better);
    cand.resize(p.top_k);
  } else if (filtered) {
    std::sort(cand.begin(), cand.end(), better);
  }
  const double inv_t = 1.0 / p.temperature;
  double cmax = logits[cand[0]];
  for (int32_t id : cand) cmax = std::max<double>(cmax, logits[id]);
  std::vector<double>& probs = probs_buffer;
  probs.resize(cand.size());
  double total = 0;
  // The same bits as computing them: exp((l - max) * 1) over the same l and max.
  const bool reuse = !changed && allowed.empty() && p.temperature == 1.0f && cmax == mx;
  for (size_t i = 0; i < cand.size(); ++i) {
    total += (probs[i] = reuse ? exps[cand[i]] : std::exp((logits[cand[i]] - cmax) * inv_t));
  }
  for (double& pr : probs) pr /= total;
  size_t keep = cand.size();
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (size_t i = 0; i < keep; ++i) {
      cum += probs[i];
      if (cum >= p.top_p) { keep = i + 1; break; }
    }
  }
  if (p.min_p > 0.0f) {
    const double threshold = p.min_p * probs[0];  // Sorted: probs[0] is the max.
    size_t n = 1;
    while (n < keep && probs[n] >= threshold) ++n;
    keep = n;
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += probs[i];
  const double u = UniformDraw(p.seed, choice_index, position) * kept;
  double cum = 0;
  size_t pick = keep - 1;
  for (size_t i = 0; i < keep; ++i) {
    cum += probs[i];
    if (u < cum) { pick = i; break; }
  }
  out.token = cand[pick];
  out.logprob = logprob(out.token);
  return out;
}

}  // namespace duet::engine
