#include "autoscale/local_actuator.h"

#include <sys/wait.h>

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/subprocess.h"

namespace duet::autoscale {

LocalActuator::LocalActuator(cluster::LocalCluster& cluster, LocalActuatorOptions options)
    : c_(cluster), o_(std::move(options)) {
  if (!o_.log) o_.log = [](const std::string&) {};
}

std::vector<std::string> LocalActuator::Workers(const std::string& role) const {
  std::vector<std::string> out;
  for (const std::string& id : c_.worker_ids()) {
    if (c_.role(id) == role && !c_.retiring(id)) out.push_back(id);
  }
  return out;
}

absl::Status LocalActuator::Observe(placement::LoadFigures& f) {
  for (auto [role, pool] : {std::pair<const char*, placement::PoolFigures*>{"prefill", &f.prefill},
                            {"decode", &f.decode}}) {
    pool->starting = std::max(0, static_cast<int>(Workers(role).size()) - pool->ready);
  }
  return absl::OkStatus();
}

absl::Status LocalActuator::Apply(const placement::ScaleDecision& d, const placement::LoadFigures&) {
  // Switches first: they cost no start. One the router refuses (a worker
  // not registered yet, or draining) is left to the stops and starts below.
  for (auto [from, to, n] : {std::tuple<const char*, const char*, int>{"decode", "prefill", d.to_prefill},
                             {"prefill", "decode", d.to_decode}}) {
    std::vector<std::string> have = Workers(from);
    for (int k = 0; k < n; ++k) {
      auto flex = std::find_if(have.rbegin(), have.rend(), [&](const std::string& id) { return c_.flex(id); });
      if (flex == have.rend()) break;
      const std::string id = *flex;
      have.erase(std::next(flex).base());
      if (absl::Status s = c_.SwitchRole(id, to); !s.ok()) {
        o_.log(absl::StrCat("cannot switch ", id, " (", s.message(), "); a drain and a start instead"));
        continue;
      }
      o_.log(absl::StrCat("switching ", id, " (", from, " -> ", to, ")"));
    }
  }
  // Stops next: their cores come back as they drain.
  for (auto [role, want] : {std::pair<const char*, int>{"prefill", d.prefill}, {"decode", d.decode}}) {
    std::vector<std::string> have = Workers(role);
    // The newest first: the likeliest to be still starting, with the least work.
    while (static_cast<int>(have.size()) > want) {
      RETURN_IF_ERROR(c_.Retire(have.back()));
      o_.log(absl::StrCat("draining ", have.back(), " (", role, " ", have.size(), " -> ", want, ")"));
      have.pop_back();
    }
  }
  for (auto [role, want] : {std::pair<const char*, int>{"prefill", d.prefill}, {"decode", d.decode}}) {
    const int have = static_cast<int>(Workers(role).size());
    for (int k = have; k < want; ++k) {
      const int alive = static_cast<int>(c_.worker_ids().size());  // draining ones hold their core until they exit
      if (alive >= o_.max_workers) {
        o_.log(absl::StrCat("start of a ", role, " worker deferred: ", alive, " workers alive (--max-workers ",
                            o_.max_workers, ")"));
        break;
      }
      cluster::WorkerSpec w;
      w.role = role;
      w.flex = o_.flex;
      w.threads = o_.threads;
      w.args = o_.worker_args;
      ASSIGN_OR_RETURN(std::string id, c_.LaunchWorker(std::move(w)));
      o_.log(absl::StrCat("starting ", id, " (", role, " ", k, " -> ", want, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ProfileWorker(const std::string& duet_binary, const std::string& model_dir, const std::string& out,
                           const std::string& log_path) {
  ASSIGN_OR_RETURN(auto p, Subprocess::Start({duet_binary, "profile", "--model", model_dir, "--threads", "1",
                                              "--idle-gaps=", "--out", out},
                                             {}, log_path));
  const int st = p->Wait();
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    return absl::InternalError(absl::StrCat("duet profile ", DescribeExit(st), "; see ", log_path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LocalAutoscaler>> LocalAutoscaler::Start(cluster::LocalCluster& c,
                                                                         LocalAutoscalerOptions o) {
  std::unique_ptr<LocalAutoscaler> a(new LocalAutoscaler());
  if (!o.log) o.log = [](const std::string&) {};
  placement::PlannerOptions& po = o.planner;
  ASSIGN_OR_RETURN(a->model_, placement::LoadModelSpec(o.model_dir));
  ASSIGN_OR_RETURN(a->latency_, placement::LoadLatencyModel(o.latency_file, a->model_, 1));
  const http::Endpoint router{.host = "127.0.0.1", .port = c.http_port()};
  ASSIGN_OR_RETURN(po.prefill.kv_capacity_tokens, WorkerKvCapacity(router));
  po.decode = po.prefill;
  po.cluster.policy = o.policy;
  // One machine: the pools together within max_workers, each leaving the other its minimum.
  if (po.max_instances == 0 || po.max_instances > o.max_workers) po.max_instances = o.max_workers;
  po.max_prefill = std::min(po.max_prefill, o.max_workers - po.min_decode);
  po.max_decode = std::min(po.max_decode, o.max_workers - po.min_prefill);
  if (po.max_prefill < po.min_prefill || po.max_decode < po.min_decode) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.max_workers, " workers at most leave no room above the pools' minima"));
  }
  a->planner_ = std::make_unique<placement::Planner>(a->model_, *a->latency_, po);
  a->actuator_ = std::make_unique<LocalActuator>(
      c, LocalActuatorOptions{.max_workers = o.max_workers,
                             .threads = 1,
                             .flex = po.switch_roles,
                             .worker_args = o.worker_args,
                             .log = o.log});
  a->interval_ = o.interval;
  a->check_ = o.burst_check;
  const bool checks = o.burst_check > absl::ZeroDuration();
  a->live_ = std::make_unique<LivePlanner>(
      *a->planner_, *a->actuator_,
      LivePlannerOptions{.figures = RouterFigures(router, o.interval),
                         .recent = checks ? RouterFigures(router, o.burst_check) : nullptr,
                         .interval = o.interval,
                         .check = o.burst_check,
                         .log = o.log});
  a->next_ = absl::Now() + o.interval;
  a->next_check_ = checks ? absl::Now() + o.burst_check : absl::InfiniteFuture();
  return a;
}

bool LocalAutoscaler::Poll() {
  const absl::Time now = absl::Now();
  if (now >= next_) {
    next_ += interval_;
    if (next_check_ != absl::InfiniteFuture()) next_check_ = now + check_;
    (void)live_->Step();  // An error is logged and counted; the next interval tries again.
    return true;
  }
  if (now < next_check_) return false;
  next_check_ += check_;
  return live_->Check();
}

}  // namespace duet::autoscale
