// `duet sim` against queueing theory: one instance, batches of one request,
// Poisson arrivals, a constant (M/D/1) or exponential (M/M/1) service time
// of 1 s, 1,000,000 requests at utilisations 0.3, 0.6 and 0.9. The theory's
// mean wait in queue must lie inside the simulator's 99% batch-means
// confidence interval: Pollaczek-Khinchine's rho / (2 (1 - rho)) for M/D/1,
// rho / (1 - rho) for M/M/1. The simulator is deterministic by seed. Two
// pipeline stages of constant service form a tandem queue whose wait is
// the first stage's M/D/1 wait.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/duet_run.h"

namespace {

nlohmann::json RunSim(const std::string& args) {
  const duet::testing::DuetRun r = duet::testing::RunDuet("sim --json " + args);
  INFO("duet sim --json " << args << "\n" << r.out);
  REQUIRE(r.exit_code == 0);
  nlohmann::json j = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')), nullptr, false);
  REQUIRE(j.is_object());
  return j;
}

TEST_CASE("M/D/1 and M/M/1: the theory's mean wait is inside the simulated 99% confidence interval") {
  for (const char* kind : {"constant", "exponential"}) {
    for (double rho : {0.3, 0.6, 0.9}) {
      const double theory = std::string(kind) == "constant" ? rho / (2 * (1 - rho)) : rho / (1 - rho);
      nlohmann::json j = RunSim(absl::StrCat("--latency ", kind, ":1,0 --prefill 1 --decode 0 --max-prefill-batch 1 ",
                                             "--lengths fixed:1,1 --requests 1000000 --rate ", rho, " --seed 7"));
      INFO(kind << " rho " << rho << ": theory " << theory << ", simulated " << j.dump());
      CHECK(j["requests"] == 1000000);
      const double lo = j["queue_wait_ci99"][0], hi = j["queue_wait_ci99"][1];
      CHECK(lo <= theory);
      CHECK(theory <= hi);
      // The interval is informative: within a fifth of the mean.
      CHECK(hi - lo < 0.2 * theory);
    }
  }
}

TEST_CASE("two pipeline stages are a tandem queue: the M/D/1 wait at the stage time, then both stages") {
  // constant:1 on 2 stages: each batch takes 1 s through both, and stage 1
  // takes the next after 0.5 s. Stage 2 never queues (the same constant
  // service), so the time in system is the M/D/1 wait at s = 0.5 s plus 1 s.
  const double s = 0.5;
  for (double rho : {0.3, 0.6, 0.9}) {
    const double wait = rho * s / (2 * (1 - rho));
    nlohmann::json j = RunSim(absl::StrCat("--latency constant:1,0 --prefill 1 --decode 0 --pp 2 --max-prefill-batch 1 ",
                                           "--lengths fixed:1,1 --requests 1000000 --rate ", rho / s, " --seed 7"));
    INFO("rho " << rho << ": theory wait " << wait << ", simulated " << j.dump());
    const double lo = j["queue_wait_ci99"][0], hi = j["queue_wait_ci99"][1];
    CHECK(lo <= wait);
    CHECK(wait <= hi);
    CHECK(hi - lo < 0.2 * wait);
    // The mean time in system (arrival to the end of stage 2) is the
    // tandem value, within the interval's width.
    CHECK(std::abs(j["ttft_mean"].get<double>() - (wait + 2 * s)) <= hi - lo);
  }
}

TEST_CASE("the simulator is deterministic by seed, and the seed matters") {
  const std::string args = "--latency exponential:1,0 --prefill 1 --decode 0 --max-prefill-batch 1 "
                           "--lengths fixed:1,1 --requests 20000 --rate 0.8 --seed ";
  nlohmann::json a = RunSim(args + "3"), b = RunSim(args + "3"), c = RunSim(args + "4");
  CHECK(a["queue_wait_mean"] == b["queue_wait_mean"]);
  CHECK(a["ttft_p99"] == b["ttft_p99"]);
  CHECK(a["queue_wait_mean"] != c["queue_wait_mean"]);
}

}  // namespace
