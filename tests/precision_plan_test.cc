// `duet precision-plan` as a user runs it, on the tiny llama with outlier
// channels the test puts into one layer (layer 3, naturally the least
// sensitive): every 16th input channel of each of its linear weights is 64
// times larger and what feeds that channel 64 times smaller (the RMSNorm
// weight, the v_proj and up_proj rows), so the model computes the same
// function (powers of two: exact in BF16) while each block of 32 weights
// shares its scale with two large weights, which is what quantizing real
// models' outlier channels meets. The plan must keep that layer at the
// highest precision it uses, and its map's logit error, measured here on
// the same calibration tokens, must be lower than that of every map with the
// same number of layers per dtype that puts the outlier layer lower.
#include <sys/wait.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "base/subprocess.h"
#include "tests/duet_run.h"
#include "text/bpe_trainer.h"
#include "engine/model.h"
#include "engine/precision_map.h"
#include "engine/precision_plan.h"
#include "engine/safetensors.h"
#include "engine/testing/tiny_model.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/dtype.h"

namespace duet {
namespace {

namespace fs = std::filesystem;

constexpr int kOutlierLayer = 3;
constexpr float kScale = 64;
bool Outlier(int64_t channel) { return channel % 16 == 7; }

// The tiny llama with layer 3's outlier channels (above).
std::string OutlierModel() {
  const std::string dir = testing::FreshDir("outlier");
  const std::string src = testing::TinyModelDir("llama");
  for (const auto& e : fs::directory_iterator(src)) {
    if (e.path().filename() != "model.safetensors") fs::copy_file(e.path(), fs::path(dir) / e.path().filename());
  }
  auto st = engine::SafetensorsModel::Open(src);
  REQUIRE(st.ok());
  std::map<std::string, std::vector<float>> w;
  for (const std::string& name : (*st)->Names()) w[name] = engine::ToFloat32(*(*st)->Find(name));
  const std::string p = "model.layers." + std::to_string(kOutlierLayer) + ".";
  auto scale_columns = [&](const std::string& name, float by) {
    const int64_t cols = (*st)->Find(name)->shape[1];
    std::vector<float>& m = w[name];
    for (size_t i = 0; i < m.size(); ++i) {
      if (Outlier(static_cast<int64_t>(i) % cols)) m[i] *= by;
    }
  };
  auto scale_rows = [&](const std::string& name, float by) {
    const int64_t cols = (*st)->Find(name)->shape[1];
    std::vector<float>& m = w[name];
    for (size_t i = 0; i < m.size(); ++i) {
      if (Outlier(static_cast<int64_t>(i) / cols)) m[i] *= by;
    }
  };
  for (const char* norm : {"input_layernorm.weight", "post_attention_layernorm.weight"}) {
    for (size_t c = 0; c < w[p + norm].size(); ++c) {
      if (Outlier(static_cast<int64_t>(c))) w[p + norm][c] /= kScale;
    }
  }
  for (const char* m : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                        "mlp.gate_proj.weight", "mlp.up_proj.weight", "self_attn.o_proj.weight",
                        "mlp.down_proj.weight"}) {
    scale_columns(p + m, kScale);
  }
  // o_proj's input channel h*32 + 7 is head h's dimension 7, a mix of
  // v_proj's rows of dimension 7; down_proj's is up_proj's row.
  scale_rows(p + "self_attn.v_proj.weight", 1 / kScale);
  scale_rows(p + "mlp.up_proj.weight", 1 / kScale);

