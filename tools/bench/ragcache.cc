// The knowledge tree on a RAG workload, against RAGCache's claims:
//
//   bazel run -c opt //tools/bench:ragcache
//
// The workload (RAGCache's shape): 1,000 documents of 100-300 tokens, Zipf
// popularity with the exponent that gives the top 3% of documents 60% of
// the draws (solved here), the ranking reshuffled halfway, two documents
// per request after a 32-token system prompt, a 16-32-token question,
// max_tokens 8; 10,000 requests at 2 requests/s on one OPT-13B prefill and
// one decode instance (DistServe's A100 fit). Hit rate = document tokens
// reused / document tokens requested.
//
// Simulator table: PGDSF, GDSF, LRU and LFU with a cache of 5%, 10% and 20%
// of all document tokens, device:host 1:3 (with the host tier: a quarter on
// device, the rest on host; without it: the device quarter alone), the
// same kvcache/ code the workers run inside duet sim. Beside each size:
// PGDSF over LRU, against its target (RAGCache: PGDSF 6-62% above LRU; here
// at least LRU everywhere and 1.05x at 5%).
//
// Real clusters of duet processes on the `bench` model (--sim-only skips
// them), each serving the first 400 requests of the same workload (the
// ranking reshuffled at request 200): 100 warm-up requests one at a time,
// then 300 measured at Poisson arrivals of 60% of the no-cache cluster's
// prefill capacity, measured in the same run under load: the warm-up's
// requests again, three at a time (closed loop), per second of wall time.
// (One at a time overstates it: the decode worker's thread then idles,
// while under load it shares the 2 cores with the prefill's two.)
//   - One prefill (2 threads, both cores) + one decode (1 thread): no cache,
//     and PGDSF at the 20% size with the host tier (device blocks =
//     the prefill's KV pool, host blocks = --kv-host-blocks, PGDSF's cost
//     from a `duet profile` of this machine, run first), both started and
//     warmed up, then measured in turns (a quarter of the measured requests
//     at a time, no-cache pgdsf pgdsf no-cache no-cache pgdsf pgdsf
//     no-cache, so a drift of the machine's speed over the run falls on
//     both alike; side by side would share the cores and with them the
//     queueing the cache saves): TTFT p50 / p90 of
//     the measured requests, their real document hit rate (from each
//     response's usage.prompt_tokens_details.cached_tokens) beside duet
//     sim's for the same requests at the times they were sent, and the
//     warm-up's TTFT (concurrency 1) beside the no-cache TTFT x (1 - that
//     request's cached share).
//   - Two prefills (1 thread each, cores 0 and 1, the same cache split in
//     half between them) + one decode: a least_loaded cluster and a
//     cache_aware one (the router's default weights) side by side on the
//     same cores, each request sent to both at the same moment (warm-up
//     two at a time each; measured at `load` of the least_loaded
//     cluster's capacity from that warm-up), so the machine's drifting
//     speed is the same for both: hit rate, each prefill's share of the
//     measured requests (the router's requests_dispatched), TTFT p90.
// Targets: sim and real within 2 pp; TTFT p50 1.5x lower with the cache;
// cache_aware 5 pp above least_loaded, no prefill above 65%, p90 no worse.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/flags.h"
#include "base/serving_defaults.h"
#include "base/status_macros.h"
#include "base/subprocess.h"
#include "engine/testing/model_maker.h"
#include "kvcache/prefix_tree.h"
#include "placement/latency.h"
#include "placement/model.h"
#include "placement/sim.h"
#include "placement/workload.h"
#include "tools/bench/serve_common.h"

