// `duet place --precision auto` on a heterogeneous cluster (LLM-PQ's
// setting): Llama-2-70B on one node of 4 A100-80GB and one of 2 A100-40GB,
// roofline latencies, TTFT 1 s and TPOT 30 ms at 90%. The 40 GB pair cannot hold the model in BF16 (137 GB)
// nor in Q8 (78 GB against its 72 GB of usable memory), only in Q4 (43 GB).
// Within a bound that admits Q4 the plan uses that pool and its goodput
// per GPU beats every all-BF16 plan's; within one that does not, it
// keeps off it and stays within the bound. `duet sim` of the emitted plan
// (each instance's GPU and weight dtype) finds the same goodput.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/duet_run.h"

namespace duet {
namespace {

using nlohmann::json;

const std::string kCluster =
    "place --json --model llama-2-70b --gpu a100-80g --nodes 1 --gpus-per-node 4 --gpu2 a100-40g --nodes2 1 "
    "--gpus-per-node2 2 --max-pp 1 --requests 500 --seed 3 --slo-ttft 1 --slo-tpot 0.03";
const std::string kSensitivity = " --precision auto --precision-sensitivity bf16=0,q8=0.002,q4=0.02";

json Place(const std::string& extra) {
  testing::DuetRun r = testing::RunDuet(kCluster + extra);
  INFO(kCluster + extra << "\n" << r.out);
  REQUIRE(r.exit_code == 0);
  const size_t brace = r.out.rfind("\n{");
  return json::parse(r.out.substr(brace == std::string::npos ? 0 : brace + 1));
}

TEST_CASE("duet place --precision auto puts a quantized shard on the small GPUs, above the best all-BF16 plan",
          "[place][precision]") {
  const json bf16 = Place("");
  const std::string emitted = std::string(std::getenv("TEST_TMPDIR")) + "/q4_plan.json";
  const json q4 = Place(kSensitivity + " --max-sensitivity 0.03 --emit " + emitted);
  const json q8 = Place(kSensitivity + " --max-sensitivity 0.01");
  INFO("all bf16: " << bf16.dump() << "\nq4 allowed: " << q4.dump() << "\nq8 at most: " << q8.dump());
  // The model as given is BF16 and never reaches pool 2.
  CHECK(bf16["disaggregated"]["prefill_pool"] == 1);
  CHECK(bf16["disaggregated"]["decode_pool"] == 1);
  CHECK(bf16["disaggregated"]["prefill_dtype"] == "");

  const json& p = q4["disaggregated"];
  CHECK((p["prefill_pool"] == 2 || p["decode_pool"] == 2));
  CHECK(p["sensitivity"].get<double>() <= 0.03);
  // The instances on pool 2 hold Q4: nothing else fits there.
  if (p["prefill_pool"] == 2) CHECK(p["prefill_dtype"] == "q4");
  if (p["decode_pool"] == 2) CHECK(p["decode_dtype"] == "q4");
  // Above every all-BF16 plan, disaggregated or colocated.
  CHECK(p["goodput_per_gpu"].get<double>() > bf16["disaggregated"]["goodput_per_gpu"].get<double>());
  CHECK(p["goodput_per_gpu"].get<double>() > bf16["colocated"]["goodput_per_gpu"].get<double>());
  CHECK(p["goodput_per_gpu"].get<double>() > 0);

  // duet sim of the emitted plan (its instances' GPUs and weight dtypes)
  // finds the goodput duet place reported.
  testing::DuetRun sim = testing::RunDuet("sim --json --goodput --model llama-2-70b --gpu a100-80g --cluster " +
                                          emitted + " --requests 500 --seed 3 --slo-ttft 1 --slo-tpot 0.03");
  INFO(sim.out);
  REQUIRE(sim.exit_code == 0);
  const json g = json::parse(sim.out.substr(sim.out.rfind("\n{") + 1));
  CHECK(g["goodput_per_gpu"].get<double>() == Approx(p["goodput_per_gpu"].get<double>()).epsilon(0.03));

  const json& b = q8["disaggregated"];
  CHECK(b["prefill_pool"] == 1);
  CHECK(b["decode_pool"] == 1);
  CHECK(b["sensitivity"].get<double>() <= 0.01);
  CHECK(b["prefill_dtype"] != "q4");
  CHECK(b["decode_dtype"] != "q4");
}

TEST_CASE("duet place --precision: a bound nothing meets, a missing sensitivity, a fitted profile: clear errors",
          "[place][precision]") {
  testing::DuetRun none = testing::RunDuet(kCluster + kSensitivity + " --max-sensitivity -1");
  CHECK(none.exit_code == 1);
  CHECK_THAT(none.out, Catch::Contains("no precision is within the sensitivity bound"));
  testing::DuetRun missing = testing::RunDuet(kCluster + " --precision bf16,q4 --precision-sensitivity bf16=0");
  CHECK(missing.exit_code == 1);
  CHECK_THAT(missing.out, Catch::Contains("gives no value for q4"));
  testing::DuetRun fitted = testing::RunDuet(
      "place --model opt-13b --latency placement/testdata/distserve-a100-80g.json --requests 50" + kSensitivity);
  CHECK(fitted.exit_code == 1);
  CHECK_THAT(fitted.out, Catch::Contains("weights as it times the model as given; use a roofline"));
  testing::DuetRun stray = testing::RunDuet(kCluster + " --max-sensitivity 0.1");
  CHECK(stray.exit_code != 0);
  CHECK_THAT(stray.out, Catch::Contains("without --precision"));
}

}  // namespace
}  // namespace duet
