// The local actuator (`duet up --autoscale`): each pool's workers are child
// processes of a LocalCluster. A start launches a worker (one engine thread,
// the flags every worker of the cluster gets); a stop retires the newest
// worker of the pool (SIGTERM: it drains, its requests end or migrate, and
// it exits; the supervisor does not restart it). Processes alive, draining
// ones included, never exceed `max_workers`: a start that would is left for
// a later interval.
#ifndef DUET_AUTOSCALE_LOCAL_ACTUATOR_H_
#define DUET_AUTOSCALE_LOCAL_ACTUATOR_H_

#include <functional>
#include <string>
#include <vector>

#include "autoscale/actuator.h"
#include "cluster/local_cluster.h"

namespace duet::autoscale {

struct LocalActuatorOptions {
  int max_workers = 4;
  int threads = 1;                        // per worker
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

}  // namespace duet::autoscale

#endif  // DUET_AUTOSCALE_LOCAL_ACTUATOR_H_