namespace duet::bench {
namespace {

namespace fs = std::filesystem;

// The Zipf exponent at which the top `share_of` of `n` ranks draw `share`.
double ZipfFor(int64_t n, double share_of, double share) {
  auto top = [n, share_of](double s) {
    double all = 0, head = 0;
    const int64_t k = static_cast<int64_t>(std::llround(share_of * static_cast<double>(n)));
    for (int64_t r = 1; r <= n; ++r) {
      const double w = 1.0 / std::pow(static_cast<double>(r), s);
      all += w;
      if (r <= k) head += w;
    }
    return head / all;
  };
  double lo = 0, hi = 4;
  for (int i = 0; i < 60; ++i) {
    const double mid = 0.5 * (lo + hi);
    (top(mid) < share ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// The workload every part runs: RAGCache's shape, `n` requests at 2 req/s.
absl::StatusOr<placement::Workload> RagWorkload(int64_t n, const placement::ModelSpec& model) {
  placement::RagOptions rag{.documents = 1000, .shift_at = 0.5, .docs_per_request = 2, .doc_min = 100,
                            .doc_max = 300, .system_tokens = 32, .question_min = 16, .question_max = 32,
                            .output = 8};
  rag.zipf = ZipfFor(rag.documents, 0.03, 0.60);
  return placement::MakeWorkload(
      {.rate = 2, .lengths = "rag", .rag = rag, .num_requests = n, .max_context = model.max_context, .seed = 1});
}

// Document tokens reused / requested over requests [from, to), given each
// request's cached prompt tokens.
double DocHitRate(const placement::Workload& w, const std::vector<int64_t>& cached, size_t from, size_t to) {
  int64_t hit = 0, all = 0;
  for (size_t i = from; i < to; ++i) {
    const placement::PromptTokens& q = *w.requests[i].content;
    all += q.doc_end - q.doc_begin;
    hit += std::clamp<int64_t>(cached[i] - q.doc_begin, 0, q.doc_end - q.doc_begin);
  }
  return all > 0 ? static_cast<double>(hit) / static_cast<double>(all) : 0;
}

struct SimTable {
  int64_t corpus = 0;             // document tokens drawn at least once
  int64_t blocks_20 = 0;          // the 20% cache, in blocks (device + host)
  bool ok = true;
};

// The simulator table: every policy at 5/10/20%, with and without host.
absl::StatusOr<SimTable> PrintSimTable() {
  const placement::ModelSpec model = placement::ModelPreset("opt-13b").value();
  ASSIGN_OR_RETURN(std::unique_ptr<placement::LatencyModel> latency,
                   placement::LoadLatencyModel("placement/testdata/distserve-a100-80g.json", model));
  ASSIGN_OR_RETURN(placement::Workload w, RagWorkload(10000, model));
  SimTable out;
  // All document tokens: the corpus is the documents any request drew,
  // counted once (a document's tokens are the same in every request).
  {
    std::vector<std::vector<int32_t>> seen;
    for (const placement::SimRequest& q : w.requests) {
      const placement::PromptTokens& r = *q.content;
      for (size_t d = 0; d + 1 < r.boundaries.size(); ++d) {
        seen.emplace_back(r.tokens.begin() + r.boundaries[d], r.tokens.begin() + r.boundaries[d + 1]);
      }
    }
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (const auto& d : seen) out.corpus += static_cast<int64_t>(d.size());
  }
  std::printf("workload: 1000 documents of 100-300 tokens (%lld document tokens drawn at least once), Zipf %.3f "
              "(top 3%% of documents: 60%% of draws), ranking reshuffled at half, 2 per request, system 32, "
              "question 16-32, max_tokens 8\n\n",
              static_cast<long long>(out.corpus), ZipfFor(1000, 0.03, 0.60));
  const kvcache::Policy policies[4] = {kvcache::Policy::kPgdsf, kvcache::Policy::kGdsf, kvcache::Policy::kLru,
                                       kvcache::Policy::kLfu};
  const double sizes[3] = {0.05, 0.10, 0.20};
  std::printf("simulator: document-token hit rate of %zu requests at 2 req/s on OPT-13B, 1 prefill + 1 decode "
              "(DistServe's A100 fit; duet sim, the workers' kvcache code)\n",
              w.requests.size());
  std::printf("%-8s %-10s %12s %8s %8s %8s %8s   %-22s %s\n", "size", "tiers", "blocks", "pgdsf", "gdsf", "lru",
              "lfu", "pgdsf / lru (target)", "TTFT p50 ms pgdsf / none");
  placement::ClusterSpec base;
  base.instances = {{.role = placement::InstanceRole::kPrefill, .par = {.tp = 1, .pp = 1}},
                    {.role = placement::InstanceRole::kDecode, .par = {.tp = 1, .pp = 1}}};
  const double none_ttft = placement::Simulate(base, model, *latency, w.requests).Percentile(0.5, false);
  for (double size : sizes) {
    const int64_t blocks = static_cast<int64_t>(size * static_cast<double>(out.corpus) / 16);
    if (size == 0.20) out.blocks_20 = blocks;
    for (bool host : {true, false}) {
      double rate[4] = {0, 0, 0, 0}, ttft = 0;
      for (int k = 0; k < 4; ++k) {
        Progress(absl::StrFormat("sim %.0f%% %s %s", 100 * size, host ? "device+host" : "device",
                                 kvcache::PolicyName(policies[k])));
        placement::ClusterSpec c = base;
        c.cache = {.device_blocks = blocks / 4, .host_blocks = host ? blocks - blocks / 4 : 0, .policy = policies[k]};
        const placement::SimResult r = placement::Simulate(c, model, *latency, w.requests);
        rate[k] = r.cache.doc_hit_rate();
        if (k == 0) ttft = r.Percentile(0.5, false);
      }
      const double ratio = rate[2] > 0 ? rate[0] / rate[2] : 0;
      const double target = size == 0.05 ? 1.05 : 1.0;
      const bool ok = ratio >= target;
      out.ok = out.ok && ok;
      std::printf("%-8s %-10s %12lld %7.1f%% %7.1f%% %7.1f%% %7.1f%%   %6.3f (>= %.2f) %-5s %8.1f / %.1f\n",
                  (std::to_string(static_cast<int>(size * 100)) + "%").c_str(), host ? "dev+host" : "device",
                  static_cast<long long>(host ? blocks : blocks / 4), 100 * rate[0], 100 * rate[1], 100 * rate[2],
                  100 * rate[3], ratio, target, ok ? "ok" : "MISS", 1e3 * ttft, 1e3 * none_ttft);
    }
  }
  std::fflush(stdout);
  return out;
}

// --- The real clusters

struct ClusterRun {
  RunResult warm, measured;
  double rate = 0;                 // the measured requests' arrival rate
  double capacity = 0;             // requests/s it was found to serve (0: not measured here)
  std::map<std::string, int64_t> dispatched;  // prefill id -> measured requests the router gave it
  // Request i of the workload: warm-up first, then measured.
  const Outcome& at(size_t i) const {
    return i < warm.outcomes.size() ? warm.outcomes[i] : measured.outcomes[i - warm.outcomes.size()];
  }
};

std::vector<int64_t> CachedTokens(const ClusterRun& r) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < r.warm.outcomes.size() + r.measured.outcomes.size(); ++i) {
    out.push_back(std::max<int64_t>(0, r.at(i).cached_tokens));
  }
  return out;
}

absl::StatusOr<std::map<std::string, int64_t>> Dispatched(cluster::LocalCluster& c) {
  ASSIGN_OR_RETURN(Json s, c.Stats());
  std::map<std::string, int64_t> out;
  for (auto& [id, w] : s["workers"].items()) {
    if (w.value("role", "") == "prefill") out[id] = w.value("requests_dispatched", int64_t{0});
  }
  return out;
}

absl::Status CheckOutcomes(const std::string& name, const RunResult& r) {
  for (const Outcome& o : r.outcomes) {
    if (!o.ok()) return absl::InternalError(absl::StrCat(name, ": a request failed: ", o.error));
    if (o.cached_tokens < 0) return absl::InternalError(absl::StrCat(name, ": a response had no usage chunk"));
  }
  return absl::OkStatus();
}

// The pieces of a cluster's run: start it, warm it up (`concurrency` at a
// time, closed loop), send the measured requests at `rate` (the workload's
// Poisson gaps rescaled), counting what the router gave each prefill.
absl::StatusOr<std::unique_ptr<cluster::LocalCluster>> Start(const std::string& name, const std::string& run_dir,
                                                             const std::string& model_dir,
                                                             const std::vector<cluster::WorkerSpec>& workers,
                                                             const std::string& policy, const FlagSet& f) {
  Progress(absl::StrCat(name, ": starting the cluster"));
  std::vector<std::string> router_args;
  if (policy == "cache_aware") router_args = {"--cache-aware-weights", f.GetString("cache-aware-weights")};
  return StartCluster(run_dir + "/" + name, model_dir, workers, f.GetDouble("kv-memory"), f.GetInt("heartbeat-ms"),
                      "", policy, router_args);
}

absl::Status Warm(const std::string& name, cluster::LocalCluster& c, const std::string& model_name,
                  const std::vector<BenchRequest>& warm, int concurrency, const FlagSet& f, RunResult* out) {
  *out = ReplayClosed(c.http_port(), model_name, warm, concurrency, f.GetDouble("timeout-s"));
  return CheckOutcomes(name, *out);
}

std::vector<BenchRequest> MeasuredAt(const std::vector<BenchRequest>& reqs, size_t warm_n, double rate) {
  std::vector<BenchRequest> measured(reqs.begin() + static_cast<long>(warm_n), reqs.end());
  const double first = measured.front().arrival_s;
  for (BenchRequest& r : measured) r.arrival_s = (r.arrival_s - first) * 2.0 / rate;
  return measured;
}

// `reqs` sent at their arrival times; every one must succeed and the
// cluster must still be whole.
absl::StatusOr<RunResult> ReplayChecked(const std::string& name, cluster::LocalCluster& c,
                                        const std::string& model_name, const std::vector<BenchRequest>& reqs,
                                        const FlagSet& f) {
  RunResult r = Replay(c.http_port(), model_name, reqs, f.GetDouble("timeout-s"));
  RETURN_IF_ERROR(CheckOutcomes(name, r));
  RETURN_IF_ERROR(c.CheckAlive());
  return r;
}

absl::Status Measure(const std::string& name, cluster::LocalCluster& c, const std::string& model_name,
                     const std::vector<BenchRequest>& measured, const FlagSet& f, ClusterRun* out) {
  ASSIGN_OR_RETURN(const auto before, Dispatched(c));
  ASSIGN_OR_RETURN(out->measured, ReplayChecked(name, c, model_name, measured, f));
  ASSIGN_OR_RETURN(const auto after, Dispatched(c));
  for (const auto& [id, n] : after) out->dispatched[id] = n - (before.count(id) ? before.at(id) : 0);
  return absl::OkStatus();
}

// One cluster started and warmed up (`warm_concurrency` at a time); with
// `probe`, its capacity under load measured too: the warm-up's requests
// again at 3 x warm_concurrency, per second of wall time (for a cluster
// without a cache, which they would hit), and its rate set to `load` x it.
absl::StatusOr<std::unique_ptr<cluster::LocalCluster>> StartWarm(const std::string& name, const std::string& run_dir,
                                                                 const std::string& model_dir,
                                                                 const std::vector<cluster::WorkerSpec>& workers,
                                                                 const std::vector<BenchRequest>& reqs, size_t warm_n,
                                                                 int warm_concurrency, bool probe, double load,
                                                                 const FlagSet& f, ClusterRun* out) {
  const std::string model_name = testing::ModelBaseName(model_dir);
  ASSIGN_OR_RETURN(std::unique_ptr<cluster::LocalCluster> c,
                   Start(name, run_dir, model_dir, workers, "least_loaded", f));
  const std::vector<BenchRequest> warm(reqs.begin(), reqs.begin() + static_cast<long>(warm_n));
  Progress(absl::StrCat(name, ": ", warm.size(), " warm-up requests, ", warm_concurrency, " at a time"));
  RETURN_IF_ERROR(Warm(name, *c, model_name, warm, warm_concurrency, f, &out->warm));
  if (probe) {
    Progress(absl::StrCat(name, ": capacity under load: the ", warm.size(), " warm-up requests again, ",
                          3 * warm_concurrency, " at a time"));
    RunResult r;
    RETURN_IF_ERROR(Warm(name, *c, model_name, warm, 3 * warm_concurrency, f, &r));
    out->capacity = static_cast<double>(warm.size()) / r.wall_s;
    out->rate = load * out->capacity;
  }
  return c;
}

// `part` appended to `into`, its times moved to count from into's t0 (its
// wall_s added: the parts' busy time, not their span).
void AppendPart(const RunResult& part, RunResult* into) {
  if (into->outcomes.empty()) {
    *into = part;
    return;
  }
  const double shift = Seconds(part.t0 - into->t0);
  for (Outcome o : part.outcomes) {
    o.send_s += shift;
    if (o.first_token_s >= 0) o.first_token_s += shift;
    if (o.last_token_s >= 0) o.last_token_s += shift;
    into->outcomes.push_back(std::move(o));
  }
  into->wall_s += part.wall_s;
}

// Two clusters' measured requests, at a's rate, in turns: each cluster's
// `parts` consecutive slices sent A B B A A B B A ... (a slice's arrivals
// from its own start; the other cluster idles meanwhile), so a drift of
// the machine's speed over the minutes of the run falls on both alike
// rather than on whichever ran second. Each cluster's slices merge into its
// `measured`, timed from its first slice.
absl::Status MeasureInTurns(const std::string& a_name, cluster::LocalCluster& a, const std::string& b_name,
                            cluster::LocalCluster& b, const std::string& model_dir,
                            const std::vector<BenchRequest>& reqs, size_t warm_n, int parts, const FlagSet& f,
                            ClusterRun* ra, ClusterRun* rb) {
  const std::string model_name = testing::ModelBaseName(model_dir);
  rb->rate = ra->rate;
  const std::vector<BenchRequest> measured = MeasuredAt(reqs, warm_n, ra->rate);
  Progress(absl::StrFormat("%s and %s: %zu measured requests each at %.2f req/s, in %d turns each (~%.0f s)", a_name,
                           b_name, measured.size(), ra->rate, parts, 2 * measured.back().arrival_s));
  for (int k = 0; k < 2 * parts; ++k) {
    const int part = k / 2;
    // A B, B A, A B, ...: pair k/2 leads with a when even.
    const bool use_a = (part % 2 == 0) == (k % 2 == 0);
    const size_t from = measured.size() * static_cast<size_t>(part) / static_cast<size_t>(parts),
                 to = measured.size() * static_cast<size_t>(part + 1) / static_cast<size_t>(parts);
    if (from == to) continue;  // fewer requests than parts
    std::vector<BenchRequest> slice(measured.begin() + static_cast<long>(from),
                                    measured.begin() + static_cast<long>(to));
    const double first = slice.front().arrival_s;
    for (BenchRequest& r : slice) r.arrival_s -= first;
    const std::string& name = use_a ? a_name : b_name;
    cluster::LocalCluster& c = use_a ? a : b;
    ClusterRun* run = use_a ? ra : rb;
    Progress(absl::StrFormat("%s: measured requests %zu-%zu", name, from, to - 1));
    ASSIGN_OR_RETURN(const RunResult r, ReplayChecked(name, c, model_name, slice, f));
    AppendPart(r, &run->measured);
  }
  return absl::OkStatus();
}

// Two clusters side by side on the same cores, each request sent to both at
// the same moment: warmed up together (`warm_concurrency` at a time each),
// then measured together at `load` x the first cluster's capacity from its
// warm-up (warm_concurrency / its mean TTFT, the machine shared as it then
// is). This machine's speed drifts by 10-20% over minutes, so two runs one
// after the other compare the moments as much as the clusters; side by side
// they see the same ones.
absl::Status RunSideBySide(const std::string& a_name, const std::string& a_policy, const std::string& b_name,
                           const std::string& b_policy, const std::string& run_dir, const std::string& model_dir,
                           const std::vector<cluster::WorkerSpec>& workers, const std::vector<BenchRequest>& reqs,
                           size_t warm_n, int warm_concurrency, double load, const FlagSet& f, ClusterRun* a,
                           ClusterRun* b) {
  const std::string model_name = testing::ModelBaseName(model_dir);
  ASSIGN_OR_RETURN(std::unique_ptr<cluster::LocalCluster> ca, Start(a_name, run_dir, model_dir, workers, a_policy, f));
  ASSIGN_OR_RETURN(std::unique_ptr<cluster::LocalCluster> cb, Start(b_name, run_dir, model_dir, workers, b_policy, f));
  // Both halves of a step at once, the second on a thread of its own.
  auto both = [](const std::function<absl::Status()>& first, const std::function<absl::Status()>& second) {
    absl::Status s2;
    std::thread t([&] { s2 = second(); });
    absl::Status s1 = first();
    t.join();
    return s1.ok() ? s2 : s1;
  };
  const std::vector<BenchRequest> warm(reqs.begin(), reqs.begin() + static_cast<long>(warm_n));
  Progress(absl::StrCat(a_name, " and ", b_name, ": ", warm.size(), " warm-up requests, ", warm_concurrency,
                        " at a time each"));
  RETURN_IF_ERROR(both([&] { return Warm(a_name, *ca, model_name, warm, warm_concurrency, f, &a->warm); },
                       [&] { return Warm(b_name, *cb, model_name, warm, warm_concurrency, f, &b->warm); }));
  double sum = 0;
  for (const Outcome& o : a->warm.outcomes) sum += o.ttft();
  a->capacity = warm_concurrency / (sum / static_cast<double>(warm.size()));
  a->rate = b->rate = load * a->capacity;
  const std::vector<BenchRequest> measured = MeasuredAt(reqs, warm_n, a->rate);
  Progress(absl::StrFormat("%s and %s: %zu measured requests at %.2f req/s each (~%.0f s)", a_name, b_name,
                           measured.size(), a->rate, measured.back().arrival_s));
  RETURN_IF_ERROR(both([&] { return Measure(a_name, *ca, model_name, measured, f, a); },
                       [&] { return Measure(b_name, *cb, model_name, measured, f, b); }));
  ca->Stop();
  cb->Stop();
  return absl::OkStatus();
}

std::vector<double> Ttfts(const RunResult& r) {
  std::vector<double> v;
  for (const Outcome& o : r.outcomes) v.push_back(o.ttft());
  return v;
}

absl::Status RunReal(const FlagSet& f, int64_t cache_blocks, bool* ok) {
  if (std::thread::hardware_concurrency() < 2) {
    return absl::FailedPreconditionError("the real clusters pin workers to cores 0 and 1; the machine has fewer");
  }
  ASSIGN_OR_RETURN(const std::string model_dir, BenchModelDir(f));
  ASSIGN_OR_RETURN(const placement::ModelSpec spec, placement::ModelFromConfig(model_dir));
  const size_t warm_n = static_cast<size_t>(f.GetInt("warmup")), n = warm_n + static_cast<size_t>(f.GetInt("requests"));
  ASSIGN_OR_RETURN(const placement::Workload w, RagWorkload(static_cast<int64_t>(n), spec));
  std::vector<BenchRequest> reqs;
  for (const placement::SimRequest& q : w.requests) {
    const placement::PromptTokens& p = *q.content;
    // Where each document and the question start: the simulator's tree gets the same.
    reqs.push_back({.arrival_s = q.arrival, .prompt = p.tokens, .max_tokens = q.output,
                    .cache_boundaries = {p.boundaries.begin(), p.boundaries.end()}});
  }
  const std::string run_dir = absl::StrCat(fs::temp_directory_path().string(), "/duet-ragcache-bench-", getpid());
  fs::create_directories(run_dir);

  // PGDSF's cost, and duet sim's latencies: the engine on this machine.
  const std::string profile = run_dir + "/profile.json";
  Progress("profiling the bench model (2 threads) for PGDSF's cost and duet sim");
  {
    ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> p,
                     Subprocess::Start({fs::absolute("tools/duet").string(), "profile", "--model", model_dir,
                                        "--threads", "2", "--max-context", "1024", "--max-batch", "4", "--reps", "1",
                                        "--idle-gaps", "", "--out", profile},
                                       {}, profile + ".log"));
    const int status = p->Wait();
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      return absl::InternalError(absl::StrCat("duet profile ", DescribeExit(status), "; see ", profile, ".log"));
    }
  }
  // A prefill's flags for a cache of `blocks`, device:host 1:3.
  auto cache_flags = [&profile](int64_t blocks) {
    return std::vector<std::string>{"--kv-blocks", absl::StrCat(blocks / 4), "--kv-host-blocks",
                                    absl::StrCat(blocks - blocks / 4), "--kv-cache-policy", "pgdsf",
                                    "--kv-cache-cost-profile", profile};
  };
  const int64_t device = cache_blocks / 4, host = cache_blocks - device;
  const std::vector<std::string> cache_args = cache_flags(cache_blocks);
  const std::vector<std::string> none_args = {"--kv-blocks", absl::StrCat(device), "--no-prefix-cache"};
  auto one = [](const std::vector<std::string>& args) {
    return std::vector<cluster::WorkerSpec>{{.role = "prefill", .threads = 2, .args = args},
                                            {.role = "decode", .threads = 1}};
  };
  const double load = f.GetDouble("load");
  const bool two_only = f.GetBool("two-prefill-only");
  ClusterRun none, pgdsf;
  if (!two_only) {
    // Both started and warmed up (the no-cache one's capacity measured),
    // then measured in turns.
    ASSIGN_OR_RETURN(std::unique_ptr<cluster::LocalCluster> none_c,
                     StartWarm("no-cache", run_dir, model_dir, one(none_args), reqs, warm_n, 1, true, load, f, &none));
    ASSIGN_OR_RETURN(std::unique_ptr<cluster::LocalCluster> pg_c,
                     StartWarm("pgdsf", run_dir, model_dir, one(cache_args), reqs, warm_n, 1, false, load, f, &pgdsf));
    RETURN_IF_ERROR(MeasureInTurns("no-cache", *none_c, "pgdsf", *pg_c, model_dir, reqs, warm_n, 4, f, &none, &pgdsf));
    none_c->Stop();
    pg_c->Stop();
  }
  // The two prefills share the same 20%: half each, device:host 1:3.
  const int64_t half = cache_blocks / 2, half_device = half / 4, half_host = half - half_device;
  const std::vector<std::string> half_args = cache_flags(half);
  auto two = [&] {
    return std::vector<cluster::WorkerSpec>{{.role = "prefill", .threads = 1, .cpus = {0}, .args = half_args},
                                            {.role = "prefill", .threads = 1, .cpus = {1}, .args = half_args},
                                            {.role = "decode", .threads = 1}};
  };
  // Side by side, each prefill i of both on core i; their rate: `load` x
  // the least_loaded cluster's capacity from its warm-up (two at a time,
  // one per prefill; its few hits make it an upper bound).
  ClusterRun ll, ca;
  RETURN_IF_ERROR(RunSideBySide("two-prefill-least_loaded", "least_loaded", "two-prefill-cache_aware", "cache_aware",
                                run_dir, model_dir, two(), reqs, warm_n, 2, load, f, &ll, &ca));

