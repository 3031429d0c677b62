#include "engine/safetensors.h"
#include "kernels/dtype.h"

#include <stdlib.h>

#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace duet::engine {
namespace {

namespace fs = std::filesystem;

// A fresh directory per call, so tests never see each other's files.
std::string FreshDir() {
  const char* root = std::getenv("TEST_TMPDIR");
  std::string tmpl = std::string(root ? root : "/tmp") + "/safetensors_XXXXXX";
  REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// A file built by hand: 8-byte little-endian length, header text, data.
std::string RawFile(const std::string& header, const std::string& data, uint64_t len) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(len >> (8 * i));
  return out + header + data;
}
std::string RawFile(const std::string& header, const std::string& data) {
  return RawFile(header, data, header.size());
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

template <typename T>
TensorToWrite Tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                     const std::vector<T>& v) {
  return {std::move(name), dtype, std::move(shape), v.data(), v.size() * sizeof(T)};
}

bool SameBits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

// Asserts an Open error: its code and that the message names every needle.
template <typename StatusOrT>
void RequireError(const StatusOrT& result, absl::StatusCode code,
                  const std::vector<std::string>& needles) {
  REQUIRE_FALSE(result.ok());
  INFO(result.status().ToString());
  CHECK(result.status().code() == code);
  for (const std::string& n : needles) CHECK_THAT(std::string(result.status().message()),
                                                 Catch::Contains(n));
}

TEST_CASE("DType names and sizes", "[safetensors]") {
  CHECK(std::string(DTypeName(DType::kF32)) == "F32");
  CHECK(std::string(DTypeName(DType::kF16)) == "F16");
  CHECK(std::string(DTypeName(DType::kBF16)) == "BF16");
  CHECK(DTypeSize(DType::kF32) == 4);
  CHECK(DTypeSize(DType::kF16) == 2);
  CHECK(DTypeSize(DType::kBF16) == 2);
}

TEST_CASE("round trip of F32, F16 and BF16 with exact values", "[safetensors]") {
  const std::string dir = FreshDir();
  const std::string path = dir + "/t.safetensors";
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> f32 = {1.5f, -0.0f, inf, -inf, nan,
                                  std::numeric_limits<float>::max(),
                                  std::numeric_limits<float>::denorm_min(), -3.25e-20f};
  // F16: 2^-24, max subnormal, -0, inf, -inf, nan, max, 1.0, -2.0, min normal.
  const std::vector<uint16_t> f16 = {0x0001, 0x03FF, 0x8000, 0x7C00, 0xFC00,
                                     0x7E00, 0x7BFF, 0x3C00, 0xC000, 0x0400};
  const std::vector<float> f16_expect = {std::ldexp(1.0f, -24), std::ldexp(1023.0f, -24), -0.0f,
                                         inf, -inf, nan, 65504.0f, 1.0f, -2.0f,
                                         std::ldexp(1.0f, -14)};
  // BF16: smallest subnormal, -0, inf, nan, max, 1.0.
  const std::vector<uint16_t> bf16 = {0x0001, 0x8000, 0x7F80, 0x7FC0, 0x7F7F, 0x3F80};
  const std::vector<float> bf16_expect = {std::ldexp(1.0f, -133), -0.0f, inf, nan,
                                          std::ldexp(255.0f, 120), 1.0f};
  const std::vector<float> scalar = {42.0f};
  const std::vector<uint16_t> empty;

  REQUIRE(WriteSafetensors(path,
                           {Tensor("a.f16", DType::kF16, {2, 5}, f16),
                            Tensor("b.f32", DType::kF32, {8}, f32),
                            Tensor("c.bf16", DType::kBF16, {3, 2}, bf16),
                            Tensor("d.scalar", DType::kF32, {}, scalar),
                            Tensor("e.empty", DType::kF16, {0, 4}, empty)},
                           {{"format", "pt"}, {"note", "x"}})
              .ok());
  // Only the target is left behind: the temp file was renamed, not copied.
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);

