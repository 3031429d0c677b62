// The local actuator (`duet up --autoscale`): each pool's workers are child
// processes of a LocalCluster. A start launches a worker (one engine thread,
// the flags every worker of the cluster gets); a stop retires the newest
// worker of the pool (SIGTERM: it drains, its requests end or migrate, and
// it exits; the supervisor does not restart it); a switch asks the router
// to move the newest flex worker of one pool to the other (it drains and
// registers again, its weights loaded), before any stop or start (one the
// router refuses becomes a stop and a start). Processes alive, draining
// ones included, never exceed `max_workers`: a start that would is left for
// a later interval.
#ifndef DUET_AUTOSCALE_LOCAL_ACTUATOR_H_
#define DUET_AUTOSCALE_LOCAL_ACTUATOR_H_

#include <functional>
#include <string>
#include <vector>

#include "autoscale/actuator.h"
#include "autoscale/live_planner.h"
#include "cluster/local_cluster.h"
#include "placement/latency.h"
#include "placement/model.h"
#include "placement/planner.h"

namespace duet::autoscale {

struct LocalActuatorOptions {
  int max_workers = 4;
  int threads = 1;                        // per worker
  // New workers start as flex ones (--role flex), and a decision's
  // switches (to_prefill, to_decode) move flex workers between the pools.
  bool flex = false;
  std::vector<std::string> worker_args;   // each new worker's own flags (--kv-memory, ...)
  std::function<void(const std::string&)> log;
};

class LocalActuator : public Actuator {
 public:
  // `cluster` must outlive the actuator; its owner keeps calling Supervise.
  LocalActuator(cluster::LocalCluster& cluster, LocalActuatorOptions options);
  std::string name() const override { return "local"; }
  // A pool's `starting`: its workers launched and not retiring, less those
  // the router lists.
  absl::Status Observe(placement::LoadFigures& f) override;
  absl::Status Apply(const placement::ScaleDecision& d, const placement::LoadFigures& f) override;

  // The pool's workers launched and not retiring, oldest first.
  std::vector<std::string> Workers(const std::string& role) const;

 private:
  cluster::LocalCluster& c_;
  LocalActuatorOptions o_;
};

// The planner's model of one local worker: `duet profile --threads 1` of
// this machine (the idle-spell timings skipped), its fit written to `out`,
// its output to `log_path`.
absl::Status ProfileWorker(const std::string& duet_binary, const std::string& model_dir, const std::string& out,
                           const std::string& log_path);

// The SLA planner over a LocalCluster's workers (duet up --autoscale, and
// the local autoscaling test and bench): its model of one worker from a
// `duet profile --threads 1` fit, each worker's KV capacity as the router
// reports it, the pools within `max_workers` together.
struct LocalAutoscalerOptions {
  // SLOs, bounds, cool-down (shapes and cluster are set here); with
  // switch_roles, the workers it starts are flex ones and it switches them.
  placement::PlannerOptions planner;
  std::string model_dir;              // of the workers
  std::string latency_file;           // a `duet profile --threads 1` fit
  std::string policy = "least_loaded";
  int max_workers = 3;
  std::vector<std::string> worker_args;  // each new worker's own flags
  absl::Duration interval = absl::Seconds(30);
  absl::Duration burst_check = absl::Seconds(5);  // zero: no burst checks between intervals
  std::function<void(const std::string&)> log;
};

class LocalAutoscaler {
 public:
  // Needs the cluster up (a decode worker registered); InvalidArgument when
  // max_workers leaves no room above the pools' minima.
  static absl::StatusOr<std::unique_ptr<LocalAutoscaler>> Start(cluster::LocalCluster& cluster,
                                                                 LocalAutoscalerOptions options);
  // Decides when an interval has passed since the last decision, and
  // checks for a burst when a burst check's span has; returns whether it
  // decided (a check only when it changed the pools). Never blocks otherwise.
  bool Poll();
  LivePlanner& live() { return *live_; }
  placement::Planner& planner() { return *planner_; }
  const placement::PlannerOptions& options() const { return planner_->options(); }
  const placement::LatencyModel& latency() const { return *latency_; }

 private:
  LocalAutoscaler() = default;
  placement::ModelSpec model_;
  std::unique_ptr<placement::LatencyModel> latency_;
  std::unique_ptr<placement::Planner> planner_;
  std::unique_ptr<LocalActuator> actuator_;
  std::unique_ptr<LivePlanner> live_;
  absl::Duration interval_, check_;
  absl::Time next_, next_check_;
};

}  // namespace duet::autoscale

#endif  // DUET_AUTOSCALE_LOCAL_ACTUATOR_H_
