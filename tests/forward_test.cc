// The engine's forward pass against a naive double-precision reference
// (tests/reference_model.h), on the tiny model of each architecture, for every
// batch shape the serving path uses, and for every weight dtype against the
// reference on the same dequantized weights. Criterion: max|duet - ref| /
// max|ref| <= 1e-4 on the logits. What each dtype costs against F32 (mean
// KL divergence, top-1 agreement) is printed, not asserted.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/block_pool.h"
#include "engine/model.h"
#include "engine/precision_plan.h"
#include "engine/safetensors.h"
#include "kernels/dtype.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/testing/protected_backend.h"
#include "tests/reference_model.h"
#include "engine/testing/tiny_model.h"

namespace duet {
namespace {

using engine::BatchSeq;
using engine::BlockPool;
using engine::SequenceKv;
using testing::NormalizedError;

constexpr double kTolerance = 1e-4;
constexpr int64_t kBlockSize = 16;

using testing::RandomTokens;

std::vector<float> Row(const engine::Logits& l, int64_t i) {
  return std::vector<float>(l.row(i), l.row(i) + l.vocab_size);
}

struct Fixture {
  explicit Fixture(const std::string& arch, std::optional<kernels::DType> weights = std::nullopt,
                   kernels::CpuKernels kernels = kernels::CpuKernels::kBatchInvariant)
      : dir(testing::TinyModelDir(arch)), backend(kernels::NewCpuBackend(2, kernels)), ref(dir, weights) {
    auto m = engine::Model::Load(dir, backend.get(), {.weight_dtype = weights});
    REQUIRE(m.ok());
    model = std::move(*m);
    pool = std::make_unique<BlockPool>(model->KvLayoutFor(kBlockSize), 64);
  }
  std::string dir;
  kernels::KernelBackendPtr backend;
  testing::ReferenceModel ref;
  std::unique_ptr<engine::Model> model;
  std::unique_ptr<BlockPool> pool;
};

const char* kArchs[] = {"llama", "mistral", "qwen2", "qwen3", "gemma3_text", "qwen3_moe", "mixtral"};

// The reference's expert choices are the engine's only where no router
// score is near a tie: the logits below are compared where every token's
// chosen and first unchosen experts are this far apart (their scores,
// of a few units, differ from the engine's by about 1e-6).
constexpr double kRouterMargin = 1e-4;

TEST_CASE("one prompt: logits at every position match the reference", "[forward]") {
  for (const char* arch : kArchs) {
    INFO("arch " << arch);
    Fixture f(arch);
    // 60 tokens: longer than the mistral window (24), spanning 4 blocks.
    auto tokens = RandomTokens(60, 1, static_cast<int>(f.model->config().vocab_size));
    SequenceKv seq(f.pool.get());
    REQUIRE(seq.Reserve(tokens.size()).ok());
    BatchSeq b{.tokens = tokens, .start_pos = 0, .block_table = seq.block_table()};
    for (int i = 0; i < 60; ++i) b.logit_rows.push_back(i);
    auto out = f.model->Forward({b}, *f.pool);
    REQUIRE(out.ok());
    REQUIRE(out->rows() == 60);
    auto want = f.ref.Logits(tokens);
    REQUIRE(f.ref.min_router_margin() > kRouterMargin);
    for (int i = 0; i < 60; ++i) {
      INFO("position " << i);
      REQUIRE(NormalizedError(Row(*out, i), want[i]) <= kTolerance);
    }
  }
}

TEST_CASE("a batch of prompts of different lengths matches each prompt alone", "[forward]") {
  for (const char* arch : kArchs) {
    INFO("arch " << arch);
    Fixture f(arch);
    const int vocab = static_cast<int>(f.model->config().vocab_size);
    std::vector<std::vector<int32_t>> prompts = {RandomTokens(5, 2, vocab), RandomTokens(33, 3, vocab),
                                                 RandomTokens(17, 4, vocab), RandomTokens(1, 5, vocab)};
    std::vector<SequenceKv> seqs;
    std::vector<BatchSeq> batch;
    for (auto& p : prompts) {
      seqs.emplace_back(f.pool.get());
      REQUIRE(seqs.back().Reserve(p.size()).ok());
    }
    for (size_t s = 0; s < prompts.size(); ++s) {
      BatchSeq b{.tokens = prompts[s], .start_pos = 0, .block_table = seqs[s].block_table()};
      b.logit_rows = {0, static_cast<int32_t>(prompts[s].size() - 1)};
      batch.push_back(b);
    }
    auto out = f.model->Forward(batch, *f.pool);
    REQUIRE(out.ok());
    REQUIRE(out->rows() == 8);
    for (size_t s = 0; s < prompts.size(); ++s) {
      auto want = f.ref.Logits(prompts[s]);
      REQUIRE(NormalizedError(Row(*out, 2 * s), want.front()) <= kTolerance);
      REQUIRE(NormalizedError(Row(*out, 2 * s + 1), want.back()) <= kTolerance);
    }
  }
}

TEST_CASE("chunked prefill then 20 decode steps match the reference", "[forward]") {
  for (const char* arch : kArchs) {
    INFO("arch " << arch);
    Fixture f(arch);
    const int vocab = static_cast<int>(f.model->config().vocab_size);
    std::vector<int32_t> tokens = RandomTokens(45, 6, vocab);
    SequenceKv seq(f.pool.get());
    // Chunks of 13, 13, 13, 6: boundaries fall inside blocks.
    engine::Logits last;
    for (int start = 0; start < 45; start += 13) {
      int len = std::min(13, 45 - start);
      REQUIRE(seq.Reserve(start + len).ok());
      BatchSeq b{.tokens = absl::MakeConstSpan(tokens).subspan(start, len), .start_pos = start,
                 .block_table = seq.block_table(), .logit_rows = {len - 1}};
      auto out = f.model->Forward({b}, *f.pool);
      REQUIRE(out.ok());
      last = std::move(*out);
    }
    REQUIRE(NormalizedError(Row(last, 0), f.ref.Logits(tokens).back()) <= kTolerance);
    for (int step = 0; step < 20; ++step) {
      // Feed a token chosen from the previous logits (greedy), as decode does.
      int32_t next = static_cast<int32_t>(
          std::max_element(last.data.begin(), last.data.end()) - last.data.begin());
      tokens.push_back(next);
      const int64_t pos = static_cast<int64_t>(tokens.size()) - 1;
      REQUIRE(seq.Reserve(pos + 1).ok());
      BatchSeq b{.tokens = absl::MakeConstSpan(&tokens.back(), 1), .start_pos = pos,
                 .block_table = seq.block_table(), .logit_rows = {0}};
      auto out = f.model->Forward({b}, *f.pool);
      REQUIRE(out.ok());
      last = std::move(*out);
      INFO("decode step " << step);
      REQUIRE(NormalizedError(Row(last, 0), f.ref.Logits(tokens).back()) <= kTolerance);
    }
  }
}

TEST_CASE("two sequences sharing prefix blocks by reference count", "[forward]") {
  for (const char* arch : kArchs) {
    INFO("arch " << arch);
    Fixture f(arch);
    const int vocab = static_cast<int>(f.model->config().vocab_size);
    const int64_t free0 = f.pool->num_free();
    auto prefix = RandomTokens(32, 7, vocab);  // Two full blocks.
    auto tail_a = RandomTokens(9, 8, vocab), tail_b = RandomTokens(14, 9, vocab);
    {
      SequenceKv a(f.pool.get()), b(f.pool.get());
      REQUIRE(a.Reserve(32).ok());
      BatchSeq pa{.tokens = prefix, .start_pos = 0, .block_table = a.block_table()};
      REQUIRE(f.model->Forward({pa}, *f.pool).ok());
      REQUIRE(b.SharePrefix(a, 32).ok());
      REQUIRE(f.pool->RefCount(a.block_table()[0]) == 2);
      REQUIRE(f.pool->RefCount(a.block_table()[1]) == 2);
      REQUIRE(a.Reserve(32 + tail_a.size()).ok());
      REQUIRE(b.Reserve(32 + tail_b.size()).ok());
      REQUIRE(a.block_table()[2] != b.block_table()[2]);
      // Both tails in one batch, each reading the shared prefix blocks.
      std::vector<BatchSeq> batch = {
          {.tokens = tail_a, .start_pos = 32, .block_table = a.block_table(),
           .logit_rows = {static_cast<int32_t>(tail_a.size() - 1)}},
          {.tokens = tail_b, .start_pos = 32, .block_table = b.block_table(),
           .logit_rows = {static_cast<int32_t>(tail_b.size() - 1)}}};
      auto out = f.model->Forward(batch, *f.pool);
      REQUIRE(out.ok());
      std::vector<int32_t> full_a = prefix, full_b = prefix;
      full_a.insert(full_a.end(), tail_a.begin(), tail_a.end());
      full_b.insert(full_b.end(), tail_b.begin(), tail_b.end());
      REQUIRE(NormalizedError(Row(*out, 0), f.ref.Logits(full_a).back()) <= kTolerance);
      REQUIRE(NormalizedError(Row(*out, 1), f.ref.Logits(full_b).back()) <= kTolerance);
    }
    REQUIRE(f.pool->num_free() == free0);  // Every block back, shared ones once.
  }
}

TEST_CASE("a window-sized decode on mistral differs from full attention", "[forward]") {
  // Guards the test itself: with a 60-token prompt the sliding window must
  // change the logits, or the window cases above would prove nothing.
  Fixture f("mistral");
  REQUIRE(f.model->config().layer_window[0] == 24);
  auto tokens = RandomTokens(60, 1, static_cast<int>(f.model->config().vocab_size));
  auto windowed = f.ref.Logits(tokens).back();
  testing::ReferenceModel full(f.dir);
  // Same weights, no window: patch the config copy the reference holds.
  const_cast<spec::ModelConfig&>(full.config()).layer_window.assign(f.model->config().num_layers, 0);
  auto unwindowed = full.Logits(tokens).back();
  std::vector<float> wf(windowed.begin(), windowed.end());
  REQUIRE(NormalizedError(wf, unwindowed) > 1e-3);
}

// Decode rows keep their bits at every batch size, 1 to 9 and 33: a
// mixture of experts on the batch-invariant kernels, and the opt-in
// integer dots (kInt8Activations) on q8 and q4 weights, dense and MoE.
TEST_CASE("decode rows keep their bits at every batch size, 1 to 9 and 33: experts, and int8 activations",
          "[forward]") {
  struct Case {
    const char* arch;
    std::optional<kernels::DType> weights;
    kernels::CpuKernels kernels;
  };
  for (const Case& c : {Case{"qwen3_moe", std::nullopt, kernels::CpuKernels::kBatchInvariant},
                        Case{"mixtral", std::nullopt, kernels::CpuKernels::kBatchInvariant},
                        Case{"llama", kernels::DType::kQ8, kernels::CpuKernels::kInt8Activations},
                        Case{"qwen3_moe", kernels::DType::kQ4, kernels::CpuKernels::kInt8Activations}}) {
    const char* arch = c.arch;
    INFO("arch " << arch << ", " << (c.weights ? kernels::DTypeName(*c.weights) : "checkpoint") << " weights, "
                 << (c.kernels == kernels::CpuKernels::kBatchInvariant ? "exact" : "int8") << " kernels");
    Fixture f(arch, c.weights, c.kernels);
    const int vocab = static_cast<int>(f.model->config().vocab_size);
    constexpr int kSeqs = 33, kPrompt = 6;
    BlockPool pool(f.model->KvLayoutFor(kBlockSize), 2 * kSeqs);
    std::vector<SequenceKv> seqs;
    std::vector<std::vector<int32_t>> toks;
    for (int s = 0; s < kSeqs; ++s) {
      seqs.emplace_back(&pool);
      toks.push_back(RandomTokens(kPrompt + 1, 100 + s, vocab));
      REQUIRE(seqs.back().Reserve(kPrompt + 1).ok());
      BatchSeq b{.tokens = absl::MakeConstSpan(toks.back()).first(kPrompt), .start_pos = 0,
                 .block_table = seqs.back().block_table()};
      REQUIRE(f.model->Forward({b}, pool).ok());
    }
    // One decode step of the first b sequences (each rewrites its own KV
    // slot with the same values); row s against its row in the batch of 33.
    auto step = [&](int b) {
      std::vector<BatchSeq> batch;
      for (int s = 0; s < b; ++s) {
        batch.push_back({.tokens = absl::MakeConstSpan(&toks[s][kPrompt], 1), .start_pos = kPrompt,
                         .block_table = seqs[s].block_table(), .logit_rows = {0}});
      }
      auto out = f.model->Forward(batch, pool);
      REQUIRE(out.ok());
      return std::move(*out);
    };
    const engine::Logits all = step(kSeqs);
    for (int b : {1, 2, 3, 4, 5, 6, 7, 8, 9}) {
      const engine::Logits got = step(b);
      for (int s = 0; s < b; ++s) {
        INFO("batch " << b << ", row " << s);
        REQUIRE(Row(got, s) == Row(all, s));
      }
    }
  }
}

// Logits at every position of `tokens` (one prefill).
std::vector<std::vector<float>> AllLogits(Fixture& f, const std::vector<int32_t>& tokens) {
  SequenceKv seq(f.pool.get());
  REQUIRE(seq.Reserve(tokens.size()).ok());
  BatchSeq b{.tokens = tokens, .start_pos = 0, .block_table = seq.block_table()};
  for (size_t i = 0; i < tokens.size(); ++i) b.logit_rows.push_back(static_cast<int32_t>(i));
  auto out = f.model->Forward({b}, *f.pool);
  REQUIRE(out.ok());
  std::vector<std::vector<float>> rows;
  for (int64_t i = 0; i < out->rows(); ++i) rows.push_back(Row(*out, i));
  return rows;
}

TEST_CASE("every weight dtype: the logits match the reference on the same dequantized weights", "[forward]") {
  for (const char* arch : kArchs) {
    Fixture f32(arch, kernels::DType::kF32);
    const auto tokens = RandomTokens(60, 1, static_cast<int>(f32.model->config().vocab_size));
    const auto base = AllLogits(f32, tokens);
    for (kernels::DType dtype : {kernels::DType::kBF16, kernels::DType::kF16, kernels::DType::kQ8,
                                 kernels::DType::kQ4, kernels::DType::kQ4Z}) {
      INFO("arch " << arch << ", " << kernels::DTypeName(dtype));
      Fixture f(arch, dtype);
      const auto got = AllLogits(f, tokens);
      const auto want = f.ref.Logits(tokens);
      REQUIRE(f.ref.min_router_margin() > kRouterMargin);
      double kl = 0;
      int agree = 0;
      for (size_t i = 0; i < tokens.size(); ++i) {
        INFO("position " << i);
        REQUIRE(NormalizedError(got[i], want[i]) <= kTolerance);
        const engine::LogitDrift d = engine::CompareLogits(base[i], got[i], f.model->config().vocab_size);
        kl += d.mean_kl;
        agree += d.top1_agreement == 1.0;
      }
      // Quantized weights really are another dtype's: the logits moved off
      // F32's (a BF16 checkpoint's weights are the same in bf16 and f32).
      if (kernels::IsQuantized(dtype)) {
        REQUIRE(NormalizedError(got.back(), std::vector<double>(base.back().begin(), base.back().end())) > 1e-4);
      }
      std::printf("quality %-8s %-5s vs f32: mean KL %.2e, top-1 agreement %.3f (%zu positions)\n", arch,
                  std::string(kernels::DTypeName(dtype)).c_str(), kl / tokens.size(),
                  static_cast<double>(agree) / tokens.size(), tokens.size());
    }
  }
}

// The opt-in integer dots on quantized activations: not the exact product,
// so no reference bound; their drift from F32 printed beside the exact
// kernels' on the same weights (kernels/README.md quotes it).
TEST_CASE("int8 activations: drift from F32 of the exact kernels' order on the same weights, quality printed",
          "[forward]") {
  for (const char* arch : kArchs) {
    Fixture f32(arch, kernels::DType::kF32);
    const auto tokens = RandomTokens(60, 1, static_cast<int>(f32.model->config().vocab_size));
    const auto base = AllLogits(f32, tokens);
    for (kernels::DType dtype : {kernels::DType::kQ8, kernels::DType::kQ4}) {
      INFO("arch " << arch << ", " << kernels::DTypeName(dtype));
      Fixture exact(arch, dtype);
      Fixture int8(arch, dtype, kernels::CpuKernels::kInt8Activations);
      const auto want = AllLogits(exact, tokens);
      const auto got = AllLogits(int8, tokens);
      double kl = 0, kl_exact = 0;
      int agree = 0, agree_exact = 0;
      for (size_t i = 0; i < tokens.size(); ++i) {
        INFO("position " << i);
        // It really is another product.
        if (i == 0) CHECK(NormalizedError(got[i], std::vector<double>(want[i].begin(), want[i].end())) > 0);
        const int64_t vocab = f32.model->config().vocab_size;
        const engine::LogitDrift d = engine::CompareLogits(base[i], got[i], vocab);
        const engine::LogitDrift e = engine::CompareLogits(base[i], want[i], vocab);
        kl += d.mean_kl, kl_exact += e.mean_kl;
        agree += d.top1_agreement == 1.0, agree_exact += e.top1_agreement == 1.0;
      }
      // These random models amplify any change through their layers (int8
      // moves q8's logits by about 10% of their range), so the bound is on
      // the drift from F32: of the exact kernels' order on the same weights,
      // where a wrong product would drift by whole units.
      const double n = static_cast<double>(tokens.size());
      CHECK(kl / n <= 3 * kl_exact / n + 0.01);
      std::printf("quality %-11s %-2s int8 activations vs f32: mean KL %.2e, top-1 agreement %.3f (exact kernels: "
                  "%.2e, %.3f)\n",
                  arch, std::string(kernels::DTypeName(dtype)).c_str(), kl / n, agree / n, kl_exact / n,
                  agree_exact / n);
    }
  }
}

TEST_CASE("a multimodal Gemma-3 checkpoint serves its text model: the text model's logits, bit for bit",
          "[forward]") {
  // Gemma3ForConditionalGeneration as published: model_type gemma3, the
  // text model's fields in text_config (those equal to Gemma3TextConfig's
  // defaults left out, the EOS id at the top level), its tensors under
  // language_model. beside a vision tower's and a projector's.
  namespace fs = std::filesystem;
  const std::string text_dir = testing::TinyModelDir("gemma3_text");
  const std::string dir = testing::FreshDir("gemma3-multimodal");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(fs::path(text_dir) / f, fs::path(dir) / f);
  std::ifstream in(fs::path(text_dir) / "config.json");
  nlohmann::json text = nlohmann::json::parse(in);
  const nlohmann::json eos = text["eos_token_id"];
  for (const char* k : {"architectures", "eos_token_id", "rms_norm_eps", "rope_theta", "rope_local_base_freq",
                        "tie_word_embeddings", "attention_bias", "hidden_activation"}) {
    text.erase(k);
  }
  const nlohmann::json cfg = {{"architectures", {"Gemma3ForConditionalGeneration"}}, {"model_type", "gemma3"},
                              {"text_config", text}, {"eos_token_id", eos}, {"image_token_index", 262144},
                              {"vision_config", {{"model_type", "siglip_vision_model"}, {"hidden_size", 8}}}};
  std::ofstream(fs::path(dir) / "config.json") << cfg.dump(2);
  auto st = engine::SafetensorsModel::Open(text_dir);
  REQUIRE(st.ok());
  std::vector<std::string> names;
  std::vector<engine::TensorToWrite> out;
  const std::vector<uint8_t> vision(64, 1);
  out.push_back({.name = "vision_tower.vision_model.embeddings.patch_embedding.weight", .dtype = engine::DType::kBF16,
                 .shape = {4, 8}, .data = vision.data(), .num_bytes = vision.size()});
  out.push_back({.name = "multi_modal_projector.mm_input_projection_weight", .dtype = engine::DType::kBF16,
                 .shape = {8, 4}, .data = vision.data(), .num_bytes = vision.size()});
  names.reserve((*st)->Names().size());
  for (const std::string& name : (*st)->Names()) {
    const engine::TensorView* t = (*st)->Find(name);
    names.push_back("language_model." + name);
    out.push_back({.name = names.back(), .dtype = t->dtype, .shape = t->shape, .data = t->data, .num_bytes = t->num_bytes});
  }
  REQUIRE(engine::WriteSafetensors(dir + "/model.safetensors", out).ok());

  auto config = spec::ModelConfig::FromFile(dir + "/config.json");
  REQUIRE(config.ok());
  CHECK(config->tensor_prefix == "language_model.");
  CHECK(config->model_type == "gemma3_text");
  CHECK(config->rms_norm_eps == 1e-6);  // Gemma3TextConfig's default
  CHECK(config->IsEos(eos.get<int32_t>()));
  Fixture mm_text("gemma3_text");
  kernels::KernelBackendPtr be = kernels::NewCpuBackend(2);
  auto mm = engine::Model::Load(dir, be.get());
  REQUIRE(mm.ok());
  BlockPool pool((*mm)->KvLayoutFor(kBlockSize), 64);
  const auto tokens = RandomTokens(40, 3, static_cast<int>((*mm)->config().vocab_size));
  SequenceKv seq(&pool);
  REQUIRE(seq.Reserve(tokens.size()).ok());
  BatchSeq b{.tokens = tokens, .start_pos = 0, .block_table = seq.block_table(), .logit_rows = {39}};
  auto got = (*mm)->Forward({b}, pool);
  REQUIRE(got.ok());
  CHECK(Row(*got, 0) == AllLogits(mm_text, tokens).back());
  // The reference reads the same tensors through the prefix.
  testing::ReferenceModel ref(dir);
  CHECK(NormalizedError(Row(*got, 0), ref.Logits(tokens).back()) <= kTolerance);
}

// A copy of the tiny `arch` model with `fields` set in its config.json.
std::string Variant(const std::string& arch, const std::string& name, const nlohmann::json& fields) {
  namespace fs = std::filesystem;
  const std::string base = testing::TinyModelDir(arch);
  const std::string dir = testing::FreshDir(name);
  for (const auto& e : fs::directory_iterator(base)) fs::copy(e.path(), fs::path(dir) / e.path().filename());
  std::ifstream in(fs::path(base) / "config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  for (const auto& [k, v] : fields.items()) cfg[k] = v;
  std::ofstream(fs::path(dir) / "config.json", std::ios::trunc) << cfg.dump(2);
  return dir;
}

// Every position's logits of one prefill of `tokens` on the model in `dir`.
std::vector<std::vector<float>> PrefillLogits(const std::string& dir, const std::vector<int32_t>& tokens) {
  kernels::KernelBackendPtr be = kernels::NewCpuBackend(2);
  auto m = engine::Model::Load(dir, be.get());
  REQUIRE(m.ok());
  BlockPool pool((*m)->KvLayoutFor(kBlockSize), 64);
  SequenceKv seq(&pool);
  REQUIRE(seq.Reserve(tokens.size()).ok());
  BatchSeq b{.tokens = tokens, .start_pos = 0, .block_table = seq.block_table()};
  for (size_t i = 0; i < tokens.size(); ++i) b.logit_rows.push_back(static_cast<int32_t>(i));
  auto out = (*m)->Forward({b}, pool);
  REQUIRE(out.ok());
  std::vector<std::vector<float>> rows;
  for (int64_t i = 0; i < out->rows(); ++i) rows.push_back(Row(*out, i));
  return rows;
}

TEST_CASE("yarn RoPE scaling (Qwen3's long context) on the tiny qwen3 matches the reference's published formula",
          "[forward]") {
  // An original context shorter than the prompt, so that the blend and the
  // attention factor both act.
  const std::string dir = Variant("qwen3", "qwen3-yarn",
                                  {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0},
                                                     {"original_max_position_embeddings", 32}}}});
  const auto tokens = RandomTokens(60, 5, 1000);
  const auto got = PrefillLogits(dir, tokens);
  const auto want = testing::ReferenceModel(dir).Logits(tokens);
  for (size_t i = 0; i < tokens.size(); ++i) {
    INFO("position " << i);
    REQUIRE(NormalizedError(got[i], want[i]) <= kTolerance);
  }
  CHECK(NormalizedError(got.back(), testing::ReferenceModel(testing::TinyModelDir("qwen3")).Logits(tokens).back()) >
        1e-3);
}