  // Layout: header length a multiple of 8 and the header a JSON object
  // padded with spaces.
  const std::string raw = ReadAll(path);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= uint64_t{static_cast<uint8_t>(raw[i])} << (8 * i);
  CHECK(header_len % 8 == 0);
  CHECK(raw[8] == '{');
  CHECK(raw.size() == 8 + header_len + (f16.size() + bf16.size()) * 2 + (f32.size() + 1) * 4);
  // Tensors lie in the given order: a.f16 first.
  CHECK(std::memcmp(raw.data() + 8 + header_len, f16.data(), f16.size() * 2) == 0);

  auto file = SafetensorsFile::Open(path);
  REQUIRE(file.ok());
  CHECK((*file)->Names() ==
        std::vector<std::string>{"a.f16", "b.f32", "c.bf16", "d.scalar", "e.empty"});
  CHECK((*file)->metadata() == std::map<std::string, std::string>{{"format", "pt"}, {"note", "x"}});
  CHECK((*file)->Find("nope") == nullptr);

  auto check = [](const TensorView* t, DType dtype, std::vector<int64_t> shape, const void* bytes,
                  const std::vector<float>& expect) {
    REQUIRE(t != nullptr);
    INFO(t->name);
    CHECK(t->dtype == dtype);
    CHECK(t->shape == shape);
    REQUIRE(t->num_bytes == expect.size() * DTypeSize(dtype));
    CHECK(t->NumElements() == static_cast<int64_t>(expect.size()));
    if (!expect.empty()) CHECK(std::memcmp(t->data, bytes, t->num_bytes) == 0);
    std::vector<float> got = ToFloat32(*t);
    REQUIRE(got.size() == expect.size());
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("i=" << i << " got=" << got[i] << " want=" << expect[i]);
      if (std::isnan(expect[i])) {
        CHECK(std::isnan(got[i]));
      } else {
        CHECK(SameBits(got[i], expect[i]));  // Bits, so -0 is told from +0.
      }
    }
  };
  check((*file)->Find("a.f16"), DType::kF16, {2, 5}, f16.data(), f16_expect);
  check((*file)->Find("b.f32"), DType::kF32, {8}, f32.data(), f32);
  check((*file)->Find("c.bf16"), DType::kBF16, {3, 2}, bf16.data(), bf16_expect);
  check((*file)->Find("d.scalar"), DType::kF32, {}, scalar.data(), scalar);
  check((*file)->Find("e.empty"), DType::kF16, {0, 4}, nullptr, {});
  CHECK((*file)->Find("a.f16")->file == path);

  // A single-file model directory needs model.safetensors.
  fs::rename(path, dir + "/model.safetensors");
  auto model = SafetensorsModel::Open(dir);
  REQUIRE(model.ok());
  auto t = (*model)->Get("c.bf16");
  REQUIRE(t.ok());
  CHECK(ToFloat32(**t)[4] == std::ldexp(255.0f, 120));
}

TEST_CASE("ToFloat32 rejects a view whose bytes do not match its shape", "[safetensors]") {
  const std::vector<uint16_t> v = {0x3C00, 0x4000};
  TensorView t{"w", DType::kF16, {3}, reinterpret_cast<const uint8_t*>(v.data()), 4, "f"};
  std::vector<float> out(3);
  absl::Status s = ToFloat32(t, out.data());
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("\"w\""));
  t.shape = {2};
  REQUIRE(ToFloat32(t, out.data()).ok());
  CHECK(out[0] == 1.0f);
  CHECK(out[1] == 2.0f);
}

TEST_CASE("writer rejects bad tensor lists and leaves no file", "[safetensors]") {
  const std::string dir = FreshDir();
  const std::string path = dir + "/bad.safetensors";
  const std::vector<float> v = {1, 2, 3};
  absl::Status s = WriteSafetensors(path, {Tensor("w", DType::kF32, {2, 2}, v)});
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("\"w\"") && Catch::Contains("16 bytes"));
  s = WriteSafetensors(path, {Tensor("w", DType::kF32, {3}, v), Tensor("w", DType::kF32, {3}, v)});
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("duplicate"));
  s = WriteSafetensors(path, {Tensor("w", DType::kF32, {-3}, v)});
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  s = WriteSafetensors(dir + "/no/such/dir/x.safetensors", {Tensor("w", DType::kF32, {3}, v)});
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK(fs::is_empty(dir));
}

