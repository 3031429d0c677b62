// Each bad input to the engine returns a Status whose message names the
// file, tensor or field at fault; nothing crashes.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/block_pool.h"
#include "engine/generator.h"
#include "engine/model.h"
#include "engine/precision_map.h"
#include "engine/safetensors.h"
#include "kernels/cpu/cpu_backend.h"
#include "engine/testing/tiny_model.h"

namespace duet {
namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;

// A copy of the tiny llama model that a test may break.
std::string CopyModel(const std::string& name) {
  std::string dir = testing::FreshDir(name);
  for (const auto& e : fs::directory_iterator(testing::TinyModelDir("llama"))) {
    fs::copy_file(e.path(), fs::path(dir) / e.path().filename());
  }
  return dir;
}

std::string ReadFile(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void WriteFile(const std::string& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

absl::Status LoadStatus(const std::string& dir) {
  auto backend = kernels::NewCpuBackend(1);
  return engine::Model::Load(dir, backend.get()).status();
}

TEST_CASE("truncated safetensors names the file", "[errors]") {
  std::string dir = CopyModel("truncated");
  std::string st = dir + "/model.safetensors";
  std::string bytes = ReadFile(st);
  WriteFile(st, bytes.substr(0, bytes.size() - 1000));
  absl::Status s = LoadStatus(dir);
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(s.message()), Contains("model.safetensors"));
}

TEST_CASE("header length beyond the file names the file", "[errors]") {
  std::string dir = CopyModel("header_len");
  std::string st = dir + "/model.safetensors";
  std::string bytes = ReadFile(st);
  uint64_t huge = bytes.size() + 100;
  std::memcpy(bytes.data(), &huge, 8);
  WriteFile(st, bytes);
  absl::Status s = LoadStatus(dir);
  REQUIRE_FALSE(s.ok());
  REQUIRE_THAT(std::string(s.message()), Contains("model.safetensors"));
  REQUIRE_THAT(std::string(s.message()), Contains("header"));
}

// Rewrites the safetensors header with `edit` applied (same data section).
void EditHeader(const std::string& st, const std::function<void(nlohmann::json&)>& edit) {
  std::string bytes = ReadFile(st);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  nlohmann::json h = nlohmann::json::parse(bytes.substr(8, n));
  edit(h);
  std::string text = h.dump();
  while ((text.size() % 8) != 0) text += ' ';
  // Keep the data section where the offsets say: pad the header to its old size if shorter.
  REQUIRE(text.size() <= n);
  text.append(n - text.size(), ' ');
  WriteFile(st, bytes.substr(0, 8) + text + bytes.substr(8 + n));
}

TEST_CASE("unknown dtype names the tensor and the dtype", "[errors]") {
  std::string dir = CopyModel("dtype");
  EditHeader(dir + "/model.safetensors",
             [](nlohmann::json& h) { h["model.norm.weight"]["dtype"] = "I8"; });
  absl::Status s = LoadStatus(dir);
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(s.message()), Contains("model.norm.weight"));
  REQUIRE_THAT(std::string(s.message()), Contains("I8"));
}

TEST_CASE("a tensor shape that disagrees with config.json names the tensor", "[errors]") {
  std::string dir = CopyModel("shape");
  auto cfg = nlohmann::json::parse(ReadFile(dir + "/config.json"));
  cfg["intermediate_size"] = 512;  // The weights say 768.
  WriteFile(dir + "/config.json", cfg.dump());
  absl::Status s = LoadStatus(dir);
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(s.message()), Contains("model.layers.0.mlp.gate_proj.weight"));
  REQUIRE_THAT(std::string(s.message()), Contains("config.json"));
  REQUIRE_THAT(std::string(s.message()), Contains("[768, 256]"));
}

TEST_CASE("a missing tensor is named", "[errors]") {
  std::string dir = CopyModel("missing");
  EditHeader(dir + "/model.safetensors", [](nlohmann::json& h) { h.erase("model.layers.2.mlp.up_proj.weight"); });
  absl::Status s = LoadStatus(dir);
  REQUIRE(s.code() == absl::StatusCode::kNotFound);
  REQUIRE_THAT(std::string(s.message()), Contains("model.layers.2.mlp.up_proj.weight"));
}

