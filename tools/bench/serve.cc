// End-to-end serving benchmark: a slice of the Splitwise conversation trace
// replayed open-loop against two clusters started from the `duet` binary on
// this machine's cores, disaggregated (router + prefill on core 0 + decode on
// core 1) beside colocated (router + one worker on both cores), in one table
// (STYLE rule 9: the colocated cluster is the reference, measured in the same
// run).
//
//   bazel run -c opt //tools/bench:serve -- --rate 1.0 [--requests 120 --length-scale 0.25]
//   bazel run -c opt //tools/bench:serve -- --requests 60 --sim-rates 0.5,1.5,3
//     (both clusters at three rates beside duet sim of them, with the engine's
//     latencies from duet profile on this machine: SLO attainment side by
//     side; there every worker has one thread, and the colocated cluster is
//     two workers, one per core, behind a round-robin router)
//
// Token counts are scaled to fit the bench model (context 2048); prompts are
// random token ids (fixed seed); every request streams with ignore_eos and
// max_tokens = the scaled decode length. Arrival gaps keep the trace's own
// pattern, rescaled so the mean rate is --rate. Each request runs on its own
// thread from its arrival time (open loop), so a slow cluster does not slow
// the offered load. TTFT and TPOT are measured at the client from the SSE
// events: TTFT = first event carrying a token - send time; TPOT = (last token
// time - first token time) / (tokens - 1).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/flags.h"
#include "base/status_macros.h"
#include "base/subprocess.h"
#include "http/client.h"
#include "engine/block_pool.h"
#include "engine/model.h"
#include "kernels/cpu/cpu_backend.h"
#include "placement/latency.h"
#include "placement/model.h"
#include "placement/sim.h"
#include "engine/testing/model_maker.h"

namespace duet::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

void Progress(const std::string& line) {
  std::fprintf(stderr, "[serve bench] %s\n", line.c_str());
  std::fflush(stderr);
}

// Other work on the machine skews every figure here (two cores, shared with
// whoever else builds): CPU time the whole machine spent busy, and the part
// of it that was this bench and its cluster, tell how much there was.
struct CpuTicks {
  int64_t machine_busy = 0;  // All cores, from /proc/stat.
  int64_t ours = 0;          // This process and the cluster's (user + system).
};

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

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// --- The workload -----------------------------------------------------------

struct TraceRow {
  double arrived_at_s;
  int64_t prompt_tokens;
  int64_t output_tokens;
};

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

struct BenchRequest {
  double arrival_s;  // From the start of the run.
  std::vector<int32_t> prompt;
  int64_t max_tokens;
};

// Gaps keep the trace's pattern (its bursts and lulls) with their mean
// rescaled to 1 / rate; lengths are scaled and clamped to the context.
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

struct Outcome {
  std::string error;  // Empty: completed with [DONE] and no error event.
  double send_s = 0;  // From the start of the run.
  double first_token_s = -1, last_token_s = -1;
  int64_t tokens = 0;
  bool ok() const { return error.empty(); }
  double ttft() const { return first_token_s - send_s; }
  double tpot() const { return tokens > 1 ? (last_token_s - first_token_s) / static_cast<double>(tokens - 1) : 0; }
};

// One streamed completion over HTTP/1.0 (so the stream is the raw SSE bytes,
// ended by the close), timing each event as its bytes arrive;
// `on_first_token` runs when the first token arrives.
Outcome StreamCompletion(int port, const std::string& body, Clock::time_point t0, double timeout_s,
                         const std::function<void()>& on_first_token = {}) {
  Outcome o;
  const Clock::time_point start = Clock::now();
  o.send_s = Seconds(start - t0);
  const Clock::time_point deadline = start + std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6));
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    o.error = "socket failed";
    return o;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    o.error = absl::StrCat("connect: ", strerror(errno));
    return o;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const std::string req = absl::StrCat("POST /v1/completions HTTP/1.0\r\nHost: 127.0.0.1\r\n",
                                       "Content-Type: application/json\r\nContent-Length: ", body.size(),
                                       "\r\n\r\n", body);
  for (size_t sent = 0; sent < req.size();) {
    ssize_t n = send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      close(fd);
      o.error = absl::StrCat("send: ", strerror(errno));
      return o;
    }
    sent += static_cast<size_t>(n);
  }
  std::string pending;
  bool head_done = false, done = false;
  int status = 0;
  char buf[16384];
  while (!done) {
    const int64_t left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left_ms <= 0) {
      o.error = absl::StrCat("timed out after ", timeout_s, " s with ", o.tokens, " tokens");
      break;
    }
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 1000))) <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    const double now_s = Seconds(Clock::now() - t0);
    if (n < 0) {
      o.error = absl::StrCat("recv: ", strerror(errno));
      break;
    }
    if (n == 0) {
      if (!head_done || status != 200) {
        o.error = absl::StrCat("HTTP ", status, ": ", pending.substr(0, 300));
      } else {
        o.error = absl::StrCat("stream closed without [DONE] after ", o.tokens, " tokens");
      }
      break;
    }
    pending.append(buf, static_cast<size_t>(n));
    if (!head_done) {
      const size_t end = pending.find("\r\n\r\n");
      if (end == std::string::npos) continue;
      const size_t sp = pending.find(' ');
      status = sp == std::string::npos ? 0 : std::atoi(pending.c_str() + sp + 1);
      pending.erase(0, end + 4);
      head_done = true;
    }
    if (status != 200) continue;  // Read the error body to the close.
    for (size_t end; !done && (end = pending.find("\n\n")) != std::string::npos;) {
      const std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      for (absl::string_view line : absl::StrSplit(event, '\n')) {
        if (line.rfind("data: ", 0) != 0) continue;
        line.remove_prefix(6);
        if (line == "[DONE]") {
          done = true;
          break;
        }
        Json j = Json::parse(line.begin(), line.end(), nullptr, false);
        if (j.is_discarded()) {
          o.error = absl::StrCat("bad SSE data: ", std::string(line.substr(0, 200)));
        } else if (j.contains("error")) {
          o.error = j["error"].dump();
        } else if (j.contains("choices") && !j["choices"].empty() && j["choices"][0].contains("token_ids")) {
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
      }
    }
  }
  close(fd);
  return o;
}

std::string CompletionBody(const std::string& model, const BenchRequest& r) {
  return Json{{"model", model},           {"prompt", r.prompt}, {"max_tokens", r.max_tokens},
              {"temperature", 0},         {"stream", true},     {"ignore_eos", true}}
      .dump();
}

// --- A cluster of duet processes ----------------------------------------------

struct WorkerSpec {
  std::string role;  // prefill | decode | colocated
  int threads;
  std::vector<int> cpus;
};

class LocalCluster {
 public:
  explicit LocalCluster(std::string run_dir) : run_dir_(std::move(run_dir)) { fs::create_directories(run_dir_); }
  ~LocalCluster() {
    for (auto it = procs_.rbegin(); it != procs_.rend(); ++it) (*it)->Terminate(absl::Seconds(5));
  }

