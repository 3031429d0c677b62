#include "tools/bench/serve_common.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "engine/testing/model_maker.h"
#include "http/sse.h"

namespace duet::bench {
namespace fs = std::filesystem;

namespace {
std::string& ProgressName() {
  static std::string name = "serve bench";
  return name;
}

}  // namespace

void SetProgressName(const std::string& name) { ProgressName() = name; }

void Progress(const std::string& line) {
  static const Clock::time_point start = Clock::now();  // the first line's time
  std::fprintf(stderr, "[%s %4.0f s] %s\n", ProgressName().c_str(), Seconds(Clock::now() - start), line.c_str());
  std::fflush(stderr);
}


namespace {
int64_t ProcessTicks(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  int64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::strtoll(field.c_str(), nullptr, 10);
    if (i == 15) stime = std::strtoll(field.c_str(), nullptr, 10);
  }
  return utime + stime;
}

}  // namespace

CpuTicks ReadCpuTicks(const std::vector<pid_t>& cluster) {
  CpuTicks t;
  std::ifstream in("/proc/stat");
  std::string cpu;
  int64_t v[8] = {};
  in >> cpu;
  for (int64_t& x : v) in >> x;
  // user nice system idle iowait irq softirq steal: busy is all but idle and iowait.
  t.machine_busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
  t.ours = ProcessTicks(getpid());
  for (pid_t p : cluster) t.ours += ProcessTicks(p);
  return t;
}


// --- The workload -----------------------------------------------------------


absl::StatusOr<std::vector<TraceRow>> LoadTrace(const std::string& path, int64_t offset, int64_t n) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open the trace ", path));
  std::string line;
  std::getline(in, line);
  if (line.rfind("arrived_at,num_prefill_tokens,num_decode_tokens", 0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": unexpected header \"", line, "\""));
  }
  std::vector<TraceRow> rows;
  for (int64_t i = 0; std::getline(in, line) && static_cast<int64_t>(rows.size()) < n; ++i) {
    if (i < offset) continue;
    std::vector<std::string> f = absl::StrSplit(line, ',');
    if (f.size() < 3) return absl::InvalidArgumentError(absl::StrCat(path, ": bad row \"", line, "\""));
    rows.push_back({std::strtod(f[0].c_str(), nullptr), std::strtoll(f[1].c_str(), nullptr, 10),
                    std::strtoll(f[2].c_str(), nullptr, 10)});
  }
  if (static_cast<int64_t>(rows.size()) < n) {
    return absl::InvalidArgumentError(absl::StrCat(path, " has ", rows.size(), " rows after offset ", offset,
                                                   "; asked for ", n));
  }
  return rows;
}


std::vector<BenchRequest> MakeWorkload(const std::vector<TraceRow>& rows, double rate, double scale,
                                       int64_t context, int64_t vocab, uint32_t seed) {
  const double span = rows.back().arrived_at_s - rows.front().arrived_at_s;
  const double mean_gap = rows.size() > 1 ? span / static_cast<double>(rows.size() - 1) : 1.0;
  const double stretch = mean_gap > 0 ? 1.0 / (mean_gap * rate) : 0.0;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  std::vector<BenchRequest> out;
  for (const TraceRow& r : rows) {
    BenchRequest b;
    b.arrival_s = (r.arrived_at_s - rows.front().arrived_at_s) * stretch;
    b.max_tokens = std::clamp<int64_t>(std::llround(r.output_tokens * scale), 1, context / 2);
    const int64_t prompt = std::clamp<int64_t>(std::llround(r.prompt_tokens * scale), 1, context - b.max_tokens);
    b.prompt.resize(prompt);
    for (auto& t : b.prompt) t = token(rng);
    out.push_back(std::move(b));
  }
  return out;
}

// --- A streaming client -------------------------------------------------------