TEST_CASE("malformed config.json names the file and field", "[errors]") {
  std::string dir = CopyModel("config");
  WriteFile(dir + "/config.json", "{\"model_type\": \"llama\", \"hidden_size\": ");
  absl::Status s = LoadStatus(dir);
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(s.message()), Contains("config.json"));

  auto good = nlohmann::json::parse(ReadFile(testing::TinyModelDir("llama") + "/config.json"));
  auto bad = good;
  bad["num_attention_heads"] = "eight";
  WriteFile(dir + "/config.json", bad.dump());
  s = LoadStatus(dir);
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(s.message()), Contains("num_attention_heads"));

  bad = good;
  bad.erase("vocab_size");
  WriteFile(dir + "/config.json", bad.dump());
  s = LoadStatus(dir);
  REQUIRE_THAT(std::string(s.message()), Contains("vocab_size"));

  bad = good;
  bad["model_type"] = "gpt_neox";
  WriteFile(dir + "/config.json", bad.dump());
  s = LoadStatus(dir);
  REQUIRE_THAT(std::string(s.message()), Contains("model_type"));
  REQUIRE_THAT(std::string(s.message()), Contains("gpt_neox"));

  bad = good;
  bad["num_key_value_heads"] = 3;
  WriteFile(dir + "/config.json", bad.dump());
  s = LoadStatus(dir);
  REQUIRE_THAT(std::string(s.message()), Contains("num_key_value_heads"));
}

TEST_CASE("a prompt longer than the context is refused", "[errors]") {
  auto backend = kernels::NewCpuBackend(1);
  auto model = engine::Model::Load(testing::TinyModelDir("llama"), backend.get());
  REQUIRE(model.ok());
  const int64_t ctx = (*model)->config().max_position_embeddings;
  engine::BlockPool pool((*model)->KvLayoutFor(16), (ctx + 32) / 16);
  std::vector<int32_t> prompt(ctx + 1, 5);
  auto r = engine::Generate(**model, pool, prompt, {});
  REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(r.status().message()), Contains("context"));
  // The forward pass guards it too, for callers that skip Generate.
  engine::SequenceKv seq(&pool);
  REQUIRE(seq.Reserve(ctx + 1).ok());
  engine::BatchSeq b{.tokens = prompt, .start_pos = 0, .block_table = seq.block_table()};
  auto f = (*model)->Forward({b}, pool);
  REQUIRE(f.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(f.status().message()), Contains("max_position_embeddings"));
}

TEST_CASE("an exhausted KV pool is ResourceExhausted and leaks nothing", "[errors]") {
  auto backend = kernels::NewCpuBackend(1);
  auto model = engine::Model::Load(testing::TinyModelDir("llama"), backend.get());
  REQUIRE(model.ok());
  engine::BlockPool pool((*model)->KvLayoutFor(16), 3);  // 48 tokens.
  std::vector<int32_t> prompt(40, 9);
  engine::GenerateOptions opt;
  opt.max_tokens = 20;
  opt.ignore_eos = true;
  opt.sampling.temperature = 0;
  auto r = engine::Generate(**model, pool, prompt, opt);
  REQUIRE(r.status().code() == absl::StatusCode::kResourceExhausted);
  REQUIRE_THAT(std::string(r.status().message()), Contains("KV cache"));
  REQUIRE(pool.num_free() == 3);
}

TEST_CASE("out-of-vocabulary token ids are refused", "[errors]") {
  auto backend = kernels::NewCpuBackend(1);
  auto model = engine::Model::Load(testing::TinyModelDir("llama"), backend.get());
  REQUIRE(model.ok());
  engine::BlockPool pool((*model)->KvLayoutFor(16), 4);
  std::vector<int32_t> prompt = {1, 2, 100000};
  auto r = engine::Generate(**model, pool, prompt, {});
  REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(r.status().message()), Contains("100000"));
}