  // step_log_prefix: when set, each worker logs its forward passes to
  // <prefix><worker id>.csv (DUET_STEP_LOG). policy: the router's dispatch.
  absl::Status Start(const std::string& model_dir, const std::vector<WorkerSpec>& workers, double kv_gib,
                     int64_t heartbeat_ms, const std::string& step_log_prefix = "",
                     const std::string& policy = "least_loaded") {
    const std::string hb = std::to_string(heartbeat_ms);
    const std::string exe = fs::absolute("tools/duet").string();
    ASSIGN_OR_RETURN(Json r, Launch("router", {exe, "router", "--model", model_dir, "--listen", "127.0.0.1:0",
                                               "--control-listen", "127.0.0.1:0", "--heartbeat-ms", hb,
                                               "--policy", policy}, {}));
    http_port_ = r["http_port"];
    const std::string control = r["control"];
    std::map<std::string, int> counts;
    for (const WorkerSpec& w : workers) {
      const std::string id = absl::StrCat(w.role, "-", counts[w.role]++);
      worker_ids_.push_back(id);
      std::vector<std::string> args = {exe, w.role == "colocated" ? "worker" : w.role};
      if (w.role == "colocated") args.push_back("--role=colocated");
      for (const std::string& a : {std::string("--model"), model_dir, std::string("--router"), control,
                                   std::string("--worker-id"), id, std::string("--threads"),
                                   std::to_string(w.threads), std::string("--metrics-port"), std::string("0"),
                                   std::string("--kv-memory"), absl::StrCat(kv_gib), std::string("--heartbeat-ms"), hb}) {
        args.push_back(a);
      }
      std::vector<std::string> env;
      if (!step_log_prefix.empty()) {
        const std::string log = absl::StrCat(step_log_prefix, id, ".csv");
        std::error_code ec;
        fs::remove(log, ec);  // the worker appends: start from an empty log
        env.push_back("DUET_STEP_LOG=" + log);
      }
      RETURN_IF_ERROR(Launch(id, args, w.cpus, env).status());
    }
    // Ready when the router lists every worker.
    const absl::Time deadline = absl::Now() + absl::Seconds(120);
    while (absl::Now() < deadline) {
      auto s = http::HttpCall("127.0.0.1", http_port_, "GET", "/stats", "", absl::Seconds(5));
      if (s.ok() && s->status == 200) {
        Json j = Json::parse(s->body, nullptr, false);
        if (!j.is_discarded() && j.contains("workers") && j["workers"].size() == workers.size()) {
          return absl::OkStatus();
        }
      }
      RETURN_IF_ERROR(CheckAlive());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return absl::DeadlineExceededError(absl::StrCat("workers did not register; logs in ", run_dir_));
  }

  // Unavailable naming the first process that has exited.
  absl::Status CheckAlive() {
    for (auto& p : procs_) {
      if (auto st = p->TryWait()) {
        return absl::UnavailableError(
            absl::StrCat(p->name(), " ", DescribeExit(*st), "; log: ", p->log_path()));
      }
    }
    return absl::OkStatus();
  }

  int http_port() const { return http_port_; }
  // "<role>-<n>", in the order of Start's workers.
  const std::vector<std::string>& worker_ids() const { return worker_ids_; }
  std::vector<pid_t> pids() const {
    std::vector<pid_t> out;
    for (const auto& p : procs_) out.push_back(p->pid());
    return out;
  }

 private:
  absl::StatusOr<Json> Launch(const std::string& id, std::vector<std::string> args, const std::vector<int>& cpus,
                              const std::vector<std::string>& env = {}) {
    const std::string ready = run_dir_ + "/" + id + ".json";
    args.push_back("--ready-file");
    args.push_back(ready);
    ASSIGN_OR_RETURN(auto p, Subprocess::Start(args, env, run_dir_ + "/" + id + ".log", cpus));
    p->set_name(id);
    procs_.push_back(std::move(p));
    const absl::Time deadline = absl::Now() + absl::Seconds(120);
    while (absl::Now() < deadline) {
      std::ifstream in(ready);
      if (in) {
        Json j = Json::parse(in, nullptr, false);
        if (!j.is_discarded()) return j;
      }
      RETURN_IF_ERROR(CheckAlive());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return absl::DeadlineExceededError(absl::StrCat(id, " not ready; log: ", run_dir_, "/", id, ".log"));
  }

  std::string run_dir_;
  int http_port_ = 0;
  std::vector<std::string> worker_ids_;
  std::vector<std::unique_ptr<Subprocess>> procs_;
};

// --- One run ------------------------------------------------------------------

struct RunResult {
  std::vector<Outcome> outcomes;
  Clock::time_point t0;  // Arrival times count from here.
  double wall_s = 0;  // First arrival to the last completion.
};

// Every request on its own thread, sent at its arrival time.
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

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

struct Summary {
  double ttft[3], tpot[3];  // p50, p90, p99 in seconds.
  double slo_attainment;
  double req_per_s, tok_per_s;
  int64_t errors;
  std::string first_error;
};

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

struct Setup {
  std::string name;
  std::vector<WorkerSpec> workers;
};

// --- Simulation against the real clusters (--sim-rates) ------------------------

// Runs `duet profile` with one thread pinned to core 1, as a worker runs;
// the path of its file.
absl::StatusOr<std::string> Profile(const std::string& model_dir, const std::string& out) {
  ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> profile,
                   Subprocess::Start({fs::absolute("tools/duet").string(), "profile", "--model", model_dir, "--threads",
                                      "1", "--max-context", "1024", "--max-batch", "16", "--reps", "3", "--out", out},
                                     {}, out + ".log", /*cpus=*/{1}));
  const int status = profile->Wait();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("duet profile ", DescribeExit(status), "; see ", out, ".log"));
  }
  return out;
}

// The engine's two typical shapes here: a 300-token prompt, or a decode
// step of 4 sequences at context 300. Loads the model on this thread.
class EngineShape {
 public:
  absl::Status Init(const std::string& model_dir, bool prefill) {
    prefill_ = prefill;
    backend_ = kernels::NewCpuBackend(1);
    ASSIGN_OR_RETURN(model_, engine::Model::Load(model_dir, backend_.get()));
    pool_ = std::make_unique<engine::BlockPool>(model_->KvLayoutFor(16), 128);
    // Written once, so that the steps' attention reads real pages (never
    // written, they would all read the kernel's one zero page, from cache).
    std::memset(pool_->data(), 0, static_cast<size_t>(pool_->block_bytes() * pool_->num_blocks()));
    for (int i = 0; i < 4; ++i) {
      kv_.emplace_back(pool_.get());
      RETURN_IF_ERROR(kv_.back().Reserve(302));
    }
    return absl::OkStatus();
  }
  // One forward pass; its seconds.
  absl::StatusOr<double> Run() {
    std::vector<engine::BatchSeq> batch;
    if (prefill_) {
      batch.push_back({.tokens = tokens_, .start_pos = 0, .block_table = kv_[0].block_table(), .logit_rows = {299}});
    } else {
      for (int i = 0; i < 4; ++i) {
        batch.push_back({.tokens = absl::MakeConstSpan(tokens_).subspan(0, 1), .start_pos = 300,
                         .block_table = kv_[static_cast<size_t>(i)].block_table(), .logit_rows = {0}});
      }
    }
    const Clock::time_point t0 = Clock::now();
    RETURN_IF_ERROR(model_->Forward(batch, *pool_).status());
    return Seconds(Clock::now() - t0);
  }

 private:
  bool prefill_ = false;
  kernels::KernelBackendPtr backend_;
  std::unique_ptr<engine::Model> model_;
  std::unique_ptr<engine::BlockPool> pool_;
  std::vector<engine::SequenceKv> kv_;
  std::vector<int32_t> tokens_ = std::vector<int32_t>(300, 11);
};

void PinThisThread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof(set), &set);
}

