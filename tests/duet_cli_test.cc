// The `duet` binary as a user runs it: generate on the embedded tiny model
// (made on first use in the cache folder), make-model, and their errors.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/subprocess.h"
#include "tests/duet_run.h"
#include "engine/block_pool.h"
#include "engine/generator.h"
#include "engine/model.h"
#include "kernels/cpu/cpu_backend.h"

namespace duet {
namespace {

using Catch::Matchers::Contains;

using Run = testing::DuetRun;

// Runs the duet binary with a private cache folder.
Run Duet(const std::string& args) {
  const std::string tmp = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  return testing::RunDuet(args, "XDG_CACHE_HOME=" + tmp + "/cache");
}

TEST_CASE("duet generate --json on the embedded model equals the engine's Generate", "[cli]") {
  Run r = Duet("generate --prompt-ids 5,6,7,8 --max-tokens 6 --temperature 0 --ignore-eos --logprobs 3 --json");
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["ids"].size() == 6);
  REQUIRE(j["top_logprobs"].size() == 6);
  REQUIRE(j["top_logprobs"][0].size() == 3);
  REQUIRE(j["text"].is_string());
  // Greedy: the chosen id is the best alternative at every position.
  for (size_t i = 0; i < 6; ++i) REQUIRE(j["top_logprobs"][i][0][0] == j["ids"][i]);

  // The same model through the library gives the same ids.
  std::string tmp = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  std::string dir;
  for (const auto& e : std::filesystem::directory_iterator(tmp + "/cache/duet/models")) dir = e.path();
  auto backend = kernels::NewCpuBackend(1);
  auto model = engine::Model::Load(dir, backend.get());
  REQUIRE(model.ok());
  engine::BlockPool pool((*model)->KvLayoutFor(16), 8);
  engine::GenerateOptions opt;
  opt.max_tokens = 6;
  opt.ignore_eos = true;
  opt.sampling.temperature = 0;
  auto g = engine::Generate(**model, pool, std::vector<int32_t>{5, 6, 7, 8}, opt);
  REQUIRE(g.ok());
  REQUIRE(j["ids"].get<std::vector<int32_t>>() == g->ids);
}

TEST_CASE("duet generate with a seed repeats itself", "[cli]") {
  Run a = Duet("generate --prompt-ids 1,2,3 --max-tokens 8 --seed 11 --ignore-eos");
  Run b = Duet("generate --prompt-ids 1,2,3 --max-tokens 8 --seed 11 --ignore-eos");
  REQUIRE(a.exit_code == 0);
  REQUIRE(a.out == b.out);
}

TEST_CASE("duet reports bad flags and inputs clearly", "[cli]") {
  const struct {
    const char* args;
    int exit_code;
    std::vector<std::string> says;
  } cases[] = {
      {"generate --prompt-ids 1,x,3", 1, {"\"x\" is not a token id"}},
      {"generate --bogus 1", 2, {"unknown flag --bogus"}},
      {"generate --prompt-ids 1 --top-p 2", 1, {"top_p"}},
      {"generate --prompt-ids 1 --model /nonexistent", 1, {"/nonexistent"}},
      {"frobnicate", 2, {"unknown command"}},
      {"generate --prompt-ids 1 --activation-dtype bf16", 1, {"the CPU backend computes in f32"}},
      {"generate --prompt-ids 1 --activation-dtype fp8", 1, {"\"fp8\" is not auto, f32 or bf16"}},
      {"generate --prompt-ids 1 --cuda-graph-max-batch 8", 1, {"the CPU backend has no graphs"}},
      {"generate --prompt-ids 1 --device tpu", 1, {"\"tpu\" is not cpu, cuda or cuda-emulated"}},
      {"generate --help", 0, {"--prompt-ids", "--logprobs"}},
  };
  for (const auto& c : cases) {
    INFO("duet " << c.args);
    testing::RequireResult(Duet(c.args), c.exit_code, c.says);
  }
}

// Runs duet with `input` on stdin.
Run DuetWithInput(const std::string& args, const std::string& input) {
  std::string tmp = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  std::string in_path = tmp + "/stdin.txt";
  FILE* f = std::fopen(in_path.c_str(), "wb");
  std::fwrite(input.data(), 1, input.size(), f);
  std::fclose(f);
  return Duet(args + " < " + in_path);
}

TEST_CASE("duet tokenize encodes lines and decodes them back", "[cli]") {
  const std::string text = "Prefill runs the prompt.\nDecode emits one token per step: caf\xc3\xa9 \xe2\x9c\x93\n";
  Run enc = DuetWithInput("tokenize", text);
  REQUIRE(enc.exit_code == 0);
  // Two lines in, two JSON arrays out, no BOS added.
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl; (nl = enc.out.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines.push_back(enc.out.substr(start, nl - start));
  }
  REQUIRE(lines.size() == 2);
  auto first = nlohmann::json::parse(lines[0]);
  REQUIRE(first.size() > 3);
  REQUIRE(first.size() < 24);  // BPE merged something.
  for (auto& id : first) REQUIRE(id.get<int>() < 1019);  // No special tokens.
  Run dec = DuetWithInput("tokenize --decode", enc.out);
  REQUIRE(dec.exit_code == 0);
  REQUIRE(dec.out == text);
}

TEST_CASE("duet tokenize refuses invalid UTF-8 and names the line", "[cli]") {
  testing::RequireResult(DuetWithInput("tokenize", "fine\nbad \xff byte\n"), 1, {"stdin line 2", "UTF-8"});
}

TEST_CASE("duet generate --prompt and --chat produce text", "[cli]") {
  Run p = Duet("generate --prompt 'The decode pool' --max-tokens 5 --temperature 0 --ignore-eos --json");
  REQUIRE(p.exit_code == 0);
  auto jp = nlohmann::json::parse(p.out);
  REQUIRE(jp["ids"].size() == 5);
  REQUIRE(jp["text"].get<std::string>().size() > 0);
  Run c = Duet("generate --chat '[{\"role\": \"system\", \"content\": \"Be brief.\"}, "
               "{\"role\": \"user\", \"content\": \"What is KV cache?\"}]' --max-tokens 4 "
               "--temperature 0 --ignore-eos --json");
  REQUIRE(c.exit_code == 0);
  auto jc = nlohmann::json::parse(c.out);
  REQUIRE(jc["ids"].size() == 4);
  testing::RequireResult(Duet("generate --chat '[{\"role\": \"robot\", \"content\": \"x\"}]'"), 1, {"role"});
  testing::RequireResult(Duet("generate --prompt x --prompt-ids 1"), 1, {"exactly one"});
}

TEST_CASE("duet make-model writes a loadable model directory", "[cli]") {
  std::string tmp = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  std::string out = tmp + "/made-qwen2";
  Run r = Duet("make-model --size tiny --arch qwen2 --seed 3 --out " + out);
  REQUIRE(r.exit_code == 0);
  auto backend = kernels::NewCpuBackend(1);
  auto model = engine::Model::Load(out, backend.get());
  REQUIRE(model.ok());
  REQUIRE((*model)->config().model_type == "qwen2");
  REQUIRE((*model)->config().tie_word_embeddings);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "config.json"}) {
    REQUIRE(std::filesystem::exists(out + "/" + f));
  }
  testing::RequireResult(Duet("make-model --size huge --out " + out), 1, {"--size"});
}