TEST_CASE("sharded round trip through the index", "[safetensors]") {
  const std::string dir = FreshDir() + "/model";
  std::vector<std::vector<float>> data;
  for (int i = 0; i < 5; ++i) {
    std::vector<float> v(4 + i);
    for (size_t j = 0; j < v.size(); ++j) v[j] = i * 100.0f + j + 0.25f;
    data.push_back(v);
  }
  std::vector<TensorToWrite> tensors;
  for (int i = 0; i < 5; ++i) {
    tensors.push_back(Tensor("layer." + std::to_string(i), DType::kF32,
                             {static_cast<int64_t>(data[i].size())}, data[i]));
  }
  // Sizes 16, 20, 24, 28, 32 bytes; cap 40 packs {16,20} {24} {28} {32}.
  REQUIRE(WriteShardedSafetensors(dir, tensors, 40).ok());
  for (int i = 1; i <= 4; ++i) {
    CHECK(fs::exists(dir + "/model-0000" + std::to_string(i) + "-of-00004.safetensors"));
  }
  CHECK_FALSE(fs::exists(dir + "/model-00005-of-00005.safetensors"));

  auto index = nlohmann::json::parse(ReadAll(dir + "/model.safetensors.index.json"));
  CHECK(index["metadata"]["total_size"] == 16 + 20 + 24 + 28 + 32);
  CHECK(index["weight_map"]["layer.0"] == "model-00001-of-00004.safetensors");
  CHECK(index["weight_map"]["layer.1"] == "model-00001-of-00004.safetensors");
  CHECK(index["weight_map"]["layer.2"] == "model-00002-of-00004.safetensors");
  CHECK(index["weight_map"]["layer.4"] == "model-00004-of-00004.safetensors");

  auto model = SafetensorsModel::Open(dir);
  REQUIRE(model.ok());
  CHECK((*model)->Names().size() == 5);
  for (int i = 0; i < 5; ++i) {
    auto t = (*model)->Get("layer." + std::to_string(i));
    REQUIRE(t.ok());
    CHECK(ToFloat32(**t) == data[i]);
  }
  CHECK((*model)->Find("layer.3")->file == dir + "/model-00003-of-00004.safetensors");
}

// ---------------------------------------------------------------- bad input

// One valid F32 tensor [2] ("w") written by hand, so each test below can
// break exactly one thing.
const char kGoodHeader[] = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
const std::string kGoodData(8, '\x01');

// A file at `path` of `header` and kGoodData fails to open with
// InvalidArgument naming each of `needles`.
void RequireHeaderRefused(const std::string& path, const std::string& header, const std::vector<std::string>& needles) {
  WriteBytes(path, RawFile(header, kGoodData));
  RequireError(SafetensorsFile::Open(path), absl::StatusCode::kInvalidArgument, needles);
}

TEST_CASE("hand-built file with overlapping tensors opens", "[safetensors]") {
  const std::string path = FreshDir() + "/ok.safetensors";
  WriteBytes(path, RawFile(R"({"__metadata__":{"k":"v"},)"
                           R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("v":{"dtype":"BF16","shape":[2],"data_offsets":[2,6]}})",
                           kGoodData));
  auto file = SafetensorsFile::Open(path);
  REQUIRE(file.ok());
  CHECK((*file)->Names() == std::vector<std::string>{"v", "w"});
  CHECK((*file)->Find("v")->data == (*file)->Find("w")->data + 2);
}

TEST_CASE("file shorter than 8 bytes", "[safetensors]") {
  const std::string path = FreshDir() + "/short.safetensors";
  WriteBytes(path, "abc");
  RequireError(SafetensorsFile::Open(path), absl::StatusCode::kInvalidArgument,
               {path, "3 bytes", "8-byte"});
}