TEST_CASE("soft-capping (Gemma-2's fields on the tiny gemma3_text): logits and attention scores capped as the "
          "reference caps them",
          "[forward]") {
  // Caps near the values they meet, so both change what they cap.
  const std::string dir =
      Variant("gemma3_text", "gemma3-softcap", {{"final_logit_softcapping", 2.0}, {"attn_logit_softcapping", 1.0}});
  const auto tokens = RandomTokens(50, 4, 1000);
  const auto got = PrefillLogits(dir, tokens);
  const auto want = testing::ReferenceModel(dir).Logits(tokens);
  const auto uncapped = testing::ReferenceModel(testing::TinyModelDir("gemma3_text")).Logits(tokens);
  for (size_t i = 0; i < tokens.size(); ++i) {
    INFO("position " << i);
    REQUIRE(NormalizedError(got[i], want[i]) <= kTolerance);
    for (float l : got[i]) REQUIRE(std::fabs(l) <= 2.0f);
  }
  // Attention capping alone moves the logits too: undo the final cap and compare.
  std::vector<float> atanh_last;
  for (float l : got.back()) atanh_last.push_back(2.0f * std::atanh(std::min(0.999999f, std::max(-0.999999f, l / 2.0f))));
  CHECK(NormalizedError(atanh_last, uncapped.back()) > 1e-2);
}