  // The one-prefill figures (not with --two-prefill-only).
  bool ttft_ok = true, sim_ok = true;
  double real_hit = 0;
  if (!two_only) {
    // duet sim of the pgdsf cluster, the same requests sent when they were.
    ASSIGN_OR_RETURN(std::unique_ptr<placement::LatencyModel> lat, placement::LoadLatencyModel(profile, spec));
    // In the order they were sent (open-loop sends may swap by microseconds).
    std::vector<double> sent_at(n);
    for (size_t i = 0; i < n; ++i) {
      sent_at[i] = Seconds((i < warm_n ? pgdsf.warm : pgdsf.measured).t0 - pgdsf.warm.t0) + pgdsf.at(i).send_s;
    }
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sent_at[a] < sent_at[b]; });
    std::vector<placement::SimRequest> sent;
    for (size_t i : order) {
      sent.push_back(w.requests[i]);
      sent.back().arrival = sent_at[i];
    }
    placement::ClusterSpec cs;
    cs.instances = {{.role = placement::InstanceRole::kPrefill, .par = {.tp = 1, .pp = 1}},
                    {.role = placement::InstanceRole::kDecode, .par = {.tp = 1, .pp = 1}}};
    cs.cache = {.device_blocks = device, .host_blocks = host, .policy = kvcache::Policy::kPgdsf};
    const placement::SimResult sim = placement::Simulate(cs, spec, *lat, sent);
    std::vector<int64_t> sim_cached(n, 0);  // back in workload order
    for (size_t k = 0; k < n; ++k) sim_cached[order[k]] = sim.requests[k].cached;