Outcome StreamCompletion(int port, const std::string& body, Clock::time_point t0, double timeout_s,
                         const std::function<void()>& on_first_token) {
  Outcome o;
  o.send_s = Seconds(Clock::now() - t0);
  bool done = false;
  auto r = http::StreamPost("127.0.0.1", port, "/v1/completions", body,
                            absl::Microseconds(static_cast<int64_t>(timeout_s * 1e6)), [&](absl::string_view data) {
                              if (data == "[DONE]") {
                                done = true;
                                return false;
                              }
                              const double now_s = Seconds(Clock::now() - t0);
                              Json j = Json::parse(data.begin(), data.end(), nullptr, false);
                              if (j.is_discarded()) {
                                o.error = absl::StrCat("bad SSE data: ", data.substr(0, 200));
                              } else if (j.contains("error")) {
                                o.error = j["error"].dump();
                              } else if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
                                o.cached_tokens = 0;
                                if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object()) {
                                  o.cached_tokens = d->value("cached_tokens", int64_t{0});
                                }
                              } else if (j.contains("choices") && !j["choices"].empty() &&
                                         j["choices"][0].contains("token_ids")) {
                                const int64_t k = static_cast<int64_t>(j["choices"][0]["token_ids"].size());
                                if (k > 0) {
                                  if (o.tokens == 0) {
                                    o.first_token_s = now_s;
                                    if (on_first_token) on_first_token();
                                  }
                                  o.last_token_s = now_s;
                                  o.tokens += k;
                                }
                              }
                              return true;
                            });
  if (!r.ok()) {
    if (o.error.empty()) o.error = absl::StrCat(r.status().message(), " (after ", o.tokens, " tokens)");
  } else if (r->status != 200) {
    o.error = absl::StrCat("HTTP ", r->status, ": ", r->body.substr(0, 300));
  } else if (!done && o.error.empty()) {
    o.error = absl::StrCat("stream ended without [DONE] after ", o.tokens, " tokens");
  }
  return o;
}

std::string CompletionBody(const std::string& model, const BenchRequest& r) {
  Json body{{"model", model},     {"prompt", r.prompt}, {"max_tokens", r.max_tokens},
            {"temperature", 0},   {"stream", true},     {"stream_options", {{"include_usage", true}}},
            {"ignore_eos", true}};
  if (!r.cache_boundaries.empty()) body["cache_boundaries"] = r.cache_boundaries;
  return body.dump();
}

absl::StatusOr<std::string> BenchModelDir(const FlagSet& f) {
  if (!f.GetString("model").empty()) return f.GetString("model");
  Progress("making or finding the cached bench model (the first time takes a while)");
  return testing::EnsureCachedModel("bench", "llama");
}

absl::StatusOr<BenchInputs> LoadBenchInputs(const FlagSet& f) {
  BenchInputs in;
  const int64_t n = f.GetInt("requests");
  if (n < 2 || f.GetInt("offset") < 0) return absl::InvalidArgumentError("--requests must be >= 2, --offset >= 0");
  in.trace = f.GetString("trace");
  if (!f.IsSet("trace")) {
    const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
    in.trace = absl::StrCat(ws != nullptr ? ws : ".", "/../shared/data/traces/splitwise_conv.csv");
  }
  ASSIGN_OR_RETURN(in.model_dir, BenchModelDir(f));
  std::ifstream cfg_in(in.model_dir + "/config.json");
  Json cfg = Json::parse(cfg_in, nullptr, false);
  if (cfg.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(in.model_dir, "/config.json is not JSON"));
  in.context = cfg.value("max_position_embeddings", 2048);
  in.vocab = cfg.value("vocab_size", 32000);
  in.model_name = testing::ModelBaseName(in.model_dir);
  ASSIGN_OR_RETURN(in.rows, LoadTrace(in.trace, f.GetInt("offset"), n));
  return in;
}

void AddBenchFlags(FlagSet& f, int64_t default_requests) {
  f.Int("requests", default_requests, "requests to replay (trace rows from --offset)");
  f.Int("offset", 0, "first trace row");
  f.Double("length-scale", 0.25, "factor on the trace's prompt and output lengths (clamped to the context)");
  f.String("trace", "", "trace CSV (default: ../shared/data/traces/splitwise_conv.csv from the workspace)");
  f.String("model", "", "model directory (default: the cached bench model, made on first use)");
  f.Double("kv-memory", 0.5, "KV cache per worker in GiB");
  // A worker pinned to a core that other work also wants can miss three
  // heartbeats in a row; raise this on a busy machine.
  f.Int("heartbeat-ms", 500, "heartbeat interval of router and workers (3 missed: the worker is dropped)");
  f.Double("timeout-s", 300, "a request not done after this long counts as an error");
  f.Int("seed", 1, "seed of the prompts' token ids");
}