// How much slower the disaggregated prefill worker's shape (on core 0) or
// decode worker's shape (core 1) runs while the other core runs the other
// role's, as a fraction: medians of timings alone and beside that load,
// alternated so that drifts of the machine fall on both alike.
absl::StatusOr<double> MeasureInterference(const std::string& model_dir, bool prefill) {
  std::atomic<int> mode{0};  // the load: 0 pauses, 1 runs, 2 ends
  std::atomic<bool> load_busy{false};   // inside a forward pass
  std::atomic<bool> load_ready{false};  // its model loaded (or failed to)
  absl::Status load_status;
  std::thread load([&] {
    PinThisThread(prefill ? 1 : 0);
    EngineShape shape;
    load_status = shape.Init(model_dir, !prefill);
    load_ready.store(true);
    while (load_status.ok() && mode.load() != 2) {
      if (mode.load() == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      load_busy.store(true);
      load_status = shape.Run().status();
      load_busy.store(false);
    }
    load_busy.store(false);  // also when it failed: nobody waits for it
  });
  absl::StatusOr<double> result = absl::InternalError("interference not measured");
  std::thread victim([&] {
    PinThisThread(prefill ? 0 : 1);
    EngineShape shape;
    if (absl::Status st = shape.Init(model_dir, prefill); !st.ok()) {
      result = st;
      return;
    }
    while (!load_ready.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::vector<double> alone, beside;
    for (int round = 0; round < 7; ++round) {
      // Alone means after the load's pass in flight has ended.
      mode.store(0);
      while (load_busy.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      for (std::vector<double>* v : {&alone, &beside}) {
        for (int i = 0; i < 2; ++i) {
          absl::StatusOr<double> t = shape.Run();
          if (!t.ok()) {
            result = t.status();
            return;
          }
          if (round > 0) v->push_back(*t);  // round 0 warms both up
        }
        if (v == &alone) {
          mode.store(1);
          std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the load is running
        }
      }
    }
    result = Percentile(beside, 0.5) / Percentile(alone, 0.5) - 1;
  });
  victim.join();
  mode.store(2);
  load.join();
  RETURN_IF_ERROR(load_status);
  return result;
}

double Fraction(const std::vector<double>& v, double limit) {
  if (v.empty()) return 0;
  int64_t ok = 0;
  for (double x : v) ok += x <= limit;
  return static_cast<double>(ok) / static_cast<double>(v.size());
}

// The SLO on one latency for the simulation check: the real attainment at
// the middle rate must lie between 30% and 70%. Within that window, where a
// bias of a few percent (this VM's speed drifts that much between a
// measurement and a run) moves the fewest requests across the line: the SLO
// with the fewest real values of all three rates within 3% of it, then the
// one whose middle-rate attainment is nearest 50%. The median, the densest
// point, is the worst choice: there about 10% of the requests lie within 3%.
double SparsestSlo(const std::vector<std::vector<double>>& by_rate, size_t mid) {
  constexpr double kNear = 1.03;
  std::vector<double> all;
  for (const auto& v : by_rate) all.insert(all.end(), v.begin(), v.end());
  std::vector<double> middle = by_rate[mid];
  std::sort(middle.begin(), middle.end());
  // Candidates: between consecutive middle-rate values, and just outside 3%
  // of every value (where the count changes).
  std::vector<double> candidates;
  for (size_t i = 0; i + 1 < middle.size(); ++i) candidates.push_back(std::sqrt(middle[i] * middle[i + 1]));
  for (double v : all) {
    candidates.push_back(v * kNear * 1.0001);
    candidates.push_back(v / kNear / 1.0001);
  }
  double slo = Percentile(middle, 0.5);
  int64_t best_count = std::numeric_limits<int64_t>::max();
  double best_off_centre = 1;
  for (double c : candidates) {
    if (!(c > 0)) continue;
    const double attainment = Fraction(middle, c);
    if (attainment < 0.3 || attainment > 0.7) continue;
    int64_t count = 0;
    for (double v : all) count += v > c / kNear && v <= c * kNear;
    const double off_centre = std::fabs(attainment - 0.5);
    if (count < best_count || (count == best_count && off_centre < best_off_centre)) {
      best_count = count;
      best_off_centre = off_centre;
      slo = c;
    }
  }
  return slo;
}

// --- Tracking the machine's speed (--sim-rates) -------------------------------
//
// This VM's speed drifts by several percent within minutes (one worker's
// 1-sequence decode step, timed every 6 s for 3 minutes: 32.9 to 37.6 ms),
// and at an SLO inside the middle 30-70% of a latency distribution a 5%
// bias moves 10-20% of the requests across the line (in one run the profile
// timed decode 20% and prefill 15% slower than the workers then ran). So
// each worker's speed relative to the profile (SpeedByRows) is measured by a
// probe just before and just after each run, from the worker's own step
// log, and duet sim runs that worker's steps scaled by the mean of the two.

struct TimeSpan {
  double start_s = 0, end_s = 0;  // steady clock, as the step logs
};

double SteadySeconds(Clock::time_point t) { return std::chrono::duration<double>(t.time_since_epoch()).count(); }

// Even: round robin starts every run on the same instance.
constexpr int kProbeRequests = 12;  // chained
constexpr int kProbePrompts = 6;    // spaced
constexpr double kProbePromptGapS = 0.3;
constexpr int64_t kProbeLongOutputs = 128;

struct Probe {
  TimeSpan chained;  // decode steps of 1 to ~8 sequences
  TimeSpan spaced;   // prompts one at a time beside a running decode
};

// Two phases, alone on the cluster, all prompts distinct random tokens.
// Chained: kProbeRequests requests of 256 tokens and 32 outputs, each sent
// when the one before has its first token, so decode batches 1 to ~8
// sequences. Spaced: two requests of kProbeLongOutputs outputs, then, from
// the first one's first token, kProbePrompts prompts of 2 outputs with the
// lengths `prompt_lens` (the run's own, at spread quantiles), each sent
// kProbePromptGapS after the one before has its first token: each meets the
// prefill side idle and the decode side busy, as in a run (back to back,
// as in the chained phase, the same prompts ran 4-15% faster on this VM,
// whose 480 MiB L3 keeps a busy worker's weights; and one length does not
// stand for the run's: against a profile, warm prompts under 64 tokens ran
// at 1.05 while those of 256 ran at 0.90).
absl::StatusOr<Probe> SpeedProbe(int port, const std::string& model_name, int64_t vocab,
                                 const std::vector<int64_t>& prompt_lens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  auto body = [&](int64_t tokens, int64_t outputs) {
    BenchRequest b{0, std::vector<int32_t>(static_cast<size_t>(tokens)), outputs};
    for (auto& t : b.prompt) t = token(rng);
    return CompletionBody(model_name, b);
  };
  std::vector<std::string> bodies;
  for (int i = 0; i < kProbeRequests; ++i) bodies.push_back(body(256, 32));
  const std::string long_a = body(256, kProbeLongOutputs), long_b = body(256, kProbeLongOutputs);
  std::vector<std::string> prompts;
  for (int64_t len : prompt_lens) prompts.push_back(body(len, 2));

  // Streams `body`; `first` is set at its first token, or at its end if
  // none came (a failure: what waits on it goes on anyway).
  auto stream = [port](const std::string& body, std::promise<void>& first) {
    bool signalled = false;
    Outcome o = StreamCompletion(port, body, Clock::now(), 120, [&] {
      signalled = true;
      first.set_value();
    });
    if (!signalled) first.set_value();
    return o;
  };
  std::vector<std::promise<void>> first(kProbeRequests);
  std::vector<std::future<void>> first_done;
  for (auto& p : first) first_done.push_back(p.get_future());
  std::vector<Outcome> out(kProbeRequests + 2 + prompts.size());
  Probe probe;
  probe.chained.start_s = SteadySeconds(Clock::now());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < kProbeRequests; ++i) {
    threads.emplace_back([&, i] {
      if (i > 0) first_done[i - 1].wait();
      out[i] = stream(bodies[i], first[i]);
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  probe.chained.end_s = probe.spaced.start_s = SteadySeconds(Clock::now());
  std::promise<void> running;
  std::future<void> running_done = running.get_future();
  threads.emplace_back([&] { out[kProbeRequests] = stream(long_a, running); });
  threads.emplace_back([&] { out[kProbeRequests + 1] = StreamCompletion(port, long_b, Clock::now(), 120); });
  running_done.wait();
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(kProbePromptGapS * 1e6)));
    std::promise<void> first_token;
    std::future<void> first_done = first_token.get_future();
    threads.emplace_back([&, i, p = std::move(first_token)]() mutable {
      out[static_cast<size_t>(kProbeRequests + 2) + i] = stream(prompts[i], p);
    });
    first_done.wait();
  }
  for (auto& t : threads) t.join();
  probe.spaced.end_s = SteadySeconds(Clock::now());
  for (const Outcome& o : out) {
    if (!o.ok()) return absl::InternalError(absl::StrCat("speed probe: a request failed: ", o.error));
  }
  return probe;
}

// One row of DUET_STEP_LOG (engine/model.cc).
struct StepRow {
  double start_s = 0;
  int64_t decode = 0, context = 0, prompts = 0, tokens = 0;
  double ms = 0;
};

absl::StatusOr<std::vector<StepRow>> ReadStepLog(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("no step log ", path));
  std::vector<StepRow> rows;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ',');
    StepRow r;
    int64_t squares = 0;
    if (f.size() != 7 || !absl::SimpleAtod(f[0], &r.start_s) || !absl::SimpleAtoi(f[1], &r.decode) ||
        !absl::SimpleAtoi(f[2], &r.context) || !absl::SimpleAtoi(f[3], &r.prompts) ||
        !absl::SimpleAtoi(f[4], &r.tokens) || !absl::SimpleAtoi(f[5], &squares) || !absl::SimpleAtod(f[6], &r.ms)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": bad step row \"", line, "\""));
    }
    rows.push_back(r);
  }
  return rows;
}

