// GPTQ checkpoints: a hand-checked layer (the bit order of qweight and
// qzeros, the stored-minus-one zero point, per-group scales), what a
// malformed one says, and the tiny llama written as a GPTQ checkpoint by a
// packer of this test's own (from the format's description), whose logits
// equal the F32 engine's on the weights the test dequantized itself.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/block_pool.h"
#include "engine/gptq.h"
#include "engine/model.h"
#include "engine/safetensors.h"
#include "engine/testing/tiny_model.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/dtype.h"

namespace duet {
namespace {

namespace fs = std::filesystem;
using engine::DType;
using engine::TensorToWrite;

// Tensors to write, owning their bytes.
struct Tensors {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<TensorToWrite> list;
  template <typename T>
  void Add(const std::string& name, DType dtype, std::vector<int64_t> shape, const std::vector<T>& v) {
    bytes.emplace_back(reinterpret_cast<const uint8_t*>(v.data()), reinterpret_cast<const uint8_t*>(v.data() + v.size()));
    list.push_back({name, dtype, std::move(shape), nullptr, v.size() * sizeof(T)});
  }
  void Write(const std::string& path) {
    for (size_t i = 0; i < list.size(); ++i) list[i].data = bytes[i].data();
    REQUIRE(engine::WriteSafetensors(path, list, {}).ok());
  }
};

// The layer "l" of 8 outputs x 32 inputs, one group of 32.
Tensors HandLayer(std::vector<int32_t> g_idx) {
  Tensors t;
  // qweight[i / 8][j]: input i of output j in bits 4(i % 8). Output 0's
  // inputs 0..7 hold 0..7; every other value is 8.
  std::vector<int32_t> qweight(4 * 8, static_cast<int32_t>(0x88888888u));
  qweight[0 * 8 + 0] = 0x76543210;
  // qzeros[0][0]: output j's zero in bits 4j, stored minus one: output 0's
  // zero is 8 (7 + 1), output 1's 4 (3 + 1), the rest 8.
  std::vector<int32_t> qzeros = {0x77777737};
  std::vector<uint16_t> scales(8, kernels::FloatToHalf(0.5f));
  scales[0] = kernels::FloatToHalf(1.0f);
  t.Add("l.qweight", DType::kI32, {4, 8}, qweight);
  t.Add("l.qzeros", DType::kI32, {1, 1}, qzeros);
  t.Add("l.scales", DType::kF16, {1, 8}, scales);
  t.Add("l.g_idx", DType::kI32, {32}, g_idx);
  return t;
}

absl::StatusOr<kernels::HostWeights> LoadHand(Tensors t, spec::ModelConfig::Gptq g, int64_t n = 8) {
  const std::string dir = testing::FreshDir("gptq-hand");
  t.Write(dir + "/model.safetensors");
  auto st = engine::SafetensorsModel::Open(dir);
  if (!st.ok()) return st.status();
  return engine::LoadGptqLinear(**st, "l", n, 32, g);
}

TEST_CASE("GPTQ, hand-checked: qweight's and qzeros' nibble order, the zero point plus one, the scales") {
  auto w = LoadHand(HandLayer(std::vector<int32_t>(32, 0)), {.group_size = 32});
  REQUIRE(w.ok());
  CHECK(w->dtype == kernels::DType::kQ4Z);
  const std::vector<float> d = kernels::Dequantize(w->view());
  for (int i = 0; i < 8; ++i) CHECK(d[i] == static_cast<float>(i - 8));  // (q - 8) x 1
  for (int i = 8; i < 32; ++i) CHECK(d[i] == 0.0f);                      // (8 - 8) x 1
  for (int i = 0; i < 32; ++i) CHECK(d[32 + i] == 2.0f);                 // output 1: (8 - 4) x 0.5
  for (int i = 0; i < 32; ++i) CHECK(d[7 * 32 + i] == 0.0f);
  // gptq_v2 stores zeros as they are: output 0's is 7, output 1's 3.
  auto v2 = LoadHand(HandLayer(std::vector<int32_t>(32, 0)), {.group_size = 32, .v2_zeros = true});
  REQUIRE(v2.ok());
  const std::vector<float> d2 = kernels::Dequantize(v2->view());
  CHECK(d2[0] == -7.0f);
  CHECK(d2[32] == 2.5f);
  // group_size -1: one group per row, the same here.
  auto whole = LoadHand(HandLayer(std::vector<int32_t>(32, 0)), {.group_size = -1});
  REQUIRE(whole.ok());
  CHECK(kernels::Dequantize(whole->view()) == d);
}

TEST_CASE("GPTQ: a wrong group index or shape is an error naming the tensor") {
  std::vector<int32_t> g(32, 0);
  g[5] = 1;
  auto bad_g = LoadHand(HandLayer(g), {.group_size = 32});
  REQUIRE_FALSE(bad_g.ok());
  CHECK_THAT(std::string(bad_g.status().message()), Catch::Contains("l.g_idx[5] is 1, not 0"));
  auto bad_shape = LoadHand(HandLayer(std::vector<int32_t>(32, 0)), {.group_size = 32}, /*n=*/16);
  REQUIRE_FALSE(bad_shape.ok());
  CHECK_THAT(std::string(bad_shape.status().message()),
             Catch::Contains("GPTQ tensor l.qweight is I32 [4, 8], expected I32 [4, 16]"));
  auto bad_group = LoadHand(HandLayer(std::vector<int32_t>(32, 0)), {.group_size = 64});
  REQUIRE_FALSE(bad_group.ok());
}

// The test's own GPTQ packer, from the format's description: per group of
// `group` inputs and output j, min/max (with 0) give scale = (max - min) /
// 15 (as F16) and zero = round(-min / scale) in 1..15 (the "gptq" format
// stores zero - 1, so 0 cannot be stored); q = clamp(round(w / scale) +
// zero, 0, 15). `dequantized` gets (q - zero) x scale in float.
void PackGptq(const std::string& base, const std::vector<float>& w, int64_t n, int64_t k, int64_t group,
              Tensors& out, std::vector<float>& dequantized) {
  const int64_t groups = k / group;
  std::vector<int32_t> qweight(k / 8 * n, 0), qzeros(groups * (n / 8), 0), g_idx(k);
  std::vector<uint16_t> scales(groups * n);
  dequantized.assign(n * k, 0);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t g = 0; g < groups; ++g) {
      float lo = 0, hi = 0;
      for (int64_t i = g * group; i < (g + 1) * group; ++i) {
        lo = std::min(lo, w[j * k + i]);
        hi = std::max(hi, w[j * k + i]);
      }
      const uint16_t s16 = kernels::FloatToHalf((hi - lo) / 15);
      const float s = kernels::HalfToFloat(s16);
      const int zero = std::clamp(static_cast<int>(std::lround(-lo / s)), 1, 15);
      scales[g * n + j] = s16;
      qzeros[g * (n / 8) + j / 8] |= static_cast<int32_t>(static_cast<uint32_t>(zero - 1) << (4 * (j % 8)));
      for (int64_t i = g * group; i < (g + 1) * group; ++i) {
        const int q = std::clamp(static_cast<int>(std::lround(w[j * k + i] / s)) + zero, 0, 15);
        qweight[(i / 8) * n + j] |= static_cast<int32_t>(static_cast<uint32_t>(q) << (4 * (i % 8)));
        dequantized[j * k + i] = static_cast<float>(q - zero) * s;
      }
    }
  }
  for (int64_t i = 0; i < k; ++i) g_idx[i] = static_cast<int32_t>(i / group);
  out.Add(base + ".qweight", DType::kI32, {k / 8, n}, qweight);
  out.Add(base + ".qzeros", DType::kI32, {groups, n / 8}, qzeros);
  out.Add(base + ".scales", DType::kF16, {groups, n}, scales);
  out.Add(base + ".g_idx", DType::kI32, {k}, g_idx);
}