TEST_CASE("missing file", "[safetensors]") {
  const std::string path = FreshDir() + "/absent.safetensors";
  RequireError(SafetensorsFile::Open(path), absl::StatusCode::kNotFound, {path});
}

TEST_CASE("truncated file: data section cut short", "[safetensors]") {
  const std::string path = FreshDir() + "/trunc.safetensors";
  WriteBytes(path, RawFile(kGoodHeader, kGoodData.substr(0, 5)));
  RequireError(SafetensorsFile::Open(path), absl::StatusCode::kInvalidArgument,
               {path, "\"w\"", "data_offsets", "5 bytes"});
}

TEST_CASE("header length beyond the file", "[safetensors]") {
  const std::string path = FreshDir() + "/len.safetensors";
  const std::string header = kGoodHeader;
  WriteBytes(path, RawFile(header, kGoodData, header.size() + 100));
  RequireError(SafetensorsFile::Open(path), absl::StatusCode::kInvalidArgument,
               {path, "header length " + std::to_string(header.size() + 100)});
  // A length with the top bit set must not wrap around.
  WriteBytes(path, RawFile(header, kGoodData, ~uint64_t{0}));
  RequireError(SafetensorsFile::Open(path), absl::StatusCode::kInvalidArgument,
               {path, "header length"});
}

TEST_CASE("header not JSON, or not an object", "[safetensors]") {
  const std::string path = FreshDir() + "/json.safetensors";
  RequireHeaderRefused(path, R"({"w":{"dtype":"F32",)", {path, "not valid JSON"});
  RequireHeaderRefused(path, "[1,2]   ", {path, "not a JSON object"});
  RequireHeaderRefused(path, R"({"w":7})", {path, "\"w\"", "not a JSON object"});
}

TEST_CASE("unsupported dtype", "[safetensors]") {
  const std::string path = FreshDir() + "/dtype.safetensors";
  for (const char* dtype : {"I8", "F64"}) {
    WriteBytes(path, RawFile(std::string(R"({"w":{"dtype":")") + dtype +
                                 R"(","shape":[8],"data_offsets":[0,8]}})",
                             kGoodData));
    RequireError(SafetensorsFile::Open(path), absl::StatusCode::kInvalidArgument,
                 {path, "\"w\"", "dtype", std::string("\"") + dtype + "\""});
  }
}

TEST_CASE("bad shape", "[safetensors]") {
  const std::string path = FreshDir() + "/shape.safetensors";
  for (const char* shape : {"[-2]", "[2.5]", "\"2\"", "[\"2\"]"}) {
    INFO(shape);
    WriteBytes(path, RawFile(std::string(R"({"w":{"dtype":"F32","shape":)") + shape +
                                 R"(,"data_offsets":[0,8]}})",
                             kGoodData));
    RequireError(SafetensorsFile::Open(path), absl::StatusCode::kInvalidArgument,
                 {path, "\"w\"", "\"shape\""});
  }
  RequireHeaderRefused(path, R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", {path, "\"w\"", "\"shape\"", "missing"});
  // A product that overflows 64 bits must be caught, not wrapped to 8.
  RequireHeaderRefused(path,
                       R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],)"
                       R"("data_offsets":[0,8]}})",
                       {path, "\"w\"", "\"shape\"", "overflow"});
}

TEST_CASE("shape and offsets disagree on the size", "[safetensors]") {
  const std::string path = FreshDir() + "/size.safetensors";
  RequireHeaderRefused(path, R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                       {path, "\"w\"", "data_offsets", "8 bytes", "12 bytes"});
  RequireHeaderRefused(path, R"({"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}})",
                       {path, "\"w\"", "BF16", "4 bytes"});
}