// A step's decode rows' contexts: the logged total, spread evenly.
std::vector<int64_t> RowContexts(const StepRow& r) {
  std::vector<int64_t> ctx;
  for (int64_t k = 0; k < r.decode; ++k) ctx.push_back(r.context / r.decode + (k < r.context % r.decode ? 1 : 0));
  return ctx;
}

// A worker's speed against the latency model at one probe, by the decode
// rows in a step: [rows, median of real / predicted]. Rows 0: its prompts
// alone in a step during the spaced phase, or, with fewer than 3 of those,
// its prompts beside decode rows; rows 1 and up: its decode steps of that
// many rows during the chained phase, smoothed (below); only counts with at
// least 3 steps. By rows because serving adds to a step more than the
// profile's forward pass alone shows, and not in proportion: in some runs a
// worker's steps of one sequence ran 0-3% over a profile taken minutes
// before while those of 3-8 sequences ran 10-15% over (about 7 ms more; the
// same engine timed in one process beside the profile ran them as the
// profile did; the cause is not known). Each phase's first step is skipped
// (it may pay the idle penalty).
using SpeedTable = std::vector<std::pair<int64_t, double>>;

// Real over predicted time of step `i` of `rows` when it is a decode step
// alone (`decode`) or a prompt alone (`prompt`); nullopt for any other. A
// decode step's time runs to the next one's start when that follows within
// 5 ms (the engine's work between forward passes: sampling, sending tokens,
// polling pulls).
std::optional<double> StepRatio(const std::vector<StepRow>& rows, size_t i, placement::LatencyModel& latency,
                                bool decode, bool prompt) {
  const StepRow& r = rows[i];
  double predicted = 0, seconds = r.ms / 1e3;
  if (decode && r.prompts == 0 && r.decode > 0) {
    predicted = latency.Decode({}, RowContexts(r));
    if (i + 1 < rows.size() && rows[i + 1].start_s - r.start_s - seconds < 0.005) {
      seconds = rows[i + 1].start_s - r.start_s;
    }
  } else if (prompt && r.prompts == 1 && r.decode == 0) {
    const int64_t lens[1] = {r.tokens};
    predicted = latency.Prefill({}, lens);
  }
  if (!(predicted > 0) || !(seconds > 0)) return std::nullopt;
  return seconds / predicted;
}

SpeedTable SpeedByRows(const std::vector<StepRow>& rows, const Probe& probe, placement::LatencyModel& latency) {
  std::map<int64_t, std::vector<double>> ratios;
  bool first_chained = true, first_spaced = true;
  for (size_t i = 0; i < rows.size(); ++i) {
    const StepRow& r = rows[i];
    const bool chained = r.start_s >= probe.chained.start_s && r.start_s < probe.chained.end_s;
    const bool spaced = r.start_s >= probe.spaced.start_s && r.start_s <= probe.spaced.end_s;
    if (!chained && !spaced) continue;
    bool& first = chained ? first_chained : first_spaced;
    if (first) {
      first = false;
      continue;
    }
    if (std::optional<double> ratio = StepRatio(rows, i, latency, /*decode=*/chained, /*prompt=*/spaced)) {
      ratios[chained ? r.decode : 0].push_back(*ratio);
    }
  }
  SpeedTable table;
  if (ratios[0].size() >= 3) table.emplace_back(0, Percentile(ratios[0], 0.5));
  // Decode: a line through the rows' medians, weighted by their steps. A
  // probe has some 10-60 steps of each row count, and its medians scatter
  // by 2-4% around a gentle rise (1.00 at one row to 1.05 at eight in the
  // runs' own steps); a line keeps the rise and drops the scatter.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  std::vector<std::pair<int64_t, double>> medians;
  for (const auto& [n, v] : ratios) {
    if (n == 0 || v.size() < 3) continue;
    const double w = static_cast<double>(v.size()), x = static_cast<double>(n), y = Percentile(v, 0.5);
    medians.emplace_back(n, y);
    sw += w;
    sx += w * x;
    sy += w * y;
    sxx += w * x * x;
    sxy += w * x * y;
  }
  const double spread = sw * sxx - sx * sx;
  const bool line = medians.size() > 1 && spread > 0;
  const double slope = line ? (sw * sxy - sx * sy) / spread : 0.0;
  for (const auto& [n, y] : medians) {
    table.emplace_back(n, line ? (sy - slope * sx) / sw + slope * static_cast<double>(n) : y);
  }
  if (ratios[0].size() >= 3 || table.empty()) return table;
  // A colocated worker runs the spaced prompts beside its decode rows, one
  // pass (placement::ForwardPassSeconds): the prompt's factor is what is
  // left of the step after the rows' attention at their own factor, over
  // the prefill of the prompt and the rows as one token each.
  std::vector<double> mixed;
  for (size_t i = 0; i < rows.size(); ++i) {
    const StepRow& r = rows[i];
    if (r.start_s < probe.spaced.start_s || r.start_s > probe.spaced.end_s || r.prompts != 1 || r.decode < 1) continue;
    const std::vector<int64_t> ctx = RowContexts(r);
    std::vector<int64_t> lens(static_cast<size_t>(r.decode) + 1, 1);
    lens[0] = r.tokens;
    const std::vector<int64_t> none(static_cast<size_t>(r.decode), 0);
    const double prompt = latency.Prefill({}, lens);
    const double rest =
        placement::FactorAtRows(table, r.decode) * (latency.Decode({}, ctx) - latency.Decode({}, none));
    if (prompt > 0 && r.ms / 1e3 > rest) mixed.push_back((r.ms / 1e3 - rest) / prompt);
  }
  if (mixed.size() >= 3) table.insert(table.begin(), {0, Percentile(mixed, 0.5)});
  return table;
}

// A worker's speed during a run, from the run's own steps, to show how well
// the probes around it tracked it (duet sim does not use it): the median
// of real over predicted time of its prompts alone that start within 0.1 s
// of its step before (a prompt after a longer idle spell pays the idle
// penalty too), as rows 0, and of its decode steps alone, as rows 1; each
// with at least 3 steps.
SpeedTable SpeedDuring(const std::vector<StepRow>& rows, TimeSpan span, placement::LatencyModel& latency) {
  std::vector<double> prompt, decode;
  for (size_t i = 1; i < rows.size(); ++i) {
    const StepRow& r = rows[i];
    if (r.start_s < span.start_s || r.start_s >= span.end_s) continue;
    const bool warm = r.start_s - rows[i - 1].start_s - rows[i - 1].ms / 1e3 < 0.1;
    if (std::optional<double> ratio = StepRatio(rows, i, latency, true, warm)) {
      (r.decode == 0 ? prompt : decode).push_back(*ratio);
    }
  }
  SpeedTable t;
  if (prompt.size() >= 3) t.emplace_back(0, Percentile(prompt, 0.5));
  if (decode.size() >= 3) t.emplace_back(1, Percentile(decode, 0.5));
  return t;
}

