// `duet sim` and `duet place` flags as a user meets them: the per-request
// CSV keeps full precision, one default prefill budget (the workers' 2048)
// everywhere, --max-batch-tokens reaching cluster-file instances that set
// none, and a flag the chosen mode ignores refused by name.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/subprocess.h"
#include "tests/duet_run.h"

namespace duet {
namespace {

using Catch::Matchers::Contains;

using Run = testing::DuetRun;
Run Duet(const std::string& args) { return testing::RunDuet(args); }

nlohmann::json SimJson(const std::string& args) {
  Run r = Duet("sim --json " + args);
  INFO(args << "\n" << r.out);
  REQUIRE(r.exit_code == 0);
  const size_t begin = r.out.find('{');
  REQUIRE(begin != std::string::npos);
  nlohmann::json j = nlohmann::json::parse(r.out.substr(begin, r.out.find('\n', begin) - begin), nullptr, false);
  REQUIRE(j.is_object());
  return j;
}

std::string Tmp(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp", "/", name);
}

TEST_CASE("duet sim --csv writes times at full precision", "[sim]") {
  // 2,000 requests at 1/s: arrivals run past t = 1,000 s, where six
  // significant digits would leave whole milliseconds.
  const std::string csv = Tmp("sim.csv");
  Run r = Duet("sim --latency constant:0.0123,0 --prefill 1 --decode 0 --lengths fixed:1,1 --requests 2000 "
               "--rate 1 --seed 3 --csv " + csv);
  REQUIRE(r.exit_code == 0);
  std::ifstream in(csv);
  std::string line;
  std::getline(in, line);
  REQUIRE(line == "cluster,rate,arrival,prefill_start,first_token,finish,output");
  int late = 0;
  while (std::getline(in, line)) {
    // The quoted cluster name may hold commas: the numbers are the last five fields.
    std::vector<std::string> f = absl::StrSplit(line, ',');
    REQUIRE(f.size() >= 7);
    const size_t n = f.size();
    double arrival = 0, start = 0, first = 0;
    REQUIRE(absl::SimpleAtod(f[n - 5], &arrival));
    REQUIRE(absl::SimpleAtod(f[n - 4], &start));
    REQUIRE(absl::SimpleAtod(f[n - 3], &first));
    if (arrival < 1000) continue;
    ++late;
    INFO(line);
    CHECK(std::abs((first - start) - 0.0123) < 1e-9);  // the batch's constant time, exactly
  }
  CHECK(late > 500);
}

TEST_CASE("one prefill budget: 2048 by default, and --max-batch-tokens reaches cluster-file instances", "[sim]") {
  // Prompts of 600 tokens under load: a budget of 2048 batches 3 of them,
  // 4096 batches 6, so the two budgets give different latencies.
  const std::string work = "--latency placement/testdata/distserve-a100-80g.json --lengths fixed:600,20 "
                           "--requests 3000 --rate 12 --seed 5";
  const nlohmann::json by_default = SimJson(work + " --prefill 1 --decode 1");
  const nlohmann::json at_2048 = SimJson(work + " --prefill 1 --decode 1 --max-batch-tokens 2048");
  const nlohmann::json at_4096 = SimJson(work + " --prefill 1 --decode 1 --max-batch-tokens 4096");
  CHECK(by_default["ttft_mean"] == at_2048["ttft_mean"]);
  CHECK(by_default["ttft_mean"] != at_4096["ttft_mean"]);

  // A cluster file whose instances set no budget: the flag's, else 2048.
  const std::string cluster = Tmp("cluster.json");
  std::ofstream(cluster) << R"({"model": "opt-13b", "kv_link_gbps": 600,
                               "prefill": [{"gpu": "a100-80g"}], "decode": [{"gpu": "a100-80g"}]})";
  const nlohmann::json file_default = SimJson(work + " --cluster " + cluster + " --link-gbps 600");
  const nlohmann::json file_4096 = SimJson(work + " --cluster " + cluster + " --link-gbps 600 --max-batch-tokens 4096");
  const nlohmann::json flags_600 = SimJson(work + " --prefill 1 --decode 1 --link-gbps 600");
  const nlohmann::json flags_4096 = SimJson(work + " --prefill 1 --decode 1 --link-gbps 600 --max-batch-tokens 4096");
  CHECK(file_default["ttft_mean"] == flags_600["ttft_mean"]);
  CHECK(file_4096["ttft_mean"] == flags_4096["ttft_mean"]);
  CHECK(file_4096["ttft_mean"] != file_default["ttft_mean"]);

  // duet place and the workers say the same default.
  CHECK_THAT(Duet("place --help").out, Contains("prefill token budget per batch (default 2048)"));
  CHECK_THAT(Duet("prefill --help").out, Contains("--max-batch-tokens N"));
  CHECK_THAT(Duet("prefill --help").out, Contains("(default 2048)"));
}