// A precision map's mistakes name the file and what is wrong; a good map
// loads each layer at its dtype, and bytes follow the dtypes.
TEST_CASE("precision maps: bad files are named errors, a good one sets each layer's dtype", "[errors]") {
  auto parse = [](const std::string& text) { return engine::ParsePrecisionMap(text, "m.json"); };
  auto message = [&](const std::string& text) {
    absl::StatusOr<engine::PrecisionMap> m = parse(text);
    REQUIRE(m.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(m.status().message()), Contains("m.json"));
    return std::string(m.status().message());
  };
  CHECK_THAT(message("{\"layers\": [\"q4\""), Contains("not valid JSON"));
  CHECK_THAT(message("[\"q4\"]"), Contains("not a JSON object"));
  CHECK_THAT(message("{\"embedding\": \"q8\"}"), Contains("no \"layers\""));
  CHECK_THAT(message("{\"layers\": []}"), Contains("non-empty array"));
  CHECK_THAT(message("{\"layers\": [\"q4\", \"int3\"]}"), Contains("layers[1] is \"int3\", not one of f32"));
  CHECK_THAT(message("{\"layers\": [\"q4\", 8]}"), Contains("layers[1] is not a dtype name"));
  CHECK_THAT(message("{\"layers\": [\"q4\"], \"lm_haed\": \"q8\"}"), Contains("unknown key \"lm_haed\""));
  CHECK(engine::ReadPrecisionMap(testing::FreshDir("nomap") + "/absent.json").status().code() ==
        absl::StatusCode::kNotFound);

  auto backend = kernels::NewCpuBackend(1);
  const std::string dir = testing::TinyModelDir("llama");
  auto three = parse(R"({"layers": ["q4", "q4", "q4"]})");
  REQUIRE(three.ok());
  absl::Status s = engine::Model::Load(dir, backend.get(), {.precision_map = *three}).status();
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Contains("precision map m.json has 3 layers") && Contains("has 4"));

  // Round trip through the file form, plan kept aside.
  auto map = parse(R"({"layers": ["bf16", "q4", "q8", "f32"], "lm_head": "q8", "plan": {"error": 0.5}})");
  REQUIRE(map.ok());
  auto again = parse(engine::PrecisionMapJson(*map, R"({"error": 0.5})"));
  REQUIRE(again.ok());
  CHECK(again->layers == map->layers);
  CHECK(again->lm_head == kernels::DType::kQ8);
  CHECK(!again->embedding.has_value());
  auto mapped = engine::Model::Load(dir, backend.get(), {.precision_map = *map});
  REQUIRE(mapped.ok());
  CHECK((*mapped)->layer_dtypes() == map->layers);
  auto as_stored = engine::Model::Load(dir, backend.get());  // The tiny checkpoint is bf16.
  REQUIRE(as_stored.ok());
  CHECK((*as_stored)->layer_dtypes() == std::vector<kernels::DType>(4, kernels::DType::kBF16));
  auto f32 = engine::Model::Load(dir, backend.get(), {.weight_dtype = kernels::DType::kF32});
  REQUIRE(f32.ok());
  CHECK((*mapped)->weight_bytes() < (*f32)->weight_bytes());

  // A mixture of experts' experts at their own dtype: q4 experts under f32
  // attention hold fewer bytes than f32 and more than q4 throughout. A dense
  // model's map that names experts, or a list of another length, is refused.
  const std::string moe = testing::TinyModelDir("qwen3_moe");
  auto experts = parse(R"({"layers": ["f32", "f32", "f32", "f32"], "experts": ["q4", "q4", "q4", "q4"]})");
  REQUIRE(experts.ok());
  auto split = engine::Model::Load(moe, backend.get(), {.precision_map = *experts});
  REQUIRE(split.ok());
  auto all_f32 = engine::Model::Load(moe, backend.get(), {.weight_dtype = kernels::DType::kF32});
  auto all_q4 = engine::Model::Load(moe, backend.get(), {.weight_dtype = kernels::DType::kQ4});
  REQUIRE(all_f32.ok());
  REQUIRE(all_q4.ok());
  CHECK((*split)->layer_weight_bytes(0) < (*all_f32)->layer_weight_bytes(0));
  CHECK((*split)->layer_weight_bytes(0) > (*all_q4)->layer_weight_bytes(0));
  CHECK((*split)->layer_weight_bytes(1) == (*all_f32)->layer_weight_bytes(1));  // layer 1 is dense
  CHECK(parse(engine::PrecisionMapJson(*experts))->experts == experts->experts);
  s = engine::Model::Load(dir, backend.get(), {.precision_map = *experts}).status();
  CHECK_THAT(std::string(s.message()), Contains("names experts' dtypes") && Contains("no experts"));
  CHECK_THAT(message(R"({"layers": ["q4", "q4"], "experts": ["q4"]})"), Contains("\"experts\" has 1 entries"));
}

}  // namespace
}  // namespace duet