// Two probes' tables as one for duet sim: at each row count of either, the
// geometric mean of the two (a probe with too few steps of some kind leaves
// the other's). Prefill (0 rows) as profiled where neither measured it.
SpeedTable MeanSpeed(const SpeedTable& a, const SpeedTable& b) {
  auto split = [](const SpeedTable& t, std::vector<double>* prefill, SpeedTable* decode) {
    for (const auto& [n, f] : t) {
      if (n == 0) {
        prefill->push_back(f);
      } else {
        decode->emplace_back(n, f);
      }
    }
  };
  std::vector<double> prefill;
  SpeedTable da, db;
  split(a, &prefill, &da);
  split(b, &prefill, &db);
  std::map<int64_t, double> out;
  out[0] = prefill.empty() ? 1.0 : prefill.size() == 1 ? prefill[0] : std::sqrt(prefill[0] * prefill[1]);
  if (da.empty()) da = db;
  if (db.empty()) db = da;
  for (const SpeedTable* t : {&da, &db}) {
    for (const auto& [n, f] : *t) out[n] = std::sqrt(placement::FactorAtRows(da, n) * placement::FactorAtRows(db, n));
  }
  return SpeedTable(out.begin(), out.end());
}

std::string DescribeSpeed(const SpeedTable& t) {
  std::string s;
  for (const auto& [n, f] : t) absl::StrAppend(&s, s.empty() ? "" : " ", n, ":", absl::StrFormat("%.2f", f));
  return s.empty() ? "as profiled" : s;
}

// A run's TTFTs and, for requests of more than one token, TPOTs; an error
// if any request failed.
absl::Status RealLatencies(const RunResult& r, const std::string& cluster, std::vector<double>* ttft,
                           std::vector<double>* tpot) {
  for (const Outcome& o : r.outcomes) {
    if (!o.ok()) return absl::InternalError(absl::StrCat(cluster, ": a request failed: ", o.error));
    ttft->push_back(o.ttft());
    if (o.tokens > 1) tpot->push_back(o.tpot());
  }
  return absl::OkStatus();
}