    if (const std::string csv = f.GetString("csv"); !csv.empty()) {
      // One row per request: each run's time to first token and cached tokens, and duet sim's.
      std::FILE* out = std::fopen(csv.c_str(), "w");
      if (out == nullptr) return absl::InvalidArgumentError(absl::StrCat("cannot write ", csv));
      std::fprintf(out, "request,measured,prompt,doc_begin,doc_end");
      const std::pair<const char*, const ClusterRun*> runs[4] = {
          {"none", &none}, {"pgdsf", &pgdsf}, {"least_loaded", &ll}, {"cache_aware", &ca}};
      for (const auto& [name, r] : runs) std::fprintf(out, ",%s_send_s,%s_ttft_s,%s_cached", name, name, name);
      std::fprintf(out, ",sim_cached\n");
      for (size_t i = 0; i < n; ++i) {
        const placement::PromptTokens& q = *w.requests[i].content;
        std::fprintf(out, "%zu,%d,%lld,%lld,%lld", i, i >= warm_n ? 1 : 0, static_cast<long long>(w.requests[i].prompt),
                     static_cast<long long>(q.doc_begin), static_cast<long long>(q.doc_end));
        for (const auto& [name, r] : runs) {
          const Outcome& o = r->at(i);
          std::fprintf(out, ",%.6f,%.6f,%lld", o.send_s, o.ttft(), static_cast<long long>(o.cached_tokens));
        }
        std::fprintf(out, ",%lld\n", static_cast<long long>(sim_cached[i]));
      }
      std::fclose(out);
    }
    real_hit = DocHitRate(w, CachedTokens(pgdsf), warm_n, n);
    const double sim_hit = DocHitRate(w, sim_cached, warm_n, n);
    const double none_p50 = Percentile(Ttfts(none.measured), 0.5), none_p90 = Percentile(Ttfts(none.measured), 0.9);
    const double pg_p50 = Percentile(Ttfts(pgdsf.measured), 0.5), pg_p90 = Percentile(Ttfts(pgdsf.measured), 0.9);
    // Concurrency 1: each warm-up request's no-cache TTFT x its uncached share.
    double real_c1 = 0, pred_c1 = 0, none_c1 = 0;
    const std::vector<int64_t> pg_cached = CachedTokens(pgdsf);
    for (size_t i = 0; i < warm_n; ++i) {
      real_c1 += pgdsf.warm.outcomes[i].ttft();
      none_c1 += none.warm.outcomes[i].ttft();
      pred_c1 += none.warm.outcomes[i].ttft() *
                 (1.0 - static_cast<double>(pg_cached[i]) / static_cast<double>(w.requests[i].prompt));
    }
    real_c1 /= static_cast<double>(warm_n);
    pred_c1 /= static_cast<double>(warm_n);
    none_c1 /= static_cast<double>(warm_n);

