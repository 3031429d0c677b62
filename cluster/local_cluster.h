// A duet cluster on this machine: a router and its workers as child
// processes of the `duet` binary, each with its own log and ready file in one
// run folder. `duet up`, the multi-process tests and the serve benches all
// start their clusters here, so a flag a worker needs is added once.
//
//   LocalCluster c({.model_dir = dir});
//   RETURN_IF_ERROR(c.StartRouter());
//   RETURN_IF_ERROR(c.StartWorkers({{.role = "prefill"}, {.role = "decode"}}));
//   auto r = c.Post("/v1/completions", body);
//
// Ready files (--ready-file) say when each process listens, the router's
// /stats when it lists the workers; a process that exits while being waited
// for fails the wait with its exit status and the tail of its log. The
// destructor stops the workers, then the router (SIGINT, so no worker drains;
// SIGKILL after 5 s).
//
// Retire(id) removes a worker for good (duet up --autoscale's drains).
// Supervision (duet up's; tests that need a process to stay dead leave it
// off): the owner calls Supervise() often, and each call relaunches, with
// its own flags, every process that has exited, after a backoff that
// doubles per restart (kRestartBackoff up to kMaxRestartBackoff, reset once
// it has run kStableRun). The router comes back on the same HTTP and control
// ports, so the workers' reconnection loops find it; a worker re-registers
// under its id, and the router counts the restart.
// Not thread-safe: one owner drives it.
#ifndef DUET_CLUSTER_LOCAL_CLUSTER_H_
#define DUET_CLUSTER_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/subprocess.h"
#include "http/client.h"

namespace duet::cluster {

struct ClusterOptions {
  std::string model_dir;              // Hugging Face model folder, for every process.
  std::string served_model_name;      // Empty: the binaries' default (the folder's name).
  std::string duet_binary;            // Empty: tools/duet under the working directory.
  std::string run_dir;                // Logs and ready files. Empty: a new folder under
                                      // $TEST_TMPDIR (in a Bazel test) or $TMPDIR.
  std::vector<std::string> router_args;  // More flags for the router.
  std::vector<std::string> worker_args;  // More flags for every worker, before its own.
  absl::Duration ready_timeout = absl::Seconds(120);  // Per process, and for registration.
  // Polled while waiting: true ends the wait with Cancelled (duet up's Ctrl-C).
  std::function<bool()> should_stop;
};

struct WorkerSpec {
  std::string role;   // prefill | decode | colocated
  // A prefill or decode worker started as `duet worker --role flex` in
  // `role`: SwitchRole moves it to the other.
  bool flex = false;
  std::string id;     // Empty: "<role>-<n>" ("flex-<n>"), n counting those workers from 0.
  int threads = 1;    // --threads
  std::vector<int> cpus;          // Cores to pin it to; empty: not pinned.
  std::vector<std::string> args;  // Its own flags.
  std::vector<std::string> env;   // NAME=value, added to the environment.
  // Run under this command, e.g. {"ip", "netns", "exec", "NS"}: it must exec
  // duet in its own process, so signals reach the worker.
  std::vector<std::string> wrap;
};

class LocalCluster {
 public:
  explicit LocalCluster(ClusterOptions options = {});
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  // Starts the router (API on `listen`, control on a free loopback port) and
  // waits until it listens. `model_dir`, when given, replaces the options'.
  absl::Status StartRouter(const std::string& model_dir = "", const std::vector<std::string>& args = {},
                           const std::vector<std::string>& env = {}, const std::string& listen = "127.0.0.1:0");

  // Starts one worker without waiting; returns its id.
  absl::StatusOr<std::string> LaunchWorker(WorkerSpec spec);
  // Waits for a launched process's ready file; returns its contents.
  absl::StatusOr<nlohmann::json> WaitReady(const std::string& id);
  // Launches and waits until it listens.
  absl::Status StartWorker(WorkerSpec spec);
  absl::Status StartWorker(const std::string& role, const std::string& id, const std::vector<std::string>& args = {});
  // Launches all, waits for each, then until the router lists every worker.
  absl::Status StartWorkers(std::vector<WorkerSpec> specs);
  // Waits until the router's /stats lists exactly n workers.
  absl::Status WaitForWorkers(size_t n, absl::Duration timeout = absl::Seconds(60));

