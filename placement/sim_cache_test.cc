// The knowledge tree inside duet sim's prefill instances: with room for
// everything, the tokens it reuses are exactly the longest block-aligned
// prefix each prompt shares with the prompts computed before it (a brute
// force over the same requests); a hit's prefill is charged only for the
// tokens after the cached prefix, and a host hit also for its copy.
#include <catch2/catch.hpp>
#include <deque>
#include <map>
#include <set>
#include <vector>

#include "kvcache/block_hash.h"
#include "placement/latency.h"
#include "placement/model.h"
#include "placement/sim.h"
#include "placement/workload.h"

namespace duet::placement {
namespace {

constexpr char kFit[] = "placement/testdata/distserve-a100-80g.json";

// A RAG prompt of 252 tokens (16 blocks): a 32-token system prompt, 200
// tokens of document `doc`, 20 of question `question`; kept in `prompts`
// (the request points into it), output 2.
SimRequest DocRequest(std::deque<PromptTokens>& prompts, double at, int doc, int question) {
  PromptTokens& q = prompts.emplace_back();
  for (int i = 0; i < 32; ++i) q.tokens.push_back(100 + i);
  q.doc_begin = 32;
  for (int i = 0; i < 200; ++i) q.tokens.push_back(1000 * doc + i);
  q.doc_end = static_cast<int64_t>(q.tokens.size());
  for (int i = 0; i < 20; ++i) q.tokens.push_back(50000 + 100 * question + i);
  q.boundaries = {32, q.doc_end};
  return SimRequest{.arrival = at, .prompt = static_cast<int64_t>(q.tokens.size()), .output = 2, .content = &q};
}

// OPT-13B on DistServe's A100 fit, as every case simulates it.
struct Opt13b {
  Opt13b() {
    absl::StatusOr<std::unique_ptr<LatencyModel>> l = LoadLatencyModel(kFit, m);
    REQUIRE(l.ok());
    lat = std::move(*l);
  }
  const ModelSpec m = ModelPreset("opt-13b").value();
  std::unique_ptr<LatencyModel> lat;
};

ClusterSpec OnePair(int64_t device_blocks, int64_t host_blocks) {
  ClusterSpec c;
  c.instances = {{.role = InstanceRole::kPrefill, .par = {.tp = 1, .pp = 1}},
                 {.role = InstanceRole::kDecode, .par = {.tp = 1, .pp = 1}}};
  c.cache = {.device_blocks = device_blocks, .host_blocks = host_blocks, .block_size = 16};
  return c;
}

Workload Rag(int64_t n, double rate, RagOptions rag) {
  return MakeWorkload({.rate = rate, .lengths = "rag", .rag = rag, .num_requests = n, .seed = 7}).value();
}

TEST_CASE("with room for all, the simulated cache reuses exactly each prompt's longest computed prefix",
          "[placement]") {
  const Opt13b opt;
  const ModelSpec& m = opt.m;
  LatencyModel& lat = *opt.lat;
  // Sparse arrivals: each prefill ends before the next request comes.
  const Workload workload = Rag(400, 0.05, {.documents = 50, .zipf = 1.0});
  const std::vector<SimRequest>& w = workload.requests;
  const SimResult r = Simulate(OnePair(1 << 20, 0), m, lat, w);
  // Brute force: the block hashes of every prompt computed so far.
  std::set<uint64_t> seen;
  int64_t want = 0, prompt = 0, doc = 0, doc_want = 0;
  for (const SimRequest& req : w) {
    const PromptTokens& q = *req.content;
    const std::vector<uint64_t> h =
        kvcache::BlockHashes(absl::MakeConstSpan(q.tokens).subspan(0, q.tokens.size() - 1), 16);
    size_t k = 0;
    while (k < h.size() && seen.count(h[k]) > 0) ++k;
    const int64_t cached = static_cast<int64_t>(k) * 16;
    want += cached;
    doc_want += std::clamp<int64_t>(cached - q.doc_begin, 0, q.doc_end - q.doc_begin);
    prompt += req.prompt;
    doc += q.doc_end - q.doc_begin;
    for (uint64_t x : kvcache::BlockHashes(q.tokens, 16)) seen.insert(x);
  }
  REQUIRE(want > 0);
  CHECK(r.cache.query_tokens == prompt);
  CHECK(r.cache.hit_device == want);
  CHECK(r.cache.hit_host == 0);
  CHECK(r.cache.doc_tokens == doc);
  CHECK(r.cache.doc_hits == doc_want);
  // The same requests without token ids: nothing is looked up as cached.
  std::vector<SimRequest> plain = w;
  for (SimRequest& q : plain) q.content = nullptr;
  CHECK(Simulate(OnePair(1 << 20, 0), m, lat, plain).cache.hit_device == 0);
}

TEST_CASE("a hit's prefill is charged for the tokens after its prefix; a host hit also for the copy", "[placement]") {
  const Opt13b opt;
  const ModelSpec& m = opt.m;
  LatencyModel& lat = *opt.lat;
  // One document, so every request after the first shares system prompt and document.
  const Workload workload =
      Rag(3, 0.01, {.documents = 1, .docs_per_request = 1, .doc_min = 200, .doc_max = 200, .system_tokens = 32});
  const std::vector<SimRequest>& w = workload.requests;
  REQUIRE(w.size() == 3);
  // 232 shared tokens: 14 full blocks (224) are reused by the later requests.
  const int64_t cached = 224;
  auto ttft_alone = [&](int64_t tokens) {
    const int64_t lens[1] = {tokens};
    return lat.Prefill({.tp = 1, .pp = 1}, lens);
  };
  {
    const SimResult r = Simulate(OnePair(1000, 0), m, lat, w);
    CHECK(r.requests[0].ttft() == Approx(ttft_alone(w[0].prompt)));
    CHECK(r.requests[1].ttft() == Approx(ttft_alone(w[1].prompt - cached)));
    CHECK(r.cache.hit_device == 2 * cached);
  }
  {
    // Documents A, B, then A again, on a device tier that holds one prompt:
    // B's blocks push A's document to host, and the third request finds the
    // system prompt on device and A's document on host, copied back at the
    // host link's speed before its prefill.
    auto tokens = [](int salt, int n) {
      std::vector<int32_t> t;
      for (int i = 0; i < n; ++i) t.push_back(100 + salt * 1000 + i);
      return t;
    };
    std::deque<PromptTokens> prompts;
    auto request = [&](double at, int doc, int question) {
      PromptTokens& q = prompts.emplace_back();
      q.tokens = tokens(0, 32);
      q.doc_begin = 32;
      const std::vector<int32_t> d = tokens(doc, 200), qq = tokens(question, 20);
      q.tokens.insert(q.tokens.end(), d.begin(), d.end());
      q.doc_end = static_cast<int64_t>(q.tokens.size());
      q.tokens.insert(q.tokens.end(), qq.begin(), qq.end());
      q.boundaries = {32, q.doc_end};
      return SimRequest{.arrival = at, .prompt = static_cast<int64_t>(q.tokens.size()), .output = 4, .content = &q};
    };
    const std::vector<SimRequest> abc = {request(0, 1, 7), request(100, 2, 8), request(200, 1, 9)};
    ClusterSpec c = OnePair(16, 100);
    c.cache.host_link_bytes_per_s = 1e9;
    const SimResult r = Simulate(c, m, lat, abc);
    CHECK(r.cache.hit_device == 32 + 32);  // the system prompt, for B and for A again
    CHECK(r.cache.hit_host == 192);        // A's document: its 12 full blocks after the system prompt
    const double copy = 192.0 * static_cast<double>(m.KvBytesPerToken()) / 1e9;
    CHECK(r.requests[2].ttft() == Approx(ttft_alone(abc[2].prompt - 224) + copy));
    CHECK(r.cache.swap_in_blocks == 12);
  }
}

TEST_CASE("cache_aware sends a request to the prefill instance holding its document; least_loaded to the idlest",
          "[placement]") {
  const Opt13b opt;
  const ModelSpec& m = opt.m;
  LatencyModel& lat = *opt.lat;
  // Two documents, A and B, each prompt 16 blocks on instances that hold
  // one prompt: A and B arrive together (one per instance), then alternate,
  // each after the last has finished.
  std::deque<PromptTokens> prompts;
  auto request = [&](double at, int doc, int question) { return DocRequest(prompts, at, doc, question); };
  std::vector<SimRequest> w = {request(0, 1, 0), request(0, 2, 1)};
  for (int k = 2; k < 12; ++k) w.push_back(request(100.0 * k, 1 + k % 2, k));
  ClusterSpec c;
  c.instances = {{.role = InstanceRole::kPrefill, .par = {.tp = 1, .pp = 1}},
                 {.role = InstanceRole::kPrefill, .par = {.tp = 1, .pp = 1}},
                 {.role = InstanceRole::kDecode, .par = {.tp = 1, .pp = 1}}};
  c.cache = {.device_blocks = 16, .block_size = 16};
  c.policy = "cache_aware";
  const SimResult aware = Simulate(c, m, lat, w);
  // Each of the 10 later requests finds its document's 12 full blocks after
  // the system prompt's 2 (and its own partial block is computed).
  CHECK(aware.cache.hit_device == 10 * 224);
  CHECK(aware.cache.doc_hits == 10 * 192);
  c.policy = "least_loaded";
  const SimResult idlest = Simulate(c, m, lat, w);
  // The router's book: the first request is charged its whole prompt to
  // the first instance, so the second goes to the other; each later one
  // finds both idle and goes to the first (ties by id). There the second A
  // finds the first's document (224 tokens), then A and B evict each other:
  // only the system prompt is found, 9 times.
  CHECK(idlest.cache.hit_device == 224 + 9 * 32);
  CHECK(idlest.cache.doc_hits == 192);
}

TEST_CASE("cache_aware's queue is the router's book: a burst's charges are its uncached tokens, not whole prompts",
          "[placement]") {
  const Opt13b opt;
  const ModelSpec& m = opt.m;
  LatencyModel& lat = *opt.lat;
  // Document A computed once on the first instance, then a burst of three
  // requests for it at one moment, weights 1,1. Each finds 224 of its 252
  // tokens there, so it is charged 28: the third sees 56 queued (84 in all)
  // against 252 on the idle instance. Counting the waiting second request's
  // whole prompt, as a worker's heartbeat does, would make it 308 and send
  // the third away from its document.
  std::deque<PromptTokens> prompts;
  auto request = [&](double at, int question) { return DocRequest(prompts, at, /*doc=*/1, question); };
  const std::vector<SimRequest> w = {request(0, 0), request(100, 1), request(100, 2), request(100, 3)};
  ClusterSpec c;
  c.instances = {{.role = InstanceRole::kPrefill, .par = {.tp = 1, .pp = 1}},
                 {.role = InstanceRole::kPrefill, .par = {.tp = 1, .pp = 1}},
                 {.role = InstanceRole::kDecode, .par = {.tp = 1, .pp = 1}}};
  c.cache = {.device_blocks = 64, .block_size = 16};
  c.policy = "cache_aware";
  c.cache_aware_weights = {.uncached = 1, .queued = 1};
  const SimResult r = Simulate(c, m, lat, w);
  CHECK(r.cache.hit_device == 3 * 224);
  CHECK(r.cache.doc_hits == 3 * 192);
  for (size_t i = 1; i < w.size(); ++i) {
    INFO(i);
    CHECK(r.requests[i].cached == 224);
  }
}

}  // namespace
}  // namespace duet::placement