  std::vector<std::vector<uint8_t>> data;
  std::vector<engine::TensorToWrite> out;
  data.reserve(w.size());
  for (const auto& [name, values] : w) {
    const engine::TensorView* t = (*st)->Find(name);
    data.emplace_back(t->num_bytes);
    for (size_t i = 0; i < values.size(); ++i) {
      if (t->dtype == engine::DType::kBF16) {
        const uint16_t h = kernels::FloatToBf16(values[i]);
        std::memcpy(data.back().data() + 2 * i, &h, 2);
      } else {
        REQUIRE(t->dtype == engine::DType::kF32);
        std::memcpy(data.back().data() + 4 * i, &values[i], 4);
      }
    }
    out.push_back({name, t->dtype, t->shape, data.back().data(), t->num_bytes});
  }
  REQUIRE(engine::WriteSafetensors(dir + "/model.safetensors", out).ok());
  return dir;
}

using Run = testing::DuetRun;
Run Duet(const std::string& args) { return testing::RunDuet(args); }

TEST_CASE("duet precision-plan keeps an outlier layer at the higher precision, and its map beats every "
          "same-count map that lowers it",
          "[precision]") {
  const std::string dir = OutlierModel();
  const std::string map_path = std::string(std::getenv("TEST_TMPDIR")) + "/plan.json";
  // 7.8 bits: one bf16 layer and three q4 (7.75), or two q8 and two q4 (7),
  // or less; not a second bf16 layer.
  Run r = Duet("precision-plan --model " + dir + " --dtypes bf16,q8,q4 --bits-per-weight 7.8 --out " + map_path);
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  auto map = engine::ReadPrecisionMap(map_path);
  REQUIRE(map.ok());
  std::ifstream in(map_path);
  const nlohmann::json j = nlohmann::json::parse(in);
  const auto& plan = j["plan"];
  REQUIRE(plan["layer_bytes"].get<int64_t>() <= plan["budget_layer_bytes"].get<int64_t>());

  auto bits = [](kernels::DType d) { return kernels::BitsPerWeight(d); };
  const double outlier_bits = bits(map->layers[kOutlierLayer]);
  double least = 1e9, most = 0;
  for (kernels::DType d : map->layers) least = std::min(least, bits(d)), most = std::max(most, bits(d));
  CHECK(outlier_bits == most);
  CHECK(outlier_bits > least);
  // The outliers made layer 3 the most sensitive at q8 (at q4 every layer
  // loses most of its function, and layer 0 most).
  const std::vector<double> q8 = plan["sensitivity"]["q8"];
  CHECK(std::max_element(q8.begin(), q8.end()) - q8.begin() == kOutlierLayer);

  auto backend = kernels::NewCpuBackend(2);
  auto tokens = engine::CalibrationTokens(dir, text::TrainingCorpus(), plan["calibration_tokens"].get<int64_t>());
  REQUIRE(tokens.ok());
  auto base_model = engine::Model::Load(dir, backend.get());
  REQUIRE(base_model.ok());
  auto base = engine::CalibrationLogits(**base_model, *tokens);
  REQUIRE(base.ok());
  {
    // The same function: the original model's logits, to float rounding.
    auto original = engine::Model::Load(testing::TinyModelDir("llama"), backend.get());
    REQUIRE(original.ok());
    auto logits = engine::CalibrationLogits(**original, *tokens);
    REQUIRE(logits.ok());
    const engine::LogitDrift d = engine::CompareLogits(*logits, *base, (*original)->config().vocab_size);
    CHECK(d.mean_kl < 1e-6);
    CHECK(d.top1_agreement == 1.0);
  }
  auto measure = [&](const std::vector<kernels::DType>& layers) {
    engine::PrecisionMap m{.layers = layers, .source = "test"};
    auto model = engine::Model::Load(dir, backend.get(), {.precision_map = m});
    REQUIRE(model.ok());
    auto logits = engine::CalibrationLogits(**model, *tokens);
    REQUIRE(logits.ok());
    return engine::CompareLogits(*base, *logits, (*model)->config().vocab_size).mean_kl;
  };
  const double planned = measure(map->layers);
  CHECK(planned == Approx(plan["measured_kl"].get<double>()).epsilon(1e-9));
  std::vector<kernels::DType> perm = map->layers;
  std::sort(perm.begin(), perm.end());
  int lower = 0;
  do {
    if (bits(perm[kOutlierLayer]) >= outlier_bits) continue;
    ++lower;
    const double kl = measure(perm);
    INFO("map " << engine::PrecisionMapJson({.layers = perm}) << " KL " << kl << ", the plan's " << planned);
    CHECK(kl > planned);
  } while (std::next_permutation(perm.begin(), perm.end()));
  CHECK(lower >= 3);
}

TEST_CASE("duet precision-plan: a budget nothing fits, or none, is a clear error", "[precision]") {
  testing::RequireResult(Duet("precision-plan --calibration-tokens 16"), 1, {"give exactly one budget"});
  testing::RequireResult(Duet("precision-plan --calibration-tokens 16 --dtypes q8,q4 --bits-per-weight 4"), 1,
                         {"no choice of dtypes fits: the layers need at least"});
  testing::RequireResult(Duet("precision-plan --calibration-tokens 16 --dtypes q8,int3 --bits-per-weight 6"), 1,
                         {"\"int3\" is not one of"});
}

}  // namespace
}  // namespace duet
