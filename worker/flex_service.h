// FlexService: the worker `duet worker --role flex` runs. It serves prefill
// or decode, one at a time, over weights it loads once; on the router's
// SwitchRole (POST /workers/role, the planner's switch) it drains the role
// it has (heartbeats say draining, so the router sends it nothing new; its
// requests end and its leases are pulled), stops that role's service (its
// KV pool and transport go), starts the other role's over the same weights
// and registers again in it. Past `drain_timeout` it switches anyway: the
// router then drops the old registration and migrates what was left on it.
//
//   FlexOptions o{.factory = make_role_service, .weights = loaded, .initial = proto::ROLE_PREFILL};
//   ASSIGN_OR_RETURN(auto svc, FlexService::Create(std::move(o), &runtime));
//   RETURN_IF_ERROR(runtime.Start(svc.get(), on_fatal));
//
// Threads: OnFrame, Stats and Registration may be called from any thread;
// a switch runs on its own thread. The runtime must outlive the service.
#ifndef DUET_WORKER_FLEX_SERVICE_H_
#define DUET_WORKER_FLEX_SERVICE_H_

#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/engine_core.h"
#include "worker/runtime.h"

namespace duet::worker {

// A role's service (prefill or decode) over the given weights.
using RoleServiceFactory = std::function<absl::StatusOr<std::unique_ptr<WorkerService>>(
    proto::Role role, std::shared_ptr<const LoadedModel> weights)>;

struct FlexOptions {
  RoleServiceFactory factory;
  std::shared_ptr<const LoadedModel> weights;
  proto::Role initial = proto::ROLE_PREFILL;
  // How long a switch waits for the role's requests and leases to end.
  absl::Duration drain_timeout = absl::Seconds(30);
  // Idle this long before the old role stops: a request the router sent
  // before it heard of the drain is on its way.
  absl::Duration settle = absl::Milliseconds(500);
  // A switch whose new role (and then the old one) cannot start: the worker
  // serves nothing and should exit.
  std::function<void(absl::Status)> on_fatal;
};

class FlexService : public WorkerService {
 public:
  static absl::StatusOr<std::unique_ptr<FlexService>> Create(FlexOptions options, WorkerRuntime* runtime);
  ~FlexService() override;  // waits for a switch under way
  FlexService(const FlexService&) = delete;
  FlexService& operator=(const FlexService&) = delete;

  RegistrationInfo Registration() override;
  void OnFrame(const rpc::ConnectionPtr& from, proto::Frame frame) override;
  void OnRouterLost() override;
  proto::WorkerStats Stats() override;

  proto::Role role() const;
  int switches() const;  // completed

 private:
  FlexService(FlexOptions options, WorkerRuntime* runtime) : o_(std::move(options)), runtime_(runtime) {}
  void Switch(proto::Role to);  // on switcher_

  const FlexOptions o_;
  WorkerRuntime* const runtime_;
  mutable absl::Mutex mu_;
  std::unique_ptr<WorkerService> inner_ ABSL_GUARDED_BY(mu_);  // null while a switch swaps it
  proto::Role role_ ABSL_GUARDED_BY(mu_) = proto::ROLE_UNSPECIFIED;
  bool switching_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int switches_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread switcher_;
};

}  // namespace duet::worker

#endif  // DUET_WORKER_FLEX_SERVICE_H_
