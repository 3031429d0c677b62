#include "autoscale/local_actuator.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

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
  // Stops first: their cores come back as they drain.
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
      w.threads = o_.threads;
      w.args = o_.worker_args;
      ASSIGN_OR_RETURN(std::string id, c_.LaunchWorker(std::move(w)));
      o_.log(absl::StrCat("starting ", id, " (", role, " ", k, " -> ", want, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace duet::autoscale
