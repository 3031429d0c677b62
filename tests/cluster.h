// The one local-cluster launcher (cluster/local_cluster.h) with the tests'
// settings: one engine thread per worker (the default), heartbeats every
// 200 ms so a killed worker is noticed quickly, and the run folder under the
// test's $TMPDIR.
//
//   Cluster c;
//   REQUIRE(c.Start(model_dir, PrefillDecode({"--kv-blocks", "256"}, {"--kv-blocks", "256"})).ok());
//   auto r = c.Post("/v1/completions", body);
#ifndef DUET_TESTS_CLUSTER_H_
#define DUET_TESTS_CLUSTER_H_

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cluster/local_cluster.h"

namespace duet::testing {

// The name a cluster serves a model folder under: the folder's name.
inline std::string ModelName(const std::string& model_dir) {
  return std::filesystem::path(model_dir).filename().string();
}

class Cluster : public cluster::LocalCluster {
 public:
  struct Worker {
    std::string role;
    std::string id;
    std::vector<std::string> args;
  };

  Cluster() : LocalCluster(cluster::ClusterOptions{.worker_args = {"--heartbeat-ms", "200"}}) {}

  // Starts the router on `model_dir` (with `router_args`), then each worker
  // in turn, each listening before the next starts, then waits until the
  // router lists them all.
  absl::Status Start(const std::string& model_dir, const std::vector<Worker>& workers,
                     const std::vector<std::string>& router_args = {}) {
    if (absl::Status s = StartRouter(model_dir, router_args); !s.ok()) return s;
    for (const Worker& w : workers) {
      if (absl::Status s = StartWorker(w.role, w.id, w.args); !s.ok()) return s;
    }
    return WaitForWorkers(workers.size());
  }
};

// The disaggregated pair most tests start: prefill-0 and decode-0 with their
// own flags.
inline std::vector<Cluster::Worker> PrefillDecode(const std::vector<std::string>& prefill_args,
                                                  const std::vector<std::string>& decode_args) {
  return {{"prefill", "prefill-0", prefill_args}, {"decode", "decode-0", decode_args}};
}

}  // namespace duet::testing

#endif  // DUET_TESTS_CLUSTER_H_
