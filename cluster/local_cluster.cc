#include "cluster/local_cluster.h"

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"

namespace duet::cluster {
namespace fs = std::filesystem;

LocalCluster::LocalCluster(ClusterOptions options) : options_(std::move(options)) {
  if (options_.duet_binary.empty()) options_.duet_binary = fs::absolute("tools/duet").string();
  if (options_.run_dir.empty()) {
    static int counter = 0;
    const char* test_tmp = std::getenv("TEST_TMPDIR");  // Bazel's per-test folder.
    const std::string root = test_tmp != nullptr ? test_tmp : fs::temp_directory_path().string();
    options_.run_dir = absl::StrCat(root, "/duet-cluster-", getpid(), "-", counter++);
    fs::remove_all(options_.run_dir);
  }
  fs::create_directories(options_.run_dir);
}

LocalCluster::~LocalCluster() { Stop(); }

void LocalCluster::Stop() {
  // SIGINT: the whole cluster stops, so no worker drains (SIGTERM would).
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) procs_[*it]->Terminate(absl::Seconds(5), SIGINT);
}

std::string LocalCluster::LogTail(const std::string& id, size_t max_bytes) const {
  std::ifstream in(options_.run_dir + "/" + id + ".log", std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), {});
  return s.size() > max_bytes ? "..." + s.substr(s.size() - max_bytes) : s;
}

std::vector<pid_t> LocalCluster::pids() const {
  std::vector<pid_t> out;
  for (const std::string& id : order_) out.push_back(procs_.at(id)->pid());
  return out;
}

absl::Status LocalCluster::Launch(const std::string& id, std::vector<std::string> args,
                                  const std::vector<std::string>& env, const std::vector<int>& cpus) {
  if (procs_.count(id)) return absl::AlreadyExistsError(absl::StrCat("a process named ", id, " is already started"));
  std::error_code ec;
  fs::remove(ReadyPath(id), ec);  // A ready file left from an earlier run must not count.
  args.push_back("--ready-file");
  args.push_back(ReadyPath(id));
  ASSIGN_OR_RETURN(auto p, Subprocess::Start(args, env, options_.run_dir + "/" + id + ".log", cpus));
  p->set_name(id);
  procs_[id] = std::move(p);
  order_.push_back(id);
  // Supervise reads the ready file once it appears (WaitReady may too).
  launches_[id] = LaunchSpec{.argv = std::move(args), .env = env, .cpus = cpus, .started = absl::Now(),
                             .awaiting_ready = true};
  return absl::OkStatus();
}

absl::Status LocalCluster::Retire(const std::string& id) {
  auto it = launches_.find(id);
  if (it == launches_.end() || it->second.role.empty()) return absl::NotFoundError(absl::StrCat("no worker named ", id));
  if (it->second.retiring) return absl::OkStatus();
  it->second.retiring = true;
  // One already exited is forgotten by the next Supervise pass.
  if (procs_[id]->TryWait()) return absl::OkStatus();
  return procs_[id]->Signal(SIGTERM);
}

bool LocalCluster::retiring(const std::string& id) const {
  auto it = launches_.find(id);
  return it != launches_.end() && it->second.retiring;
}

int LocalCluster::restarts(const std::string& id) const {
  auto it = launches_.find(id);
  return it == launches_.end() ? 0 : it->second.restarts;
}

bool LocalCluster::Supervise(const std::function<void(const std::string&)>& log) {
  bool became_ready = false;
  const absl::Time now = absl::Now();
  std::vector<std::string> gone;
  for (const std::string& id : order_) {
    Subprocess& p = *procs_[id];
    LaunchSpec& l = launches_[id];
    if (std::optional<int> st = p.TryWait()) {
      if (l.retiring) {
        log(absl::StrCat(id, " (pid ", p.pid(), ") drained and ", DescribeExit(*st), " (retired)"));
        gone.push_back(id);
        continue;
      }
      if (!l.reported) {
        l.reported = true;
        if (now - l.started >= kStableRun) l.backoff = kRestartBackoff;
        l.restart_at = now + l.backoff;
        log(absl::StrCat(id, " (pid ", p.pid(), ") ", DescribeExit(*st), "; restarting it in ",
                         absl::FormatDuration(l.backoff), " (log: ", p.log_path(), ")"));
        l.backoff = std::min(l.backoff * 2, kMaxRestartBackoff);
      }
      if (now < l.restart_at) continue;
      std::error_code ec;
      std::filesystem::remove(ReadyPath(id), ec);
      auto next = Subprocess::Start(l.argv, l.env, p.log_path(), l.cpus);
      if (!next.ok()) {
        log(absl::StrCat("cannot restart ", id, ": ", next.status().message()));
        l.restart_at = now + l.backoff;
        continue;
      }
      (*next)->set_name(id);
      procs_[id] = std::move(*next);
      l.started = now;
      l.reported = false;
      l.awaiting_ready = true;
      ++l.restarts;
      log(absl::StrCat("restarted ", id, " (pid ", procs_[id]->pid(), ", restart ", l.restarts, ")"));
      continue;
    }
    if (!l.awaiting_ready) continue;
    std::ifstream in(ReadyPath(id));
    if (!in) continue;
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded()) continue;  // Half written: the next pass reads it.
    ready_[id] = j;
    l.awaiting_ready = false;
    became_ready = true;
  }
  for (const std::string& id : gone) {
    procs_.erase(id);
    launches_.erase(id);
    ready_.erase(id);
    std::erase(order_, id);
    std::erase(worker_ids_, id);
  }
  return became_ready || !gone.empty();
}