    std::printf("\nreal clusters: the bench model (%s), the first %zu requests of the workload (ranking reshuffled at "
                "request %zu); %zu warm-up, then %zu measured at Poisson %.2f req/s = %.0f%% of the no-cache prefill's "
                "capacity under load (%.2f req/s: the warm-up's requests again, 3 at a time; one at a time it "
                "looked %.2f); cache: PGDSF, %lld device blocks (the prefill's KV "
                "pool) + %lld host blocks (20%% of the document tokens, 1:3), cost from duet profile\n",
                model_dir.c_str(), n, n / 2, warm_n, n - warm_n, none.rate, 100 * load, none.capacity, 1.0 / none_c1,
                static_cast<long long>(device), static_cast<long long>(host));
    std::printf("one prefill (2 threads) + one decode (1 thread)\n");
    std::printf("%-34s %12s %12s %8s   %s\n", "figure", "pgdsf", "no cache", "ratio", "target");
    ttft_ok = none_p50 >= 1.5 * pg_p50;
    std::printf("%-34s %12.0f %12.0f %8.2f   none / pgdsf >= 1.50 %s\n", "TTFT p50 ms", 1e3 * pg_p50, 1e3 * none_p50,
                none_p50 / pg_p50, ttft_ok ? "ok" : "MISS");
    std::printf("%-34s %12.0f %12.0f %8.2f\n", "TTFT p90 ms", 1e3 * pg_p90, 1e3 * none_p90, none_p90 / pg_p90);
    std::printf("%-34s %12.0f %12.0f %8.2f   (1 - hit) predicts %.0f ms: real / predicted %.2f\n",
                "TTFT mean ms, warm-up (conc. 1)", 1e3 * real_c1, 1e3 * none_c1, none_c1 / real_c1, 1e3 * pred_c1,
                real_c1 / pred_c1);
    sim_ok = std::abs(real_hit - sim_hit) <= 0.02;
    int64_t differ = 0;
    for (size_t i = warm_n; i < n; ++i) differ += pg_cached[i] != sim_cached[i] ? 1 : 0;
    std::printf("%-34s %11.1f%% %11.1f%%   %7s   |real - sim| <= 2.0 pp: %.1f pp %s\n",
                "document hit rate, real / duet sim", 100 * real_hit, 100 * sim_hit, "",
                100 * std::abs(real_hit - sim_hit),
                sim_ok ? "ok" : "MISS");
    std::printf("%-34s %12lld of %zu\n", "  requests whose cached tokens differ", static_cast<long long>(differ),
                n - warm_n);
  }

  const double ll_hit = DocHitRate(w, CachedTokens(ll), warm_n, n), ca_hit = DocHitRate(w, CachedTokens(ca), warm_n, n);
  auto max_share = [&](const ClusterRun& r) {
    int64_t all = 0, most = 0;
    for (const auto& [id, k] : r.dispatched) {
      all += k;
      most = std::max(most, k);
    }
    return all > 0 ? static_cast<double>(most) / static_cast<double>(all) : 1.0;
  };
  auto shares = [&](const ClusterRun& r) {
    std::string s;
    int64_t all = 0;
    for (const auto& [id, k] : r.dispatched) all += k;
    for (const auto& [id, k] : r.dispatched) {
      absl::StrAppend(&s, s.empty() ? "" : " / ", absl::StrFormat("%.0f%%", 100.0 * k / std::max<int64_t>(1, all)));
    }
    return s;
  };
  const std::vector<double> ll_ttft = Ttfts(ll.measured), ca_ttft = Ttfts(ca.measured);
  const double ll_p90 = Percentile(ll_ttft, 0.9), ca_p90 = Percentile(ca_ttft, 0.9);
  const double ll_p50 = Percentile(ll_ttft, 0.5), ca_p50 = Percentile(ca_ttft, 0.5);
  const bool hit_ok = ca_hit >= ll_hit + 0.05, share_ok = max_share(ca) <= 0.65 && max_share(ll) <= 0.65,
             p90_ok = ca_p90 <= ll_p90;
  std::printf("\ntwo prefills (1 thread each, cores 0 and 1) + one decode, the same cache split: %lld device + %lld "
              "host blocks each; the least_loaded and cache_aware clusters side by side on the same cores, each "
              "request sent to both at once; measured at Poisson %.2f req/s each = %.0f%% of the least_loaded "
              "cluster's capacity from its warm-up beside the other's (2 at a time: %.0f ms mean TTFT); cache_aware "
              "weights %s\n",
              static_cast<long long>(half_device), static_cast<long long>(half_host), ll.rate, 100 * load,
              2e3 * load / ll.rate, f.GetString("cache-aware-weights").c_str());
  std::printf("%-34s %12s %12s %8s   %s\n", "figure", "cache_aware", "least_loaded", "", "target");
  std::printf("%-34s %11.1f%% %11.1f%% %+7.2f   >= +5.0 pp %s\n", "document hit rate", 100 * ca_hit, 100 * ll_hit,
              100 * (ca_hit - ll_hit), hit_ok ? "ok" : "MISS");
  // The bound: one prefill holding the whole cache (the pgdsf run).
  if (!two_only) {
    int64_t found_less = 0;
    const std::vector<int64_t> whole = CachedTokens(pgdsf), aware = CachedTokens(ca);
    for (size_t i = warm_n; i < n; ++i) found_less += aware[i] < whole[i] ? 1 : 0;
    std::printf("%-34s %11.1f%%   (requests cache_aware found less of: %lld of %zu)\n",
                "  one prefill with the whole cache", 100 * real_hit, static_cast<long long>(found_less), n - warm_n);
  }
  std::printf("%-34s %12s %12s %8s   each <= 65%% %s\n", "requests per prefill", shares(ca).c_str(),
              shares(ll).c_str(), "", share_ok ? "ok" : "MISS");
  std::printf("%-34s %12.0f %12.0f %8.2f   cache_aware <= least_loaded %s\n", "TTFT p90 ms", 1e3 * ca_p90,
              1e3 * ll_p90, ca_p90 / ll_p90, p90_ok ? "ok" : "MISS");
  std::printf("%-34s %12.0f %12.0f %8.2f\n", "TTFT p50 ms", 1e3 * ca_p50, 1e3 * ll_p50, ca_p50 / ll_p50);
  *ok = ttft_ok && sim_ok && hit_ok && share_ok && p90_ok;
  std::error_code ec;
  fs::remove_all(run_dir, ec);
  return absl::OkStatus();
}