// The real clusters at three rates beside duet sim of the same clusters and
// requests, with the engine's latencies from duet profile on this machine.
// SLOs per cluster from the real runs (SparsestSlo: 30-70% attainment at
// the middle rate). Attainment of TTFT and of TPOT, real and
// simulated; the largest gap also with the SLOs at the medians.
absl::Status SimCheck(const FlagSet& f, const std::string& model_dir, const std::vector<TraceRow>& rows,
                      double scale, int64_t context, int64_t vocab, const std::vector<double>& rates) {
  const Clock::time_point start = Clock::now();
  const std::string model_name = testing::ModelBaseName(model_dir);
  const std::string run_root = absl::StrCat(fs::temp_directory_path().string(), "/duet-serve-sim-", getpid());
  fs::create_directories(run_root);
  // Each cluster's profile is taken just before its runs; the disaggregated
  // one also before the interference timings (in two runs, a profile taken
  // right after their two-core load timed decode steps 17-20% slower than
  // the workers then ran).
  Progress("disaggregated: duet profile of the engine, 1 thread");
  ASSIGN_OR_RETURN(std::string disaggregated_profile,
                   Profile(model_dir, run_root + "/profile-disaggregated.json"));
  // Memory-bandwidth interference of the two disaggregated workers: each
  // role's typical shape alone and beside the other's load on the other core.
  Progress("the engine beside a neighbour's load (prefill next to decode steps, decode next to prefill)");
  ASSIGN_OR_RETURN(double interference_prefill, MeasureInterference(model_dir, /*prefill=*/true));
  ASSIGN_OR_RETURN(double interference_decode, MeasureInterference(model_dir, /*prefill=*/false));
  interference_prefill = std::max(0.0, interference_prefill);
  interference_decode = std::max(0.0, interference_decode);
  ASSIGN_OR_RETURN(placement::ModelSpec spec, placement::ModelFromConfig(model_dir));
  spec.dtype_bytes = 4;  // the CPU backend's KV is F32
  const double kv_gib = f.GetDouble("kv-memory");
  const double kv_tokens = kv_gib * 1073741824.0 / static_cast<double>(spec.KvBytesPerToken());
  struct SetupSim {
    Setup setup;
    std::string profile;  // duet profile's file
    placement::ClusterSpec cluster;  // instances in the order of setup.workers
  };
  // Every worker has one thread on a core of its own. The one two-thread
  // colocated worker of earlier versions of this check ran its steps 10-25%
  // over the profile under load against 0-5% at a low rate (each layer waits
  // for whichever of its threads the router or the clients preempted, most
  // likely). Two colocated instances (data parallel, round robin) use the
  // same two cores as the prefill and decode workers.
  std::vector<SetupSim> setups(2);
  setups[0].setup = {"disaggregated", {{"prefill", 1, {0}}, {"decode", 1, {1}}}};
  setups[0].profile = disaggregated_profile;
  setups[0].cluster.instances = {
      {.role = placement::InstanceRole::kPrefill, .kv_capacity_tokens = kv_tokens, .max_batch_tokens = 2048},
      {.role = placement::InstanceRole::kDecode, .kv_capacity_tokens = kv_tokens, .max_batch_tokens = 2048}};
  setups[0].cluster.kv_link_bytes_per_s = 5e9;  // the same-host lane, measured by //tools/bench:kvtransfer
  setups[0].cluster.interference_prefill = interference_prefill;
  setups[0].cluster.interference_decode = interference_decode;
  setups[1].setup = {"colocated", {{"colocated", 1, {0}}, {"colocated", 1, {1}}}};
  for (int i = 0; i < 2; ++i) {
    setups[1].cluster.instances.push_back(
        {.role = placement::InstanceRole::kColocated, .kv_capacity_tokens = kv_tokens, .max_batch_tokens = 2048});
  }
  setups[1].cluster.chunked_prefill = true;  // the engine: decodes first, prompt chunks fill the budget
  setups[1].cluster.chunk_tokens = 2048;
  for (SetupSim& ss : setups) ss.cluster.policy = "round_robin";  // the router's, below

  std::printf("duet serve bench, simulation check: %s, %zu requests per rate, length scale %g; the same clusters "
              "and requests in duet sim with latencies from duet profile on this machine, each worker's steps "
              "scaled by their speed against the profile by decode rows, measured just before and after each run "
              "(profile: unscaled)\n"
              "disaggregated: prefill (core 0) + decode (core 1); colocated: 2 workers (cores 0 and 1), round "
              "robin; 1 thread each\n"
              "SLOs per cluster: where the fewest real TTFTs (TPOTs) of the three rates lie within 3%%, keeping the "
              "real attainment at the middle rate within 30-70%%\n"
              "disaggregated workers share the memory bus: measured slowdown beside the other role's load %.0f%% "
              "(prefill), %.0f%% (decode), applied while both compute\n\n",
              model_dir.c_str(), rows.size(), scale, interference_prefill * 100, interference_decode * 100);
  std::printf("%-14s %5s %8s %8s | %5s %5s %6s %9s | %5s %5s %6s %9s\n", "cluster", "rate", "TTFT SLO", "TPOT SLO",
              "TTFT", "sim", "diff", "(profile)", "TPOT", "sim", "diff", "(profile)");
  std::printf("%-14s %5s %8s %8s | %5s %5s %6s %9s | %5s %5s %6s %9s\n", "", "req/s", "", "", "real", "", "pp",
              "", "real", "", "pp", "");
  double worst = 0, worst_as_profiled = 0, worst_at_median = 0, worst_real_again = 0;
  uint32_t probe_seed = 1000;
  for (SetupSim& ss : setups) {
    if (ss.profile.empty()) {
      Progress(absl::StrCat(ss.setup.name, ": duet profile of the engine, 1 thread"));
      ASSIGN_OR_RETURN(ss.profile, Profile(model_dir, absl::StrCat(run_root, "/profile-", ss.setup.name, ".json")));
    }
    Progress(absl::StrCat(ss.setup.name, ": starting the cluster"));
    LocalCluster cluster(run_root + "/" + ss.setup.name);
    const std::string dump = f.GetString("sim-dump");
    if (!dump.empty()) {
      fs::create_directories(dump);
      std::error_code ec;
      fs::copy_file(ss.profile, absl::StrCat(dump, "/", ss.setup.name, "-profile.json"),
                    fs::copy_options::overwrite_existing, ec);
    }
    const std::string step_logs = absl::StrCat(dump.empty() ? run_root : dump, "/", ss.setup.name, "-steps-");
    RETURN_IF_ERROR(
        cluster.Start(model_dir, ss.setup.workers, kv_gib, f.GetInt("heartbeat-ms"), step_logs, "round_robin"));
    for (int i = 0; i < 2; ++i) {  // one each on two colocated workers; even, for round robin
      BenchRequest w{0, std::vector<int32_t>(64, 7), 8};
      Outcome o = StreamCompletion(cluster.http_port(), CompletionBody(model_name, w), Clock::now(), 300);
      if (!o.ok()) return absl::InternalError(absl::StrCat(ss.setup.name, ": warm-up failed: ", o.error));
    }
    ASSIGN_OR_RETURN(auto latency, placement::LoadLatencyModel(ss.profile, spec));
    std::vector<std::vector<double>> real_ttft(rates.size()), real_tpot(rates.size());
    std::vector<RunResult> runs;
    std::vector<std::vector<BenchRequest>> workloads;
    for (double rate : rates) {
      workloads.push_back(MakeWorkload(rows, rate, scale, context, vocab, static_cast<uint32_t>(f.GetInt("seed"))));
    }
    // The spaced probe's prompts: the runs' lengths at spread quantiles.
    std::vector<int64_t> lens, probe_lens;
    for (const BenchRequest& b : workloads[0]) lens.push_back(static_cast<int64_t>(b.prompt.size()));
    std::sort(lens.begin(), lens.end());
    for (int i = 0; i < kProbePrompts; ++i) {
      probe_lens.push_back(lens[static_cast<size_t>((i + 0.5) / kProbePrompts * static_cast<double>(lens.size()))]);
    }
    std::vector<Probe> probes;  // before run 0, between runs, after the last
    Progress(absl::StrCat(ss.setup.name, ": speed probe (", kProbeRequests, " chained requests, ", kProbePrompts,
                          " spaced prompts of ", absl::StrJoin(probe_lens, ", "), " tokens)"));
    ASSIGN_OR_RETURN(Probe probe, SpeedProbe(cluster.http_port(), model_name, vocab, probe_lens, probe_seed++));
    probes.push_back(probe);
    for (size_t k = 0; k < rates.size(); ++k) {
      Progress(absl::StrCat(ss.setup.name, ": ", rows.size(), " requests at ", rates[k], " req/s"));
      RunResult r = Replay(cluster.http_port(), model_name, workloads[k], f.GetDouble("timeout-s"));
      if (!dump.empty()) {
        // Where each rate's run starts on the steady clock of the step logs.
        std::ofstream starts(absl::StrCat(dump, "/", ss.setup.name, "-runs.csv"),
                             k == 0 ? std::ios::trunc : std::ios::app);
        starts << rates[k] << "," << SteadySeconds(r.t0) << "\n";
      }
      RETURN_IF_ERROR(cluster.CheckAlive());
      RETURN_IF_ERROR(RealLatencies(r, ss.setup.name, &real_ttft[k], &real_tpot[k]));
      runs.push_back(std::move(r));
      ASSIGN_OR_RETURN(probe, SpeedProbe(cluster.http_port(), model_name, vocab, probe_lens, probe_seed++));
      probes.push_back(probe);
    }
    // The middle rate once more, the same requests: how far the real cluster
    // lands from itself minutes later, at the same SLOs.
    const size_t mid = rates.size() / 2;
    Progress(absl::StrCat(ss.setup.name, ": ", rows.size(), " requests at ", rates[mid], " req/s again"));
    std::vector<double> again_ttft, again_tpot;
    {
      RunResult r = Replay(cluster.http_port(), model_name, workloads[mid], f.GetDouble("timeout-s"));
      RETURN_IF_ERROR(cluster.CheckAlive());
      RETURN_IF_ERROR(RealLatencies(r, ss.setup.name, &again_ttft, &again_tpot));
    }
    // Each worker's speed at each probe; a run's is the geometric mean of the
    // probes around it.
    const std::vector<std::string>& ids = cluster.worker_ids();
    std::vector<std::vector<SpeedTable>> speed(ids.size());  // [worker][probe]
    std::string speed_lines, during_lines;
    for (size_t w = 0; w < ids.size(); ++w) {
      ASSIGN_OR_RETURN(std::vector<StepRow> steps, ReadStepLog(absl::StrCat(step_logs, ids[w], ".csv")));
      absl::StrAppend(&speed_lines, "  ", ids[w], ":");
      for (size_t p = 0; p < probes.size(); ++p) {
        SpeedTable t = SpeedByRows(steps, probes[p], *latency);
        absl::StrAppend(&speed_lines, p ? " |" : "", " ", DescribeSpeed(t));
        speed[w].push_back(std::move(t));
      }
      absl::StrAppend(&during_lines, "  ", ids[w], ":");
      for (size_t k = 0; k < rates.size(); ++k) {
        const TimeSpan run{SteadySeconds(runs[k].t0), probes[k + 1].chained.start_s};
        const SpeedTable t = SpeedDuring(steps, run, *latency);
        absl::StrAppend(&during_lines, k ? " |" : "", " ", t.empty() ? "-" : DescribeSpeed(t));
      }
      absl::StrAppend(&speed_lines, "\n");
      absl::StrAppend(&during_lines, "\n");
    }
    const double ttft_slo = SparsestSlo(real_ttft, mid), tpot_slo = SparsestSlo(real_tpot, mid);
    const double ttft_median = Percentile(real_ttft[mid], 0.5), tpot_median = Percentile(real_tpot[mid], 0.5);
    for (size_t k = 0; k < rates.size(); ++k) {
      std::vector<placement::SimRequest> sim_reqs;
      for (const BenchRequest& b : workloads[k]) {
        sim_reqs.push_back({b.arrival_s, static_cast<int64_t>(b.prompt.size()), b.max_tokens});
      }
      placement::ClusterSpec tracked = ss.cluster;
      std::vector<std::unique_ptr<placement::LatencyModel>> scaled;
      for (size_t w = 0; w < ids.size(); ++w) {
        // The probes time a disaggregated worker beside the other's load
        // (the chained phase keeps the prefill worker busy, the spaced one
        // runs prompts beside a decode): their factors already hold the
        // interference duet sim adds while both compute, so it comes out.
        const placement::InstanceRole role = ss.cluster.instances[w].role;
        const double beside = role == placement::InstanceRole::kPrefill  ? ss.cluster.interference_prefill
                              : role == placement::InstanceRole::kDecode ? ss.cluster.interference_decode
                                                                         : 0.0;
        SpeedTable t = MeanSpeed(speed[w][k], speed[w][k + 1]);
        for (auto& [rows, factor] : t) factor /= 1 + beside;
        scaled.push_back(placement::NewScaledLatency(latency.get(), std::move(t)));
        tracked.instances[w].latency = scaled.back().get();
      }
      const placement::SimResult sr = placement::Simulate(tracked, spec, *latency, sim_reqs);
      const placement::SimResult raw = placement::Simulate(ss.cluster, spec, *latency, sim_reqs);
      auto latencies = [](const placement::SimResult& r, std::vector<double>* ttft, std::vector<double>* tpot) {
        for (const placement::RequestOutcome& o : r.requests) {
          ttft->push_back(o.first_token >= 0 ? o.ttft() : std::numeric_limits<double>::infinity());
          if (o.output > 1) tpot->push_back(o.tpot());
        }
      };
      std::vector<double> sim_ttft, sim_tpot, raw_ttft, raw_tpot;
      latencies(sr, &sim_ttft, &sim_tpot);
      latencies(raw, &raw_ttft, &raw_tpot);
      const double rt = Fraction(real_ttft[k], ttft_slo), st = Fraction(sim_ttft, ttft_slo);
      const double rp = Fraction(real_tpot[k], tpot_slo), sp = Fraction(sim_tpot, tpot_slo);
      const double raw_t = Fraction(raw_ttft, ttft_slo), raw_p = Fraction(raw_tpot, tpot_slo);
      worst_at_median = std::max({worst_at_median,
                                  std::fabs(Fraction(real_ttft[k], ttft_median) - Fraction(sim_ttft, ttft_median)),
                                  std::fabs(Fraction(real_tpot[k], tpot_median) - Fraction(sim_tpot, tpot_median))});
      if (!dump.empty()) {
        // One row per request, real beside simulated, for diagnosis.
        std::ofstream out(absl::StrCat(dump, "/", ss.setup.name, "-", rates[k], ".csv"));
        out << "request,arrival_s,prompt,max_tokens,real_tokens,real_send_s,real_ttft_s,real_tpot_s,sim_ttft_s,"
               "sim_tpot_s,sim_queue_s,profile_ttft_s,profile_tpot_s\n";
        for (size_t i = 0; i < workloads[k].size() && i < runs[k].outcomes.size() && i < sr.requests.size(); ++i) {
          const BenchRequest& b = workloads[k][i];
          const Outcome& o = runs[k].outcomes[i];
          const placement::RequestOutcome& so = sr.requests[i];
          out << i << "," << b.arrival_s << "," << b.prompt.size() << "," << b.max_tokens << "," << o.tokens << ","
              << o.send_s << "," << o.ttft() << "," << o.tpot() << "," << so.ttft() << "," << so.tpot() << ","
              << so.queue_wait() << "," << raw.requests[i].ttft() << "," << raw.requests[i].tpot() << "\n";
        }
      }
      worst = std::max({worst, std::fabs(rt - st), std::fabs(rp - sp)});
      worst_as_profiled = std::max({worst_as_profiled, std::fabs(rt - raw_t), std::fabs(rp - raw_p)});
      std::printf("%-14s %5.2f %6.0fms %6.1fms | %5.2f %5.2f %+6.1f %+9.1f | %5.2f %5.2f %+6.1f %+9.1f\n",
                  ss.setup.name.c_str(), rates[k], ttft_slo * 1e3, tpot_slo * 1e3, rt, st, (st - rt) * 100,
                  (raw_t - rt) * 100, rp, sp, (sp - rp) * 100, (raw_p - rp) * 100);
      std::fflush(stdout);
    }
    const double again_t = Fraction(again_ttft, ttft_slo) - Fraction(real_ttft[mid], ttft_slo);
    const double again_p = Fraction(again_tpot, tpot_slo) - Fraction(real_tpot[mid], tpot_slo);
    worst_real_again = std::max({worst_real_again, std::fabs(again_t), std::fabs(again_p)});
    std::printf("%-14s %5.2f again: TTFT %.2f (%+.1f pp), TPOT %.2f (%+.1f pp) against the first run at %.2f req/s\n",
                ss.setup.name.c_str(), rates[mid], Fraction(again_ttft, ttft_slo), again_t * 100,
                Fraction(again_tpot, tpot_slo), again_p * 100, rates[mid]);
    std::printf("speed against the profile at the %zu probes, decode rows:factor (0: prompts alone; 1.05: 5%% "
                "slower)\n%s",
                probes.size(), speed_lines.c_str());
    std::printf("speed over each run's own steps (rates in order; not used by duet sim), warm prompts alone (0) and "
                "decode steps (1)\n%s",
                during_lines.c_str());
    std::fflush(stdout);
  }
  std::printf("\nlargest gap: %.1f percentage points (target <= 5); total wall time %.0f s (target < 900)\n"
              "with the profile unscaled: largest gap %.1f pp; with the SLOs at the middle rate's real medians "
              "instead (the densest point, where a 1%% shift of either side moves several requests across the "
              "line): %.1f pp\n"
              "the real clusters against themselves (the middle rate run again, the same requests, the same "
              "SLOs): largest gap %.1f pp\n",
              worst * 100, Seconds(Clock::now() - start), worst_as_profiled * 100, worst_at_median * 100,
              worst_real_again * 100);
  std::error_code ec;
  fs::remove_all(run_root, ec);
  return absl::OkStatus();
}