  // Unavailable naming the first process that has exited, with its log's tail.
  absl::Status CheckAlive();

  static constexpr absl::Duration kRestartBackoff = absl::Milliseconds(250);
  static constexpr absl::Duration kMaxRestartBackoff = absl::Seconds(8);
  static constexpr absl::Duration kStableRun = absl::Seconds(30);
  // One supervision pass; never blocks long. A process found exited is
  // reported (`log` gets a line naming it and its exit status) and
  // relaunched once its backoff has passed (a retired one is forgotten
  // instead); a launched or relaunched process's ready file is read when it
  // appears. Returns true when a process became ready or was forgotten in
  // this pass (the Prometheus targets changed).
  bool Supervise(const std::function<void(const std::string&)>& log);
  // Times each process was restarted by Supervise.
  int restarts(const std::string& id) const;
  // Removes a worker for good: SIGTERM, so it drains (takes nothing new; its
  // requests end or migrate; its leased KV is pulled) and exits. Supervise
  // does not restart it; once it has exited, Supervise forgets it (logging
  // how it ended) and it leaves worker_ids().
  absl::Status Retire(const std::string& id);
  bool retiring(const std::string& id) const;
  // A worker's role ("prefill", "decode", "colocated"): as launched, or as
  // last switched.
  const std::string& role(const std::string& id) const { return launches_.at(id).role; }
  bool flex(const std::string& id) const { return launches_.at(id).flex; }
  // Asks the router to switch a flex worker to `to` (prefill or decode):
  // it drains its role and registers again in `to`, in its own time. From
  // now on role() says `to`, and a restart starts it in `to`.
  absl::Status SwitchRole(const std::string& id, const std::string& to);
  // Stops every process: workers in reverse start order, then the router.
  void Stop();

  absl::StatusOr<http::HttpResult> Post(const std::string& path, const std::string& body,
                                        absl::Duration timeout = absl::Seconds(120));
  absl::StatusOr<http::HttpResult> Get(const std::string& path);
  absl::StatusOr<nlohmann::json> Stats();

  int http_port() const { return http_port_; }
  const std::string& control_address() const { return control_; }
  const std::string& model_dir() const { return options_.model_dir; }
  const std::string& run_dir() const { return options_.run_dir; }
  // Workers' ids in start order.
  const std::vector<std::string>& worker_ids() const { return worker_ids_; }
  // Every process's pid, the router first.
  std::vector<pid_t> pids() const;
  Subprocess& process(const std::string& id) { return *procs_.at(id); }
  // A ready process's ready file: the router's "http_port" and "control", a
  // worker's "control", "metrics_port" and "role".
  const nlohmann::json& ready(const std::string& id) const { return ready_.at(id); }
  std::string LogTail(const std::string& id, size_t max_bytes = 6000) const;
  // Prometheus file-based service discovery: the router on `host` and every
  // ready worker on loopback, labelled with role and worker id.
  nlohmann::json PrometheusTargets(const std::string& host) const;

 private:
  absl::Status Launch(const std::string& id, std::vector<std::string> args, const std::vector<std::string>& env,
                      const std::vector<int>& cpus);
  std::string ReadyPath(const std::string& id) const { return options_.run_dir + "/" + id + ".json"; }

  ClusterOptions options_;
  std::string control_;
  int http_port_ = 0;
  std::map<std::string, std::unique_ptr<Subprocess>> procs_;
  // How each process was started, for Supervise to start it again.
  struct LaunchSpec {
    std::vector<std::string> argv, env;
    std::vector<int> cpus;
    absl::Time started;
    int restarts = 0;
    absl::Duration backoff = kRestartBackoff;
    absl::Time restart_at;    // Exited; relaunch then.
    bool reported = false;    // Its exit is logged.
    bool awaiting_ready = false;
    bool retiring = false;    // Retire()d: not restarted, forgotten once it exits.
    std::string role;         // Workers only.
    bool flex = false;
  };
  std::map<std::string, LaunchSpec> launches_;
  std::vector<std::string> order_;  // Start order.
  std::vector<std::string> worker_ids_;
  std::map<std::string, int> role_counts_;
  std::map<std::string, nlohmann::json> ready_;
};

}  // namespace duet::cluster

#endif  // DUET_CLUSTER_LOCAL_CLUSTER_H_
