// Catch2 wrappers of tests/serving_util.h's waits and scrapes, for test
// bodies: each fails the test where the helper returns an error. Call them
// from the test's own thread only (Catch2's macros are not thread-safe).
#ifndef DUET_TESTS_CATCH_UTIL_H_
#define DUET_TESTS_CATCH_UTIL_H_

#include <catch2/catch.hpp>
#include <functional>
#include <string>

#include "tests/serving_util.h"

namespace duet::testing {

// PollStats on the router's API port, failing the test at its deadline.
inline nlohmann::json WaitStats(int port, const std::function<bool(const nlohmann::json&)>& pred,
                                absl::Duration timeout = absl::Seconds(30)) {
  auto s = PollStats(port, pred, timeout);
  if (!s.ok()) FAIL(s.status().message());
  return *s;
}

// ScrapeMetric on a process's metrics port, failing the test on an error.
inline double MetricValue(int metrics_port, const std::string& name, const std::string& label) {
  auto v = ScrapeMetric(metrics_port, name, label);
  if (!v.ok()) FAIL(v.status().message());
  return *v;
}

}  // namespace duet::testing

#endif  // DUET_TESTS_CATCH_UTIL_H_