absl::Status Run(const FlagSet& f) {
  const Clock::time_point bench_start = Clock::now();
  const double rate = f.GetDouble("rate");
  const double scale = f.GetDouble("length-scale");
  const int64_t n = f.GetInt("requests");
  const double timeout_s = f.GetDouble("timeout-s");
  if (rate <= 0 || scale <= 0 || n < 2 || timeout_s <= 0) {
    return absl::InvalidArgumentError("--rate, --length-scale and --timeout-s must be > 0, --requests >= 2");
  }
  std::string trace = f.GetString("trace");
  if (!f.IsSet("trace")) {
    const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
    trace = absl::StrCat(ws != nullptr ? ws : ".", "/../shared/data/traces/splitwise_conv.csv");
  }
  std::string model_dir = f.GetString("model");
  if (model_dir.empty()) {
    Progress("making or finding the cached bench model (the first time takes a while)");
    ASSIGN_OR_RETURN(model_dir, testing::EnsureCachedModel("bench", "llama"));
  }
  std::ifstream cfg_in(model_dir + "/config.json");
  Json cfg = Json::parse(cfg_in, nullptr, false);
  if (cfg.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(model_dir, "/config.json is not JSON"));
  const int64_t context = cfg.value("max_position_embeddings", 2048);
  const int64_t vocab = cfg.value("vocab_size", 32000);
  const std::string model_name = testing::ModelBaseName(model_dir);

  ASSIGN_OR_RETURN(std::vector<TraceRow> rows, LoadTrace(trace, f.GetInt("offset"), n));
  if (!f.GetString("sim-rates").empty()) {
    std::vector<double> rates;
    for (absl::string_view r : absl::StrSplit(f.GetString("sim-rates"), ',', absl::SkipEmpty())) {
      double x = 0;
      if (!absl::SimpleAtod(r, &x) || !(x > 0)) return absl::InvalidArgumentError("--sim-rates: positive rates");
      rates.push_back(x);
    }
    if (rates.size() != 3) return absl::InvalidArgumentError("--sim-rates takes three rates: low, knee, past it");
    return SimCheck(f, model_dir, rows, scale, context, vocab, rates);
  }
  const std::vector<BenchRequest> reqs =
      MakeWorkload(rows, rate, scale, context, vocab, static_cast<uint32_t>(f.GetInt("seed")));
  std::vector<double> plen, olen;
  for (const BenchRequest& r : reqs) {
    plen.push_back(static_cast<double>(r.prompt.size()));
    olen.push_back(static_cast<double>(r.max_tokens));
  }
  double prompt_sum = 0, out_sum = 0;
  for (double v : plen) prompt_sum += v;
  for (double v : olen) out_sum += v;

  const double kv_gib = f.GetDouble("kv-memory");
  const int cores = 2;
  std::vector<Setup> setups = {
      {"disaggregated", {{"prefill", 1, {0}}, {"decode", 1, {1}}}},
      {"colocated", {{"colocated", cores, {0, 1}}}},
  };
  if (std::thread::hardware_concurrency() < static_cast<unsigned>(cores)) {
    return absl::FailedPreconditionError("this benchmark pins workers to cores 0 and 1; the machine has fewer");
  }
  const std::string run_root = absl::StrCat(fs::temp_directory_path().string(), "/duet-serve-bench-", getpid());

  double ttft_slo = f.GetDouble("ttft-slo"), tpot_slo = f.GetDouble("tpot-slo");
  std::string slo_note = "given";
  std::vector<Summary> summaries;
  std::vector<double> run_walls;
  std::vector<double> other_cores;  // Cores' worth of CPU other processes used during each run.
  for (const Setup& s : setups) {
    Progress(absl::StrCat(s.name, ": starting the cluster"));
    LocalCluster cluster(run_root + "/" + s.name);
    RETURN_IF_ERROR(cluster.Start(model_dir, s.workers, kv_gib, f.GetInt("heartbeat-ms")));
    // Warm-up: first-use costs (UCX endpoints, allocations) are not the load's.
    {
      BenchRequest w{0, std::vector<int32_t>(64, 7), 8};
      Outcome o = StreamCompletion(cluster.http_port(), CompletionBody(model_name, w), Clock::now(), timeout_s);
      if (!o.ok()) return absl::InternalError(absl::StrCat(s.name, ": warm-up request failed: ", o.error));
    }
    // The SLOs, unless given: a multiple of one request alone on the first
    // (disaggregated) cluster, at the slice's p90 prompt and median output.
    if (ttft_slo <= 0 || tpot_slo <= 0) {
      BenchRequest probe{0, std::vector<int32_t>(static_cast<size_t>(Percentile(plen, 0.9)), 11),
                         std::max<int64_t>(8, static_cast<int64_t>(Percentile(olen, 0.5)))};
      Outcome o = StreamCompletion(cluster.http_port(), CompletionBody(model_name, probe), Clock::now(), timeout_s);
      if (!o.ok()) return absl::InternalError(absl::StrCat(s.name, ": SLO probe failed: ", o.error));
      const double k = f.GetDouble("slo-scale");
      if (ttft_slo <= 0) ttft_slo = k * o.ttft();
      if (tpot_slo <= 0) tpot_slo = k * o.tpot();
      slo_note = absl::StrCat(k, "x one ", probe.prompt.size(), "-token prompt alone on ", s.name, " (TTFT ",
                              static_cast<int>(o.ttft() * 1e3), " ms, TPOT ",
                              static_cast<int>(o.tpot() * 1e3), " ms)");
    }
    Progress(absl::StrCat(s.name, ": replaying ", n, " requests at ", rate, " req/s (~",
                          static_cast<int>(reqs.back().arrival_s), " s of arrivals)"));
    const CpuTicks before = ReadCpuTicks(cluster.pids());
    RunResult r = Replay(cluster.http_port(), model_name, reqs, timeout_s);
    const CpuTicks after = ReadCpuTicks(cluster.pids());
    const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK)) * std::max(r.wall_s, 1e-3);
    other_cores.push_back(
        std::max<double>(0, (after.machine_busy - before.machine_busy) - (after.ours - before.ours)) / ticks);
    RETURN_IF_ERROR(cluster.CheckAlive());
    summaries.push_back(Summarize(r, ttft_slo, tpot_slo));
    run_walls.push_back(r.wall_s);
    Progress(absl::StrCat(s.name, ": done in ", static_cast<int>(r.wall_s), " s, ", summaries.back().errors,
                          " errors", summaries.back().errors ? " (first: " + summaries.back().first_error + ")" : ""));
  }
  const bool failed = summaries[0].errors + summaries[1].errors > 0;
  std::error_code ec;
  if (!failed) fs::remove_all(run_root, ec);

  std::printf("duet serve bench: %s, trace %s rows %lld..%lld\n", model_dir.c_str(), trace.c_str(),
              static_cast<long long>(f.GetInt("offset")), static_cast<long long>(f.GetInt("offset") + n - 1));
  std::printf("workload: %lld requests at %.2f req/s (trace gaps rescaled; %.0f s of arrivals), length scale %g: "
              "prompt mean %.0f p50 %.0f max %.0f tokens, output mean %.0f p50 %.0f max %.0f tokens\n",
              static_cast<long long>(n), rate, reqs.back().arrival_s, scale, prompt_sum / n, Percentile(plen, 0.5),
              Percentile(plen, 1.0), out_sum / n, Percentile(olen, 0.5), Percentile(olen, 1.0));
  std::printf("disaggregated: router + prefill (core 0, 1 thread) + decode (core 1, 1 thread); "
              "colocated: router + 1 worker (cores 0-1, %d threads); routers unpinned; heartbeat %lld ms\n",
              cores, static_cast<long long>(f.GetInt("heartbeat-ms")));
  std::printf("SLO: TTFT <= %.0f ms and TPOT <= %.0f ms (%s)\n\n", ttft_slo * 1e3, tpot_slo * 1e3,
              slo_note.c_str());
  const Summary& d = summaries[0];
  const Summary& c = summaries[1];
  std::printf("%-24s %14s %14s %8s\n", "figure", "disaggregated", "colocated (ref)", "ratio");
  auto row = [](const std::string& name, double a, double b, const char* fmt) {
    char x[32], y[32];
    std::snprintf(x, sizeof(x), fmt, a);
    std::snprintf(y, sizeof(y), fmt, b);
    std::printf("%-24s %14s %14s %8.2f\n", name.c_str(), x, y, b != 0 ? a / b : NAN);
  };
  const char* q[3] = {"p50", "p90", "p99"};
  for (int i = 0; i < 3; ++i) row(absl::StrCat("TTFT ", q[i], " ms"), d.ttft[i] * 1e3, c.ttft[i] * 1e3, "%.0f");
  for (int i = 0; i < 3; ++i) row(absl::StrCat("TPOT ", q[i], " ms"), d.tpot[i] * 1e3, c.tpot[i] * 1e3, "%.1f");
  row("SLO attainment", d.slo_attainment, c.slo_attainment, "%.2f");
  row("throughput req/s", d.req_per_s, c.req_per_s, "%.3f");
  row("throughput out tok/s", d.tok_per_s, c.tok_per_s, "%.1f");
  row("run wall s", run_walls[0], run_walls[1], "%.1f");
  std::printf("%-24s %14lld %14lld %8s\n", "errors", static_cast<long long>(d.errors),
              static_cast<long long>(c.errors), "-");
  for (size_t i = 0; i < summaries.size(); ++i) {
    if (summaries[i].errors > 0) {
      std::printf("first error (%s): %s\n", setups[i].name.c_str(), summaries[i].first_error.c_str());
    }
  }
  if (failed) std::printf("the processes' logs are kept in %s\n", run_root.c_str());
  std::printf("\nother processes on the machine used %.2f (disaggregated) and %.2f (colocated) cores' worth "
              "of CPU during the runs (of %d; above ~0.1 the figures are skewed)\n",
              other_cores[0], other_cores[1], cores);
  std::printf("total wall time %.1f s\n", Seconds(Clock::now() - bench_start));
  if (failed) return absl::InternalError("some requests failed");
  return absl::OkStatus();
}

}  // namespace
}  // namespace duet::bench