TEST_CASE("offsets beyond the file or malformed", "[safetensors]") {
  const std::string path = FreshDir() + "/off.safetensors";
  RequireHeaderRefused(path, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                       {path, "\"w\"", "data_offsets", "beyond"});
  for (const char* off : {"[8,0]", "[0]", "[-8,0]", "{}", "[0,\"8\"]"}) {
    INFO(off);
    WriteBytes(path, RawFile(std::string(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":)") +
                                 off + "}}",
                             kGoodData));
    RequireError(SafetensorsFile::Open(path), absl::StatusCode::kInvalidArgument,
                 {path, "\"w\"", "data_offsets"});
  }
}

TEST_CASE("missing tensor via SafetensorsModel::Get", "[safetensors]") {
  const std::string dir = FreshDir();
  const std::vector<float> v = {1, 2};
  REQUIRE(WriteSafetensors(dir + "/model.safetensors", {Tensor("w", DType::kF32, {2}, v)}).ok());
  auto model = SafetensorsModel::Open(dir);
  REQUIRE(model.ok());
  CHECK((*model)->Find("q") == nullptr);
  auto t = (*model)->Get("q");
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(t.status().message()) == "missing tensor q in " + dir);
}

TEST_CASE("directory with no weights", "[safetensors]") {
  const std::string dir = FreshDir();
  RequireError(SafetensorsModel::Open(dir), absl::StatusCode::kNotFound,
               {dir, "model.safetensors"});
}

TEST_CASE("index naming a missing shard", "[safetensors]") {
  const std::string dir = FreshDir();
  const std::vector<float> v = {1, 2};
  REQUIRE(WriteShardedSafetensors(dir, {Tensor("w", DType::kF32, {2}, v)}, 1 << 20).ok());
  WriteBytes(dir + "/model.safetensors.index.json",
             R"({"weight_map":{"w":"model-00001-of-00001.safetensors","x":"gone.safetensors"}})");
  RequireError(SafetensorsModel::Open(dir), absl::StatusCode::kNotFound,
               {dir + "/model.safetensors.index.json", "\"x\"", "gone.safetensors"});
}

TEST_CASE("index naming a tensor absent from its shard", "[safetensors]") {
  const std::string dir = FreshDir();
  const std::vector<float> v = {1, 2};
  REQUIRE(WriteShardedSafetensors(dir, {Tensor("w", DType::kF32, {2}, v)}, 1 << 20).ok());
  WriteBytes(dir + "/model.safetensors.index.json",
             R"({"weight_map":{"w":"model-00001-of-00001.safetensors",)"
             R"("ghost":"model-00001-of-00001.safetensors"}})");
  RequireError(SafetensorsModel::Open(dir), absl::StatusCode::kInvalidArgument,
               {dir + "/model.safetensors.index.json", "\"ghost\"",
                "model-00001-of-00001.safetensors"});
}

TEST_CASE("malformed index", "[safetensors]") {
  const std::string dir = FreshDir();
  const std::string index = dir + "/model.safetensors.index.json";
  WriteBytes(index, "{not json");
  RequireError(SafetensorsModel::Open(dir), absl::StatusCode::kInvalidArgument,
               {index, "not valid JSON"});
  WriteBytes(index, R"({"metadata":{}})");
  RequireError(SafetensorsModel::Open(dir), absl::StatusCode::kInvalidArgument,
               {index, "weight_map"});
  WriteBytes(index, R"({"weight_map":{"w":"../../etc/passwd"}})");
  RequireError(SafetensorsModel::Open(dir), absl::StatusCode::kInvalidArgument,
               {index, "\"w\"", "../../etc/passwd"});
}

TEST_CASE("a corrupt shard's error names the index, the tensor and the shard", "[safetensors]") {
  const std::string dir = FreshDir();
  WriteBytes(dir + "/s1.safetensors", RawFile(R"({"w":{"dtype":"I8","shape":[8],"data_offsets":[0,8]}})",
                                              kGoodData));
  WriteBytes(dir + "/model.safetensors.index.json", R"({"weight_map":{"w":"s1.safetensors"}})");
  RequireError(SafetensorsModel::Open(dir), absl::StatusCode::kInvalidArgument,
               {"model.safetensors.index.json", dir + "/s1.safetensors", "\"w\"", "I8"});
}

}  // namespace
}  // namespace duet::engine