// --- Tensor and pipeline parallelism (LoadOptions::tp, ::pp)

// sqrt(sum (a - b)^2 / sum b^2): the "relative RMS".
double RelativeRms(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

// The logits of one run of the serving path's step shapes, and the KV pool
// it leaves: two prompts prefilled together in chunks (one longer than
// mistral's window; each second chunk runs after the first's cached KV),
// then 12 decode steps of both in one batch, each fed the
// greedy token of `feed`'s logits at that step (nullptr: its own), so every
// model sees the same tokens.
struct Run {
  std::vector<std::vector<float>> logits;  // every step's rows
  std::vector<float> kv;                   // the pool's blocks the run used, as floats
};
Run RunSteps(engine::Model& m, const Run* feed, kernels::BufferType& pool_memory = kernels::HostMemoryType()) {
  const int vocab = static_cast<int>(m.config().vocab_size);
  BlockPool pool(m.KvLayoutFor(kBlockSize), 32, pool_memory);
  std::vector<std::vector<int32_t>> toks = {RandomTokens(50, 11, vocab), RandomTokens(21, 12, vocab)};
  SequenceKv a(&pool), b(&pool);
  SequenceKv* seqs[2] = {&a, &b};
  Run run;
  size_t step = 0;
  auto forward = [&](std::vector<BatchSeq> batch) {
    auto out = m.Forward(batch, pool);
    REQUIRE(out.ok());
    REQUIRE(out->rows() == 2);
    for (int64_t r = 0; r < 2; ++r) run.logits.push_back(Row(*out, r));
    ++step;
  };
  // Prefill in chunks of 30 and 20 (the second prompt's 21 in 15 + 6).
  const int chunks[2][2] = {{30, 20}, {15, 6}};
  int done[2] = {0, 0};
  for (int c = 0; c < 2; ++c) {
    std::vector<BatchSeq> batch;
    for (int s = 0; s < 2; ++s) {
      const int len = chunks[s][c];
      REQUIRE(seqs[s]->Reserve(done[s] + len).ok());
      batch.push_back({.tokens = absl::MakeConstSpan(toks[s]).subspan(done[s], len), .start_pos = done[s],
                       .block_table = seqs[s]->block_table(), .logit_rows = {len - 1}});
      done[s] += len;
    }
    forward(std::move(batch));
  }
  for (int d = 0; d < 12; ++d) {
    const std::vector<std::vector<float>>& src = feed != nullptr ? feed->logits : run.logits;
    std::vector<BatchSeq> batch;
    for (int s = 0; s < 2; ++s) {
      const std::vector<float>& l = src[2 * (step - 1) + s];
      toks[s].push_back(static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
      const int64_t pos = static_cast<int64_t>(toks[s].size()) - 1;
      REQUIRE(seqs[s]->Reserve(pos + 1).ok());
      batch.push_back({.tokens = absl::MakeConstSpan(&toks[s].back(), 1), .start_pos = pos,
                       .block_table = seqs[s]->block_table(), .logit_rows = {0}});
    }
    forward(std::move(batch));
  }
  const kernels::KvLayout& l = pool.layout();
  std::vector<uint8_t> kv(static_cast<size_t>(pool.bytes()));
  REQUIRE(pool.buffer().Read(0, kv.data(), pool.bytes()).ok());
  for (const SequenceKv* s : seqs) {
    for (int32_t blk : s->block_table()) {
      for (int64_t e = 0; e < l.BlockStride(); ++e) run.kv.push_back(l.Value(kv.data(), blk * l.BlockStride() + e));
    }
  }
  return run;
}

std::unique_ptr<engine::Model> LoadParallel(const std::string& dir, kernels::KernelBackend* be, int tp, int pp) {
  auto m = engine::Model::Load(dir, be, {.tp = tp, .pp = pp, .rank_threads = 1});
  INFO(m.status());
  REQUIRE(m.ok());
  return std::move(*m);
}

// For each tiny architecture: `check(arch, dir, backend, want)`, `want`
// the run of the unsplit model (TP=1, PP=1) on that backend.
void ForEachArchUnsplit(
    const std::function<void(const char*, const std::string&, kernels::KernelBackend*, const Run&)>& check) {
  for (const char* arch : kArchs) {
    INFO("arch " << arch);
    const std::string dir = testing::TinyModelDir(arch);
    kernels::KernelBackendPtr be = kernels::NewCpuBackend(1);
    auto base = LoadParallel(dir, be.get(), 1, 1);
    check(arch, dir, be.get(), RunSteps(*base, nullptr));
  }
}

TEST_CASE("pipeline parallelism: PP=2 and PP=4 give PP=1's logits and KV bit for bit", "[forward][parallel]") {
  ForEachArchUnsplit([](const char*, const std::string& dir, kernels::KernelBackend* be, const Run& want) {
    for (int pp : {2, 4}) {
      INFO("pp " << pp);
      auto m = LoadParallel(dir, be, 1, pp);
      REQUIRE(m->layer_dtypes().size() == static_cast<size_t>(m->config().num_layers));
      const Run got = RunSteps(*m, nullptr);  // its own greedy tokens: equal bits feed equal tokens
      REQUIRE(got.logits == want.logits);
      REQUIRE(got.kv == want.kv);
    }
  });
}

TEST_CASE("tensor parallelism: TP=2 (and TP=2 x PP=2) within 1e-5 relative RMS of TP=1", "[forward][parallel]") {
  ForEachArchUnsplit([](const char* arch, const std::string& dir, kernels::KernelBackend* be, const Run& want) {
    for (int pp : {1, 2}) {
      INFO("tp 2, pp " << pp);
      auto m = LoadParallel(dir, be, 2, pp);
      const Run got = RunSteps(*m, &want);
      REQUIRE(got.logits.size() == want.logits.size());
      double worst = 0;
      bool differ = false;
      for (size_t i = 0; i < want.logits.size(); ++i) {
        worst = std::max(worst, RelativeRms(got.logits[i], want.logits[i]));
        differ = differ || got.logits[i] != want.logits[i];
      }
      std::printf("forward_test: %s tp 2 pp %d: worst logits relative RMS %.2e over %zu rows\n", arch, pp, worst,
                  want.logits.size());
      REQUIRE(worst <= 1e-5);
      // The halves are summed apart, so some bits differ: a rank that left
      // out its partner's half would be far off, not equal.
      REQUIRE(differ);
      REQUIRE(RelativeRms(got.kv, want.kv) <= 1e-5);
    }
  });
}

// The engine reaches activations and KV only through the backend: on a
// backend whose buffers are PROT_NONE outside its ops and copies, every
// step shape runs without a fault, unsplit, PP=2 and TP=2 (each rank a
// protected backend of its own, the pool the front backend's), with the
// CPU backend's logits and KV.
TEST_CASE("on protected backend memory every step shape runs, with the CPU's logits, TP=1, PP=2 and TP=2",
          "[forward][parallel]") {
  ForEachArchUnsplit([](const char*, const std::string& dir, kernels::KernelBackend*, const Run& want) {
    for (auto [tp, pp] : {std::pair{1, 1}, std::pair{1, 2}, std::pair{2, 1}}) {
      INFO("tp " << tp << ", pp " << pp);
      kernels::ProtectedBackend front(kernels::NewCpuBackend(1));
      std::vector<kernels::ProtectedBackend*> ranks;
      engine::LoadOptions options{.tp = tp, .pp = pp, .rank_threads = 1};
      options.rank_backend = [&ranks](int threads) -> absl::StatusOr<kernels::KernelBackendPtr> {
        auto be = std::make_unique<kernels::ProtectedBackend>(kernels::NewCpuBackend(threads));
        ranks.push_back(be.get());
        return be;
      };
      auto m = engine::Model::Load(dir, &front, options);
      REQUIRE(m.ok());
      const Run got = RunSteps(**m, &want, front.DefaultBufferType());
      CHECK(kernels::GuardedMemoryClosed());
      REQUIRE(got.logits.size() == want.logits.size());
      if (tp == 1) {
        REQUIRE(got.logits == want.logits);
        REQUIRE(got.kv == want.kv);
      } else {
        for (size_t i = 0; i < want.logits.size(); ++i) REQUIRE(RelativeRms(got.logits[i], want.logits[i]) <= 1e-5);
      }
      // The ops ran on the protected backends: the front one unsplit, else each rank's.
      if (ranks.empty()) ranks.push_back(&front);
      REQUIRE(ranks.size() == static_cast<size_t>(tp * pp));
      for (kernels::ProtectedBackend* be : ranks) CHECK(be->calls().at("paged_attention") > 0);
    }
  });
}

TEST_CASE("ModelConfig::NumParameters counts every weight the engine loads, each architecture", "[forward]") {
  for (const char* arch : kArchs) {
    INFO("arch " << arch);
    kernels::KernelBackendPtr be = kernels::NewCpuBackend(1);
    auto m = engine::Model::Load(testing::TinyModelDir(arch), be.get(), {.weight_dtype = kernels::DType::kF32});
    REQUIRE(m.ok());
    CHECK((*m)->weight_bytes() == 4 * (*m)->config().NumParameters());
  }
}

TEST_CASE("parallelism the model cannot be split by is refused by name", "[forward][parallel]") {
  const std::string dir = testing::TinyModelDir("llama");  // 8 heads, 2 KV heads, 4 layers
  kernels::KernelBackendPtr be = kernels::NewCpuBackend(1);
  auto tp4 = engine::Model::Load(dir, be.get(), {.tp = 4});
  REQUIRE(tp4.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(tp4.status().message()), Catch::Contains("KV heads (2)"));
  auto pp5 = engine::Model::Load(dir, be.get(), {.pp = 5});
  REQUIRE(pp5.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(pp5.status().message()), Catch::Contains("4 layers"));
  REQUIRE(engine::Model::Load(dir, be.get(), {.tp = 0}).status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace duet