// Waits on inotify for the run folder, so the wait wakes when the file is
// written, not on a timer; a dying child writes nothing, so each wait is
// bounded to notice it.
absl::StatusOr<nlohmann::json> LocalCluster::WaitReady(const std::string& id) {
  auto proc = procs_.find(id);
  if (proc == procs_.end()) return absl::NotFoundError(absl::StrCat("no process named ", id));
  const int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (fd < 0) return absl::InternalError("inotify_init1 failed");
  inotify_add_watch(fd, options_.run_dir.c_str(), IN_MOVED_TO | IN_CLOSE_WRITE);
  const absl::Time deadline = absl::Now() + options_.ready_timeout;
  absl::StatusOr<nlohmann::json> result = absl::DeadlineExceededError(
      absl::StrCat(id, " did not become ready within ", absl::FormatDuration(options_.ready_timeout), "; its log (",
                   proc->second->log_path(), "):\n", LogTail(id)));
  while (absl::Now() < deadline) {
    std::ifstream in(ReadyPath(id));
    if (in) {
      nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
      if (!j.is_discarded()) {
        ready_[id] = j;
        result = j;
        break;
      }
    }
    if (options_.should_stop && options_.should_stop()) {
      result = absl::CancelledError(absl::StrCat("stopped while waiting for ", id));
      break;
    }
    if (auto st = proc->second->TryWait()) {
      result = absl::UnavailableError(absl::StrCat(id, " ", DescribeExit(*st), " during start-up; its log (",
                                                   proc->second->log_path(), "):\n", LogTail(id)));
      break;
    }
    pollfd p{fd, POLLIN, 0};
    poll(&p, 1, 100);
    char buf[4096];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
  }
  close(fd);
  return result;
}

