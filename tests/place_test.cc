// `duet place` for OPT-13B on one node of 4 A100-80GB with DistServe's
// fitted latencies (vLLM's for the colocated configurations), the
// conversation trace's lengths, SLOs TTFT 0.25 s and TPOT 0.1 s at 90%:
// it prints both per-GPU goodputs and their ratio; `duet sim` of the emitted
// plan meets the target at the reported goodput and misses it at 1.1x; and
// an exhaustive search here, `duet sim --goodput` of every configuration of
// the cluster, finds nothing better (beyond the bisection's 2% tolerance).
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/subprocess.h"

namespace {

using nlohmann::json;

constexpr char kData[] = "placement/testdata/";

std::string Run(const std::string& args) {
  const std::string cmd = "tools/duet " + args + " 2>/dev/null";
  absl::StatusOr<duet::CommandResult> r = duet::RunCommand({"/bin/sh", "-c", cmd});
  REQUIRE(r.ok());
  INFO(cmd << "\n" << r->output);
  REQUIRE(r->status == 0);
  return r->output;
}

std::vector<json> JsonLines(const std::string& out) {
  std::vector<json> v;
  size_t start = 0;
  while (start < out.size()) {
    size_t end = out.find('\n', start);
    if (end == std::string::npos) end = out.size();
    json j = json::parse(out.substr(start, end - start), nullptr, false);
    if (j.is_object()) v.push_back(j);
    start = end + 1;
  }
  return v;
}

const std::string kWorkload = absl::StrCat("--model opt-13b --requests 2000 --lengths trace --trace ", kData,
                                           "splitwise_conv.csv --seed 1 --slo-ttft 0.25 --slo-tpot 0.1");
const std::string kDistServe = absl::StrCat(kData, "distserve-a100-80g.json");
const std::string kVllm = absl::StrCat(kData, "vllm-a100-80g.json");

std::string ClusterFile(const std::string& dir, int n, const std::vector<std::pair<std::string, std::vector<int>>>& pools) {
  json j;
  j["model"] = "opt-13b";
  j["kv_link_gbps"] = 600.0;
  for (const auto& [pool, spec] : pools) {  // spec: tp, pp, count
    json list = json::array();
    for (int i = 0; i < spec[2]; ++i) {
      // No max_batch_tokens: the instance takes the default budget, as duet place does.
      list.push_back({{"tp", spec[0]}, {"pp", spec[1]}, {"gpu", "a100-80g"}});
    }
    j[pool] = list;
  }
  const std::string path = absl::StrCat(dir, "/cluster-", n, ".json");
  std::ofstream(path) << j.dump();
  return path;
}

TEST_CASE("duet place on 4 GPUs: the plan holds at its goodput, not at 1.1x, and nothing beats it") {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::string plan_path = dir + "/plan.json";
  json r = JsonLines(Run(absl::StrCat("place ", kWorkload, " --latency ", kDistServe, " --colocated-latency ", kVllm,
                                      " --nodes 1 --gpus-per-node 4 --json --emit ", plan_path)))
               .at(0);
  INFO(r.dump());
  const double g = r["disaggregated"]["goodput"], g_gpu = r["disaggregated"]["goodput_per_gpu"];
  const double c_gpu = r["colocated"]["goodput_per_gpu"];
  REQUIRE(g > 0);
  REQUIRE(c_gpu > 0);
  CHECK(r["ratio"].get<double>() == Approx(g_gpu / c_gpu).epsilon(1e-9));
  CHECK(r["disaggregated"]["gpus"].get<int>() <= 4);

  // The emitted plan, simulated at the goodput and at 1.1x.
  std::vector<json> at = JsonLines(Run(absl::StrCat("sim ", kWorkload, " --latency ", kDistServe, " --cluster ",
                                                    plan_path, " --json --rates ", g, ",", 1.1 * g)));
  REQUIRE(at.size() == 2);
  CHECK(at[0]["attainment"].get<double>() >= 0.9);
  CHECK(at[1]["attainment"].get<double>() < 0.9);

  // Every disaggregated configuration of 4 GPUs, and every colocated one.
  std::vector<std::vector<int>> shapes;  // tp, pp
  for (int tp : {1, 2, 4}) {
    for (int pp = 1; tp * pp <= 4; ++pp) shapes.push_back({tp, pp});
  }
  int n = 0;
  // Best per GPU without pipeline stages, and with them (a PP plan leads
  // only if it beats every PP-free one by 5%).
  double best_disagg = 0, best_coloc = 0, best_disagg_pp = 0, best_coloc_pp = 0;
  for (const auto& p : shapes) {
    for (const auto& d : shapes) {
      for (int np = 1; np * p[0] * p[1] + d[0] * d[1] <= 4; ++np) {
        for (int nd = 1; np * p[0] * p[1] + nd * d[0] * d[1] <= 4; ++nd) {
          const std::string file =
              ClusterFile(dir, n++, {{"prefill", {p[0], p[1], np}}, {"decode", {d[0], d[1], nd}}});
          json s = JsonLines(Run(absl::StrCat("sim ", kWorkload, " --latency ", kDistServe, " --cluster ", file,
                                              " --goodput --json")))
                       .back();
          const int gpus = np * p[0] * p[1] + nd * d[0] * d[1];
          double& best = p[1] > 1 || d[1] > 1 ? best_disagg_pp : best_disagg;
          best = std::max(best, s["goodput_rate"].get<double>() / gpus);
        }
      }
    }
    for (int count = 1; count * p[0] * p[1] <= 4; ++count) {
      const std::string file = ClusterFile(dir, n++, {{"colocated", {p[0], p[1], count}}});
      json s = JsonLines(Run(absl::StrCat("sim ", kWorkload, " --latency ", kVllm, " --cluster ", file,
                                          " --goodput --json")))
                   .back();
      double& best = p[1] > 1 ? best_coloc_pp : best_coloc;
      best = std::max(best, s["goodput_rate"].get<double>() / (count * p[0] * p[1]));
    }
  }
  INFO("exhaustive: disaggregated " << best_disagg << " (with PP " << best_disagg_pp << ") per GPU, colocated "
                                    << best_coloc << " (with PP " << best_coloc_pp << ") per GPU over " << n
                                    << " configurations");
  CHECK(n > 20);
  CHECK(best_disagg <= g_gpu * 1.03);
  CHECK(best_coloc <= c_gpu * 1.03);
  CHECK(best_disagg_pp <= g_gpu * 1.05 * 1.03);
  CHECK(best_coloc_pp <= c_gpu * 1.05 * 1.03);
  // A plan with pipeline stages beats every PP-free configuration by 5%.
  const bool plan_pp = r["disaggregated"]["prefill_pp"].get<int>() > 1 || r["disaggregated"]["decode_pp"].get<int>() > 1;
  if (plan_pp) CHECK(g_gpu >= 1.05 * best_disagg / 1.03);
}

TEST_CASE("heterogeneous pools: the plan uses the pool that serves more per GPU") {
  // Pool 1: L4s; pool 2: H100s, both on the roofline model. Per GPU an H100
  // serves several times what an L4 does, so the best plan runs on pool 2.
  json r = JsonLines(Run("place --model llama-2-7b --gpu l4 --nodes 1 --gpus-per-node 4 --gpu2 h100-sxm --nodes2 1 "
                         "--gpus-per-node2 4 --lengths fixed:1024,128 --requests 1000 --slo-ttft 1 --slo-tpot 0.1 "
                         "--json"))
               .at(0);
  INFO(r.dump());
  const std::string plan = r["disaggregated"]["plan"];
  CHECK(plan.find("pool 2") != std::string::npos);
  CHECK(r["disaggregated"]["goodput_per_gpu"].get<double>() > 0);
}

TEST_CASE("DistServe's README example: the plan DistServe's own search picks, at its goodput within 15%") {
  // OPT-13B on one node of 4 A100-80G, TTFT 0.2 s / TPOT 0.1 s at 90%, the
  // first 300 conversation requests kept whole (DistServe's simulator has no
  // context limit; truncated here to OPT's 2048), DistServe's per-batch
  // costs. DistServe's search finds prefill TP 2 + decode TP 2 at 1.56 per
  // GPU, tied with a decode of TP 1 x PP 2.
  json r = JsonLines(Run(absl::StrCat("place --model opt-13b --latency ", kDistServe, " --colocated-latency ", kVllm,
                                      " --nodes 1 --gpus-per-node 4 --slo-ttft 0.2 --slo-tpot 0.1 --lengths trace "
                                      "--trace ",
                                      kData, "splitwise_conv.csv --requests 300 --overlong truncate ",
                                      "--batch-overhead-ms 2,0.0001 --json")))
               .at(0);
  INFO(r.dump());
  const json& d = r["disaggregated"];
  CHECK(d["goodput_per_gpu"].get<double>() >= 1.56 / 1.15);
  CHECK(d["goodput_per_gpu"].get<double>() <= 1.56 * 1.15);
  CHECK(d["prefill_tp"].get<int>() == 2);
  CHECK(d["prefill_pp"].get<int>() == 1);
  CHECK(d["decode_tp"].get<int>() * d["decode_pp"].get<int>() == 2);
  CHECK(d["gpus"].get<int>() == 4);
}

TEST_CASE("targets no plan can keep at any rate: a clear error") {
  // One 1024-token OPT-66B prompt takes longer than 50 ms on every shape.
  const std::string cmd = absl::StrCat("tools/duet place --model opt-66b --latency ", kDistServe,
                                       " --nodes 1 --gpus-per-node 8 --lengths fixed:1024,16 --requests 500 "
                                       "--slo-ttft 0.05 2>&1");
  absl::StatusOr<duet::CommandResult> out = duet::RunCommand({"/bin/sh", "-c", cmd});
  REQUIRE(out.ok());
  INFO(out->output);
  CHECK(WEXITSTATUS(out->status) != 0);
  CHECK(out->output.find("no plan keeps 90% of requests within TTFT 0.05 s") != std::string::npos);
}

}  // namespace