absl::Status Run(const FlagSet& f) {
  const Clock::time_point start = Clock::now();
  SetProgressName("ragcache");
  if (f.GetInt("warmup") < 1 || f.GetInt("requests") < 1 || !(f.GetDouble("load") > 0 && f.GetDouble("load") <= 1) ||
      !(f.GetDouble("timeout-s") > 0)) {
    return absl::InvalidArgumentError("--warmup and --requests must be >= 1, --load in (0, 1], --timeout-s > 0");
  }
  RETURN_IF_ERROR(ParseCacheAwareWeights(f.GetString("cache-aware-weights")).status());
  if (f.GetBool("two-prefill-only") && (f.GetBool("sim-only") || !f.GetString("csv").empty())) {
    return absl::InvalidArgumentError(
        "--two-prefill-only goes with neither --sim-only nor --csv (it runs the two-prefill clusters alone; the "
        "CSV holds all four runs)");
  }
  std::printf("duet RAG bench\n");
  ASSIGN_OR_RETURN(const SimTable table, PrintSimTable());
  bool real_ok = true;
  if (!f.GetBool("sim-only")) RETURN_IF_ERROR(RunReal(f, table.blocks_20, &real_ok));
  std::printf("\n(%.1f s)\n", Seconds(Clock::now() - start));
  if (!table.ok || !real_ok) return absl::InternalError("a target was missed (MISS above)");
  return absl::OkStatus();
}

}  // namespace
}  // namespace duet::bench