absl::Status LocalCluster::StartRouter(const std::string& model_dir, const std::vector<std::string>& args,
                                       const std::vector<std::string>& env, const std::string& listen) {
  if (!model_dir.empty()) options_.model_dir = model_dir;
  std::vector<std::string> argv = {options_.duet_binary, "router", "--model", options_.model_dir, "--listen", listen,
                                   "--control-listen", "127.0.0.1:0"};
  if (!options_.served_model_name.empty()) {
    argv.push_back("--served-model-name");
    argv.push_back(options_.served_model_name);
  }
  argv.insert(argv.end(), options_.router_args.begin(), options_.router_args.end());
  argv.insert(argv.end(), args.begin(), args.end());
  RETURN_IF_ERROR(Launch("router", argv, env, {}));
  ASSIGN_OR_RETURN(nlohmann::json r, WaitReady("router"));
  if (!r.contains("control") || !r.contains("http_port")) {
    return absl::InternalError(absl::StrCat("the router's ready file lacks control or http_port: ", r.dump()));
  }
  control_ = r["control"];
  http_port_ = r["http_port"];
  // A restarted router must come back where clients and workers look.
  std::vector<std::string>& again = launches_["router"].argv;
  for (size_t i = 0; i + 1 < again.size(); ++i) {
    if (again[i] == "--listen") {
      const std::string host = again[i + 1].substr(0, again[i + 1].rfind(':'));
      again[i + 1] = absl::StrCat(host, ":", http_port_);
    } else if (again[i] == "--control-listen") {
      again[i + 1] = control_;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> LocalCluster::LaunchWorker(WorkerSpec spec) {
  if (control_.empty()) return absl::FailedPreconditionError("start the router before its workers");
  if (spec.role != "prefill" && spec.role != "decode" && spec.role != "colocated") {
    return absl::InvalidArgumentError(absl::StrCat("a worker's role is prefill, decode or colocated, not ", spec.role));
  }
  if (spec.flex && spec.role == "colocated") return absl::InvalidArgumentError("a flex worker serves prefill or decode");
  const std::string kind = spec.flex ? "flex" : spec.role;
  const int n = role_counts_[kind]++;
  const std::string id = spec.id.empty() ? absl::StrCat(kind, "-", n) : spec.id;
  std::vector<std::string> argv = {options_.duet_binary, spec.role == "colocated" || spec.flex ? "worker" : spec.role};
  if (spec.role == "colocated") argv.push_back("--role=colocated");
  if (spec.flex) {
    argv.push_back("--role=flex");
    argv.push_back("--initial-role=" + spec.role);
  }
  for (const std::string& a : {std::string("--model"), options_.model_dir, std::string("--router"), control_,
                               std::string("--worker-id"), id, std::string("--threads"), std::to_string(spec.threads),
                               std::string("--metrics-port"), std::string("0")}) {
    argv.push_back(a);
  }
  if (!options_.served_model_name.empty()) {
    argv.push_back("--served-model-name");
    argv.push_back(options_.served_model_name);
  }
  argv.insert(argv.end(), options_.worker_args.begin(), options_.worker_args.end());
  argv.insert(argv.end(), spec.args.begin(), spec.args.end());
  argv.insert(argv.begin(), spec.wrap.begin(), spec.wrap.end());
  RETURN_IF_ERROR(Launch(id, argv, spec.env, spec.cpus));
  launches_[id].role = spec.role;
  launches_[id].flex = spec.flex;
  worker_ids_.push_back(id);
  return id;
}

absl::Status LocalCluster::SwitchRole(const std::string& id, const std::string& to) {
  auto it = launches_.find(id);
  if (it == launches_.end() || it->second.role.empty()) return absl::NotFoundError(absl::StrCat("no worker named ", id));
  LaunchSpec& l = it->second;
  if (!l.flex) return absl::FailedPreconditionError(absl::StrCat("worker ", id, " was not started as flex"));
  if (to != "prefill" && to != "decode") return absl::InvalidArgumentError("a flex worker switches to prefill or decode");
  ASSIGN_OR_RETURN(http::HttpResult r, Post("/workers/role", nlohmann::json{{"worker", id}, {"role", to}}.dump(),
                                           absl::Seconds(10)));
  if (r.status != 202) {
    return absl::FailedPreconditionError(absl::StrCat("switching ", id, " to ", to, ": HTTP ", r.status, " ", r.body));
  }
  l.role = to;
  for (std::string& a : l.argv) {
    if (absl::StartsWith(a, "--initial-role=")) a = "--initial-role=" + to;
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::StartWorker(WorkerSpec spec) {
  ASSIGN_OR_RETURN(std::string id, LaunchWorker(std::move(spec)));
  return WaitReady(id).status();
}

absl::Status LocalCluster::StartWorker(const std::string& role, const std::string& id,
                                       const std::vector<std::string>& args) {
  WorkerSpec spec;
  spec.role = role;
  spec.id = id;
  spec.args = args;
  return StartWorker(std::move(spec));
}

absl::Status LocalCluster::StartWorkers(std::vector<WorkerSpec> specs) {
  std::vector<std::string> ids;
  for (WorkerSpec& s : specs) {
    ASSIGN_OR_RETURN(std::string id, LaunchWorker(std::move(s)));
    ids.push_back(id);
  }
  for (const std::string& id : ids) RETURN_IF_ERROR(WaitReady(id).status());
  return WaitForWorkers(worker_ids_.size(), options_.ready_timeout);
}

absl::Status LocalCluster::WaitForWorkers(size_t n, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    auto s = Stats();
    if (s.ok() && s->contains("workers") && (*s)["workers"].size() == n) return absl::OkStatus();
    RETURN_IF_ERROR(CheckAlive());
    if (options_.should_stop && options_.should_stop()) return absl::CancelledError("stopped while waiting for workers");
    // Registration is a few round trips away; each /stats call is itself a
    // round trip to the router and bounds this loop's rate.
  }
  return absl::DeadlineExceededError(absl::StrCat("the router did not list ", n, " workers within ",
                                                  absl::FormatDuration(timeout), "; logs in ", options_.run_dir));
}

absl::Status LocalCluster::CheckAlive() {
  for (const std::string& id : order_) {
    if (launches_[id].retiring) continue;
    if (auto st = procs_[id]->TryWait()) {
      return absl::UnavailableError(absl::StrCat(id, " ", DescribeExit(*st), "; its log (", procs_[id]->log_path(),
                                                 "):\n", LogTail(id)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<http::HttpResult> LocalCluster::Post(const std::string& path, const std::string& body,
                                                    absl::Duration timeout) {
  return http::HttpCall("127.0.0.1", http_port_, "POST", path, body, timeout);
}

absl::StatusOr<http::HttpResult> LocalCluster::Get(const std::string& path) {
  return http::HttpCall("127.0.0.1", http_port_, "GET", path, "", absl::Seconds(30));
}

absl::StatusOr<nlohmann::json> LocalCluster::Stats() {
  ASSIGN_OR_RETURN(http::HttpResult r, Get("/stats"));
  if (r.status != 200) return absl::UnavailableError(absl::StrCat("/stats answered ", r.status));
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_discarded()) return absl::InternalError("/stats is not JSON");
  return j;
}

nlohmann::json LocalCluster::PrometheusTargets(const std::string& host) const {
  nlohmann::json targets = nlohmann::json::array();
  targets.push_back({{"targets", {absl::StrCat(host, ":", http_port_)}},
                     {"labels", {{"role", "router"}, {"worker", "router"}}}});
  for (const std::string& id : worker_ids_) {
    auto r = ready_.find(id);
    if (r == ready_.end() || !r->second.contains("metrics_port")) continue;
    targets.push_back({{"targets", {absl::StrCat("127.0.0.1:", r->second["metrics_port"].get<int>())}},
                       {"labels", {{"role", r->second.value("role", "")}, {"worker", id}}}});
  }
  return targets;
}

}  // namespace duet::cluster
