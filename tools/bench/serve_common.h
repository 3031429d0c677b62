// What the serving benches share (//tools/bench:serve and
// //tools/bench:sim_check): the trace slice and its workload, a streaming
// client that times each token event, clusters of duet processes on this
// machine's cores (through cluster/local_cluster), open-loop replay and its
// summary, and the CPU accounting that says how busy the machine was.
//
//   ASSIGN_OR_RETURN(BenchInputs in, LoadBenchInputs(f));
//   ASSIGN_OR_RETURN(auto c, StartCluster(dir, in.model_dir, setup.workers, 0.5, 500));
//   RunResult r = Replay(c->http_port(), in.model_name, MakeWorkload(in.rows, 1.0, 0.25, ...), 300);
#ifndef DUET_TOOLS_BENCH_SERVE_COMMON_H_
#define DUET_TOOLS_BENCH_SERVE_COMMON_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "base/flags.h"
#include "cluster/local_cluster.h"
#include "tools/bench/timing.h"

namespace duet::bench {

using Json = nlohmann::json;

// "[<name> <seconds since the first line>] line" on stderr; the name is the bench's.
void SetProgressName(const std::string& name);
void Progress(const std::string& line);

// Other work on the machine skews every figure here (two cores, shared with
// whoever else builds): CPU time the whole machine spent busy, and the part
// of it that was this bench and its cluster, tell how much there was.
struct CpuTicks {
  int64_t machine_busy = 0;  // All cores, from /proc/stat.
  int64_t ours = 0;          // This process and the cluster's (user + system).
};
CpuTicks ReadCpuTicks(const std::vector<pid_t>& cluster);

// --- The workload

struct TraceRow {
  double arrived_at_s;
  int64_t prompt_tokens;
  int64_t output_tokens;
};
// Rows offset .. offset + n - 1 of a Splitwise-format trace.
absl::StatusOr<std::vector<TraceRow>> LoadTrace(const std::string& path, int64_t offset, int64_t n);

struct BenchRequest {
  double arrival_s;  // From the start of the run.
  std::vector<int32_t> prompt;
  int64_t max_tokens;
  std::vector<int64_t> cache_boundaries;  // Where the prefix cache starts nodes (the RAG bench's documents).
};
// Gaps keep the trace's pattern (its bursts and lulls) with their mean
// rescaled to 1 / rate; lengths are scaled and clamped to the context.
std::vector<BenchRequest> MakeWorkload(const std::vector<TraceRow>& rows, double rate, double scale,
                                       int64_t context, int64_t vocab, uint32_t seed);

// --model, or else the cached bench model (made on first use, saying so).
absl::StatusOr<std::string> BenchModelDir(const FlagSet& f);

// The flags both benches take (--trace, --model, --requests, --offset,
// --length-scale) resolved: the model made or found, its context and vocab
// read, the trace slice loaded.
struct BenchInputs {
  std::string trace;
  std::string model_dir, model_name;
  int64_t context = 0, vocab = 0;
  std::vector<TraceRow> rows;
};
absl::StatusOr<BenchInputs> LoadBenchInputs(const FlagSet& f);
// Declares the flags LoadBenchInputs reads, and --kv-memory, --heartbeat-ms,
// --timeout-s and --seed.
void AddBenchFlags(FlagSet& f, int64_t default_requests);

// --- A streaming client

struct Outcome {
  std::string error;  // Empty: completed with [DONE] and no error event.
  double send_s = 0;  // From the start of the run.
  double first_token_s = -1, last_token_s = -1;
  int64_t tokens = 0;
  int64_t cached_tokens = -1;  // usage.prompt_tokens_details.cached_tokens; -1: no usage chunk.
  bool ok() const { return error.empty(); }
  double ttft() const { return first_token_s - send_s; }
  double tpot() const { return tokens > 1 ? (last_token_s - first_token_s) / static_cast<double>(tokens - 1) : 0; }
};
// One streamed completion, timing each event as it arrives (times from t0);
// `on_first_token` runs when the first token arrives.
Outcome StreamCompletion(int port, const std::string& body, Clock::time_point t0, double timeout_s,
                         const std::function<void()>& on_first_token = {});
// Greedy, streamed with a usage chunk, ignore_eos, max_tokens and
// cache_boundaries from the request.
std::string CompletionBody(const std::string& model, const BenchRequest& r);

// --- Clusters

struct Setup {
  std::string name;
  std::vector<cluster::WorkerSpec> workers;
};
// A router (with `policy`, and `router_args` added to its flags) and
// `workers` from the duet binary, each worker with `kv_gib` of KV cache,
// heartbeats every `heartbeat_ms` on both sides; ready when the router lists
// them all. step_log_prefix: when set, each worker
// logs its forward passes to <prefix><worker id>.csv (DUET_STEP_LOG).
absl::StatusOr<std::unique_ptr<cluster::LocalCluster>> StartCluster(
    const std::string& run_dir, const std::string& model_dir, const std::vector<cluster::WorkerSpec>& workers,
    double kv_gib, int64_t heartbeat_ms, const std::string& step_log_prefix = "",
    const std::string& policy = "least_loaded", const std::vector<std::string>& router_args = {});

// --- One run

struct RunResult {
  std::vector<Outcome> outcomes;
  Clock::time_point t0;  // Arrival times count from here.
  double wall_s = 0;     // First arrival to the last completion.
};
// Every request on its own thread, sent at its arrival time (open loop).
RunResult Replay(int port, const std::string& model, const std::vector<BenchRequest>& reqs, double timeout_s);
// The requests in order on `concurrency` clients, each sending its next as
// soon as its last has finished (closed loop; arrival times unused).
RunResult ReplayClosed(int port, const std::string& model, const std::vector<BenchRequest>& reqs, int concurrency,
                       double timeout_s);

// Linear between order statistics; NaN for an empty set.
double Percentile(std::vector<double> v, double q);

struct Summary {
  double ttft[3], tpot[3];  // p50, p90, p99 in seconds.
  double slo_attainment;
  double req_per_s, tok_per_s;
  int64_t errors;
  std::string first_error;
};
Summary Summarize(const RunResult& r, double ttft_slo, double tpot_slo);

}  // namespace duet::bench

#endif  // DUET_TOOLS_BENCH_SERVE_COMMON_H_