TEST_CASE("a flag the chosen mode ignores is an error naming it", "[sim]") {
  const std::string cluster = Tmp("cluster2.json");
  std::ofstream(cluster) << R"({"model": "opt-13b", "prefill": [{"gpu": "a100-80g"}], "decode": [{"gpu": "a100-80g"}]})";
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"sim --cluster " + cluster + " --tp 2", "--tp has no effect with --cluster"},
      {"sim --colocated 2 --link-gbps 100", "--link-gbps has no effect with --colocated"},
      {"sim --prefill 1 --decode 1 --chunk-tokens 256", "--chunk-tokens has no effect without colocated instances"},
      {"sim --colocated 1 --chunk-tokens 256", "--chunk-tokens has no effect without --chunked-prefill"},
      {"sim --target 0.8", "--target has no effect without --goodput or --svg"},
      {"sim --rates 1,2 --rate 3", "--rate has no effect with --rates"},
      {"sim --arrivals trace --trace placement/testdata/splitwise_conv.csv --rate 2", "--rate has no effect with --arrivals trace"},
      {"sim --cv 2", "--cv has no effect unless --arrivals gamma"},
      {"place --nodes2 2", "--nodes2 has no effect without --gpu2"},
      {"place --rate 3", "--rate has no effect in duet place"},
      {"place --exhaustive --verify 3", "--verify has no effect with --exhaustive"},
      {"sim --rag-documents 50", "--rag-documents has no effect unless --lengths rag"},
      {"sim --lengths rag --length-scale 2", "--length-scale has no effect with --lengths rag"},
      {"sim --cache-host-blocks 10", "--cache-host-blocks has no effect without --cache-blocks"},
      {"sim --lengths rag --cache-blocks 10 --host-link-gbps 5", "--host-link-gbps has no effect without --cache-host-blocks"},
      {"sim --colocated 1 --cache-blocks 10", "--cache-blocks has no effect with --colocated"},
      {"sim --policy cache_aware", "--policy cache_aware needs --cache-blocks"},
      {"sim --cache-aware-weights 1,2", "--cache-aware-weights has no effect unless --policy cache_aware"},
      {"sim --lengths rag --cache-blocks 10 --policy cache_aware --cache-aware-weights 1", "--cache-aware-weights must be U,Q"},
      {"sim --burst-check 10", "--burst-check has no effect without --autoscale"},
      {"sim --autoscale --autoscaler queue --burst-check 10", "--burst-check has no effect with --autoscaler queue"},
      {"up --burst-check 10", "--burst-check has no effect without --autoscale"},
      {"sim --policy fastest", "--policy must be least_loaded, round_robin or cache_aware, got \"fastest\""},
      // The workers' prefix-cache flags, where the cache is not.
      {"decode --kv-host-memory 1", "--kv-host-memory has no effect on a decode worker"},
      {"prefill --no-prefix-cache --kv-host-blocks 8", "--kv-host-blocks has no effect with --no-prefix-cache"},
      {"worker --reorder-window 2", "--reorder-window has no effect outside the prefill and flex roles"},
      {"decode --reorder-window 2", "--reorder-window has no effect outside the prefill and flex roles"},
      {"worker --role prefill --initial-role decode", "--initial-role has no effect outside the flex role"},
      {"worker --role flex --initial-role colocated", "--initial-role must be prefill or decode, got \"colocated\""},
      {"prefill --no-prefix-cache --kv-cache-policy lru", "--kv-cache-policy has no effect with --no-prefix-cache"},
      {"prefill --kv-cache-cost-profile " + Tmp("missing.json"), "the prefix cache's cost profile"},
  };
  for (const Case& c : cases) {
    INFO(c.args);
    Run r = Duet(c.args);
    CHECK(r.exit_code != 0);
    CHECK_THAT(r.out, Contains(c.message));
  }
  // The same flags where they apply run.
  CHECK(Duet("sim --prefill 1 --decode 1 --requests 100 --goodput --target 0.8").exit_code == 0);
}

TEST_CASE("duet sim with a prefix cache on a RAG workload: a bigger cache reuses more, host tier included", "[sim]") {
  auto hit = [](const std::string& cache) {
    const nlohmann::json j = SimJson("--lengths rag --requests 1000 --rag-documents 200 " + cache);
    INFO(j.dump());
    return j.value("cache_doc_hit_rate", -1.0);
  };
  const double small = hit("--cache-blocks 100"), large = hit("--cache-blocks 400"),
               tiers = hit("--cache-blocks 100 --cache-host-blocks 300");
  CHECK(small > 0);
  CHECK(large > small);
  CHECK(tiers > small);
  CHECK(hit("--cache-blocks 100 --cache-policy lru") >= 0);
  // No cache, no figure.
  CHECK(SimJson("--lengths rag --requests 100").count("cache_doc_hit_rate") == 0);
}

}  // namespace
}  // namespace duet
