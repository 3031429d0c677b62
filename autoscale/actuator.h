// Actuators: what turns the planner's decisions (placement/autoscale.h) into
// running instances. One interface for every kind:
//   - DryRunActuator (--dry-run): changes nothing, says what it would do;
//   - KubernetesActuator: sets the prefill and decode Deployments' replicas
//     through their `scale` subresource on the API server, as the pod's
//     service account (the RBAC is in deploy/kubernetes/planner.yaml);
//     a pod removed gets SIGTERM and drains (nothing new, its requests end
//     or migrate) inside its grace period.
//
//   ASSIGN_OR_RETURN(auto k8s, KubernetesActuator::Create({}));
//   RETURN_IF_ERROR(k8s->Observe(figures));    // adds pods not yet registered
//   RETURN_IF_ERROR(k8s->Apply(planner.Decide(figures), figures));
#ifndef DUET_AUTOSCALE_ACTUATOR_H_
#define DUET_AUTOSCALE_ACTUATOR_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "http/client.h"
#include "placement/autoscale.h"

namespace duet::autoscale {

class Actuator {
 public:
  virtual ~Actuator() = default;
  virtual std::string name() const = 0;
  // Completes the router's figures with what only the actuator knows: the
  // instances asked for that have not registered yet (`starting`).
  virtual absl::Status Observe(placement::LoadFigures& f) = 0;
  // Brings each pool to the decision's size (`f` as Observe left it).
  virtual absl::Status Apply(const placement::ScaleDecision& d, const placement::LoadFigures& f) = 0;
};

// Says what it would do, through `log`, and does nothing.
class DryRunActuator : public Actuator {
 public:
  explicit DryRunActuator(std::function<void(const std::string&)> log) : log_(std::move(log)) {}
  std::string name() const override { return "dry-run"; }
  absl::Status Observe(placement::LoadFigures&) override { return absl::OkStatus(); }
  absl::Status Apply(const placement::ScaleDecision& d, const placement::LoadFigures& f) override;

 private:
  std::function<void(const std::string&)> log_;
};

struct KubernetesOptions {
  // The API server; empty: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
  // (what every pod's environment holds).
  std::string api;
  // The service account's token, CA and namespace files (a pod's mount).
  std::string service_account_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
  std::string namespace_name;  // empty: the service account's
  std::string prefill_deployment = "duet-prefill";
  std::string decode_deployment = "duet-decode";
  absl::Duration timeout = absl::Seconds(10);
};

class KubernetesActuator : public Actuator {
 public:
  // InvalidArgument for an API address it cannot parse, NotFound when the
  // token (or, without a namespace, the namespace file) is missing.
  static absl::StatusOr<std::unique_ptr<KubernetesActuator>> Create(KubernetesOptions o);
  std::string name() const override { return "kubernetes"; }
  // Reads both Deployments' scale: a pool's `starting` is its replicas not
  // yet registered with the router (replicas - ready, at least 0).
  absl::Status Observe(placement::LoadFigures& f) override;
  // Patches the replicas of each Deployment whose count differs from the
  // decision's (role switches are a scale-down of one and a scale-up of the
  // other: a pod keeps its role).
  absl::Status Apply(const placement::ScaleDecision& d, const placement::LoadFigures& f) override;

 private:
  KubernetesActuator(KubernetesOptions o, http::Endpoint api, std::string token_file)
      : o_(std::move(o)), api_(std::move(api)), token_file_(std::move(token_file)) {}
  std::string ScalePath(const std::string& deployment) const;
  absl::StatusOr<nlohmann::json> Call(const std::string& method, const std::string& deployment,
                                      const std::string& body);
  absl::StatusOr<int> Replicas(const std::string& deployment);

  KubernetesOptions o_;
  http::Endpoint api_;
  std::string token_file_;
  int prefill_replicas_ = -1, decode_replicas_ = -1;  // as last read
};

}  // namespace duet::autoscale

#endif  // DUET_AUTOSCALE_ACTUATOR_H_
