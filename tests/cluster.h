// A duet cluster of real processes for tests: a router and workers started
// from the `duet` binary, each in its own process with its own log, so tests
// can kill any of them.
//
//   Cluster c;
//   REQUIRE(c.StartRouter(model_dir).ok());
//   REQUIRE(c.StartWorker("prefill", "p0").ok());
//   REQUIRE(c.WaitForWorkers(2).ok());
//   auto r = c.Post("/v1/completions", body);
//
// Ready files (--ready-file) tell when each process listens; /stats tells
// when the router sees the workers. Nothing sleeps to synchronise.
#ifndef DUET_TESTS_CLUSTER_H_
#define DUET_TESTS_CLUSTER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "base/subprocess.h"
#include "http/client.h"

namespace duet::testing {

class Cluster {
 public:
  Cluster();
  ~Cluster();  // Terminates every process.

  absl::Status StartRouter(const std::string& model_dir, const std::vector<std::string>& extra = {});
  // role: prefill | decode | colocated.
  absl::Status StartWorker(const std::string& role, const std::string& id,
                           const std::vector<std::string>& extra = {});
  // Waits until the router's /stats lists exactly n workers.
  absl::Status WaitForWorkers(size_t n, absl::Duration timeout = absl::Seconds(60));

  absl::StatusOr<http::HttpResult> Post(const std::string& path, const std::string& body,
                                        absl::Duration timeout = absl::Seconds(120));
  absl::StatusOr<http::HttpResult> Get(const std::string& path);
  absl::StatusOr<nlohmann::json> Stats();

  int http_port() const { return http_port_; }
  const std::string& control_address() const { return control_; }
  Subprocess& process(const std::string& id) { return *procs_.at(id); }
  // The worker's control address and metrics port from its ready file.
  const nlohmann::json& ready(const std::string& id) const { return ready_.at(id); }
  std::string LogTail(const std::string& id) const;
  const std::string& model_dir() const { return model_dir_; }

 private:
  absl::StatusOr<nlohmann::json> WaitReady(const std::string& id, absl::Duration timeout);

  std::string run_dir_;
  std::string model_dir_;
  std::string control_;
  int http_port_ = 0;
  std::map<std::string, std::unique_ptr<Subprocess>> procs_;
  std::vector<std::string> order_;
  std::map<std::string, nlohmann::json> ready_;
};

}  // namespace duet::testing

#endif  // DUET_TESTS_CLUSTER_H_