TEST_CASE("the tiny llama as a GPTQ checkpoint: its logits equal the F32 engine's on the test's dequantized weights") {
  const std::string src = testing::TinyModelDir("llama");
  const std::string gptq_dir = testing::FreshDir("gptq-llama"), f32_dir = testing::FreshDir("gptq-llama-f32");
  for (const auto& e : fs::directory_iterator(src)) {
    if (e.path().filename() == "model.safetensors") continue;
    fs::copy(e.path(), fs::path(gptq_dir) / e.path().filename());
    fs::copy(e.path(), fs::path(f32_dir) / e.path().filename());
  }
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  cfg["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}, {"desc_act", false},
                                {"sym", false}, {"checkpoint_format", "gptq"}};
  std::ofstream(gptq_dir + "/config.json") << cfg.dump(2);
  auto in = engine::SafetensorsModel::Open(src);
  REQUIRE(in.ok());
  Tensors gptq, f32;
  int packed = 0;
  for (const std::string& name : (*in)->Names()) {
    const engine::TensorView& t = *(*in)->Find(name);
    std::vector<float> w = engine::ToFloat32(t);
    const bool linear = name.find("_proj.weight") != std::string::npos;
    if (!linear) {
      std::vector<uint8_t> raw(t.data, t.data + t.num_bytes);
      gptq.Add(name, t.dtype, t.shape, raw);
      f32.Add(name, t.dtype, t.shape, raw);
      continue;
    }
    std::vector<float> deq;
    PackGptq(name.substr(0, name.size() - 7), w, t.shape[0], t.shape[1], 128, gptq, deq);
    f32.Add(name, DType::kF32, t.shape, deq);
    ++packed;
  }
  CHECK(packed == 4 * 7);  // 4 layers x q, k, v, o, gate, up, down
  gptq.Write(gptq_dir + "/model.safetensors");
  f32.Write(f32_dir + "/model.safetensors");

  auto be = kernels::NewCpuBackend(2);
  auto logits = [&](const std::string& dir) {
    auto model = engine::Model::Load(dir, be.get());
    REQUIRE(model.ok());
    engine::BlockPool pool((*model)->KvLayoutFor(16), 8);
    engine::SequenceKv seq(&pool);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 40; ++i) tokens.push_back((i * 37 + 11) % 1024);
    REQUIRE(seq.Reserve(tokens.size()).ok());
    engine::BatchSeq b{.tokens = tokens, .start_pos = 0, .block_table = seq.block_table()};
    for (int i = 0; i < 40; ++i) b.logit_rows.push_back(i);
    auto out = (*model)->Forward({b}, pool);
    REQUIRE(out.ok());
    return out->data;
  };
  const std::vector<float> from_gptq = logits(gptq_dir), from_f32 = logits(f32_dir);
  REQUIRE(from_gptq.size() == from_f32.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < from_gptq.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(from_gptq[i]) - from_f32[i]));
    den = std::max(den, std::fabs(static_cast<double>(from_f32[i])));
  }
  CHECK(num / den <= 1e-4);
  // The kernels multiply by exactly the dequantized values: the same bits.
  CHECK(std::memcmp(from_gptq.data(), from_f32.data(), from_f32.size() * sizeof(float)) == 0);
}

}  // namespace
}  // namespace duet
