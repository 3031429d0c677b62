// The one local-cluster launcher (cluster/local_cluster.h) with the tests'
// settings: one engine thread per worker (the default), heartbeats every
// 200 ms so a killed worker is noticed quickly, and the run folder under the
// test's $TMPDIR.
//
//   Cluster c;
//   REQUIRE(c.StartRouter(model_dir).ok());
//   REQUIRE(c.StartWorker("prefill", "p0").ok());
//   REQUIRE(c.WaitForWorkers(2).ok());
//   auto r = c.Post("/v1/completions", body);
#ifndef DUET_TESTS_CLUSTER_H_
#define DUET_TESTS_CLUSTER_H_

#include "cluster/local_cluster.h"

namespace duet::testing {

class Cluster : public cluster::LocalCluster {
 public:
  Cluster() : LocalCluster(cluster::ClusterOptions{.worker_args = {"--heartbeat-ms", "200"}}) {}
};

}  // namespace duet::testing

#endif  // DUET_TESTS_CLUSTER_H_