TEST_CASE("duet profile fits the engine's latency; duet sim runs on its file", "[cli]") {
  std::string tmp = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  const std::string out = tmp + "/profile.json";
  Run r = Duet("profile --max-context 128 --max-batch 2 --reps 3 --idle-gaps 0.1,0.3 --out " + out);
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  std::ifstream in(out);
  nlohmann::json j = nlohmann::json::parse(in);
  REQUIRE(j.size() == 1);
  const nlohmann::json& e = j.begin().value()["1"];
  REQUIRE(e["prefill"].size() == 3);
  REQUIRE(e["decoding_smallbs"].size() == 3);
  // The fits reproduce positive times at shapes they were measured on (a
  // singular or empty fit would give zeros).
  const double a = e["prefill"][0], b = e["prefill"][1], c = e["prefill"][2];
  CHECK(a + b * 64 + c * 64 * 64 > 0);
  const double da = e["decoding_smallbs"][0], db = e["decoding_smallbs"][1], dc = e["decoding_smallbs"][2];
  CHECK(da + db * 16 + dc * 1 > 0);
  // duet's per-batch decode table: one [batch, a, b] row per batch size
  // profiled (1 and 2 here), each positive at a context it was timed at.
  const nlohmann::json& table = e["decoding_by_batch"];
  REQUIRE(table.size() == 2);
  CHECK(table[0][0] == 1);
  CHECK(table[1][0] == 2);
  for (const nlohmann::json& row : table) CHECK(row[1].get<double>() + row[2].get<double>() * 2 * 16 > 0);
  // The idle penalty: one [seconds, extra ms] point per gap asked for.
  const nlohmann::json& idle = j.begin().value()["idle_penalty_ms"];
  REQUIRE(idle.size() == 2);
  CHECK(idle[0][0] == 0.1);
  CHECK(idle[1][0] == 0.3);
  CHECK(idle[1][1].get<double>() >= 0);
  CHECK(Duet("profile --max-context 128 --max-batch 2 --idle-gaps 2,1 --out " + out + ".bad").exit_code != 0);
  Run no_reps = Duet("profile --reps 0 --out " + out + ".bad");
  CHECK(no_reps.exit_code != 0);
  CHECK_THAT(no_reps.out, Contains("--reps must be at least 1"));
  // Too small a grid is refused, naming the flags.
  Run tiny = Duet("profile --max-context 20 --max-batch 1 --reps 1 --out " + out + ".small");
  CHECK(tiny.exit_code != 0);
  CHECK_THAT(tiny.out, Contains("--max-context"));
  std::string dir;
  for (const auto& m : std::filesystem::directory_iterator(tmp + "/cache/duet/models")) {
    if (m.path().filename().string().find("tiny") != std::string::npos) dir = m.path();
  }
  REQUIRE(!dir.empty());
  Run sim = Duet("sim --json --model " + dir + " --latency " + out +
                 " --prefill 1 --decode 1 --lengths fixed:32,8 --requests 200 --rate 2");
  INFO(sim.out);
  REQUIRE(sim.exit_code == 0);
  nlohmann::json s = nlohmann::json::parse(sim.out.substr(sim.out.find('{')));
  CHECK(s["requests"] == 200);
  CHECK(s["ttft_p50"].get<double>() > 0);
}

}  // namespace
}  // namespace duet