int main(int argc, char** argv) {
  duet::FlagSet f("serve",
                  "Replays a slice of the Splitwise conversation trace open-loop against a disaggregated\n"
                  "cluster (prefill on core 0, decode on core 1) and a colocated one (both cores), and\n"
                  "prints TTFT, TPOT, SLO attainment and throughput side by side.");
  f.Double("rate", 1.0, "mean arrival rate, requests/s (the trace's gaps, rescaled)");
  f.Int("requests", 120, "requests to replay (trace rows from --offset)");
  f.Int("offset", 0, "first trace row");
  f.Double("length-scale", 0.25, "factor on the trace's prompt and output lengths (clamped to the context)");
  f.String("trace", "", "trace CSV (default: ../shared/data/traces/splitwise_conv.csv from the workspace)");
  f.String("model", "", "model directory (default: the cached bench model, made on first use)");
  f.Double("ttft-slo", 0, "TTFT SLO in seconds (0: --slo-scale x one request alone)");
  f.Double("tpot-slo", 0, "TPOT SLO in seconds (0: --slo-scale x one request alone)");
  f.Double("slo-scale", 5, "SLOs measured from one request alone are this multiple of its latency");
  f.Double("kv-memory", 0.5, "KV cache per worker in GiB");
  // A worker pinned to a core that other work also wants can miss three
  // heartbeats in a row; raise this on a busy machine.
  f.Int("heartbeat-ms", 500, "heartbeat interval of router and workers (3 missed: the worker is dropped)");
  f.Double("timeout-s", 300, "a request not done after this long counts as an error");
  f.Int("seed", 1, "seed of the prompts' token ids");
  f.String("sim-dump", "", "diagnosis: with --sim-rates, write each request's real and simulated TTFT and TPOT "
                           "to DIR/<cluster>-<rate>.csv, each worker's forward passes to "
                           "DIR/<cluster>-steps-<worker>.csv (DUET_STEP_LOG), each run's start to "
                           "DIR/<cluster>-runs.csv and the profile to DIR/<cluster>-profile.json");
  f.String("sim-rates", "", "three rates (low, near the knee, past it): run both clusters at each beside duet sim "
                            "of them with duet profile's latencies, and compare SLO attainment; the middle rate "
                            "runs a second time, to show how far the real clusters land from themselves");
  return duet::RunWithFlags(f, argc, argv, duet::bench::Run, "serve bench");
}