int main(int argc, char** argv) {
  duet::FlagSet f("ragcache",
                  "The knowledge tree on RAGCache's workload: every policy's document hit rate in duet sim,\n"
                  "then real clusters of the bench model with and without the cache, and two prefills under\n"
                  "cache_aware and least_loaded dispatch.");
  f.Bool("sim-only", "print the simulator table alone (seconds; the real clusters take ~17 minutes)");
  f.Int("warmup", 100, "real clusters: warm-up requests");
  f.Int("requests", 300, "real clusters: measured requests");
  f.Double("load", 0.6, "real clusters: the measured arrival rate as a fraction of the no-cache prefill's capacity");
  f.String("model", "", "model directory (default: the cached bench model, made on first use)");
  f.String("csv", "", "real clusters: write each request's TTFT and cached tokens in every run, and duet sim's, here");
  f.Double("kv-memory", 0.5, "the decode worker's KV cache in GiB");
  f.Int("heartbeat-ms", 500, "heartbeat interval of router and workers");
  f.Double("timeout-s", 300, "a request not done after this long fails the bench");
  f.Bool("two-prefill-only",
         "real clusters: only the two-prefill comparison of least_loaded and cache_aware (about 6 minutes with "
         "the simulator table), for trying dispatch settings");
  f.String("cache-aware-weights", duet::CacheAwareWeights{}.ToString(),
           "the cache_aware router's weights U,Q (the router's --cache-aware-weights; default its default)");
  return duet::RunWithFlags(f, argc, argv, duet::bench::Run, "ragcache bench");
}