// --- Clusters -------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<cluster::LocalCluster>> StartCluster(
    const std::string& run_dir, const std::string& model_dir, const std::vector<cluster::WorkerSpec>& workers,
    double kv_gib, int64_t heartbeat_ms, const std::string& step_log_prefix, const std::string& policy,
    const std::vector<std::string>& router_args) {
  const std::string hb = std::to_string(heartbeat_ms);
  cluster::ClusterOptions o;
  o.model_dir = model_dir;
  o.run_dir = run_dir;
  o.router_args = {"--heartbeat-ms", hb, "--policy", policy};
  o.router_args.insert(o.router_args.end(), router_args.begin(), router_args.end());
  o.worker_args = {"--kv-memory", absl::StrCat(kv_gib), "--heartbeat-ms", hb};
  auto c = std::make_unique<cluster::LocalCluster>(std::move(o));
  RETURN_IF_ERROR(c->StartRouter());
  std::vector<cluster::WorkerSpec> specs = workers;
  std::map<std::string, int> counts;
  for (cluster::WorkerSpec& w : specs) {
    const std::string id = w.id.empty() ? absl::StrCat(w.role, "-", counts[w.role]++) : w.id;
    w.id = id;
    if (!step_log_prefix.empty()) {
      const std::string log = absl::StrCat(step_log_prefix, id, ".csv");
      std::error_code ec;
      fs::remove(log, ec);  // the worker appends: start from an empty log
      w.env.push_back("DUET_STEP_LOG=" + log);
    }
  }
  RETURN_IF_ERROR(c->StartWorkers(std::move(specs)));
  return c;
}

// --- One run ------------------------------------------------------------------


RunResult Replay(int port, const std::string& model, const std::vector<BenchRequest>& reqs, double timeout_s) {
  RunResult r;
  r.outcomes.resize(reqs.size());
  const Clock::time_point t0 = Clock::now() + std::chrono::milliseconds(200);  // Threads start first.
  r.t0 = t0;
  std::vector<std::thread> threads;
  threads.reserve(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    threads.emplace_back([&, i] {
      const std::string body = CompletionBody(model, reqs[i]);
      std::this_thread::sleep_until(t0 + std::chrono::microseconds(static_cast<int64_t>(reqs[i].arrival_s * 1e6)));
      r.outcomes[i] = StreamCompletion(port, body, t0, timeout_s);
    });
  }
  for (auto& t : threads) t.join();
  for (const Outcome& o : r.outcomes) r.wall_s = std::max(r.wall_s, o.last_token_s);
  return r;
}

RunResult ReplayClosed(int port, const std::string& model, const std::vector<BenchRequest>& reqs, int concurrency,
                       double timeout_s) {
  RunResult r;
  r.outcomes.resize(reqs.size());
  r.t0 = Clock::now();
  std::atomic<size_t> next{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < concurrency; ++c) {
    clients.emplace_back([&] {
      for (size_t i = next++; i < reqs.size(); i = next++) {
        r.outcomes[i] = StreamCompletion(port, CompletionBody(model, reqs[i]), r.t0, timeout_s);
      }
    });
  }
  for (auto& t : clients) t.join();
  for (const Outcome& o : r.outcomes) r.wall_s = std::max(r.wall_s, o.last_token_s);
  return r;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}


Summary Summarize(const RunResult& r, double ttft_slo, double tpot_slo) {
  Summary s{};
  std::vector<double> ttft, tpot;
  int64_t met = 0, tokens = 0, done = 0;
  for (const Outcome& o : r.outcomes) {
    if (!o.ok()) {
      if (s.errors++ == 0) s.first_error = o.error;
      continue;
    }
    ++done;
    tokens += o.tokens;
    ttft.push_back(o.ttft());
    if (o.tokens > 1) tpot.push_back(o.tpot());
    if (o.ttft() <= ttft_slo && o.tpot() <= tpot_slo) ++met;
  }
  const double qs[3] = {0.5, 0.9, 0.99};
  for (int i = 0; i < 3; ++i) {
    s.ttft[i] = Percentile(ttft, qs[i]);
    s.tpot[i] = Percentile(tpot, qs[i]);
  }
  // Errors count as misses.
  s.slo_attainment = static_cast<double>(met) / static_cast<double>(r.outcomes.size());
  s.req_per_s = r.wall_s > 0 ? done / r.wall_s : 0;
  s.tok_per_s = r.wall_s > 0 ? tokens / r.wall_s : 0;
  return s;
}


}  // namespace duet::bench
