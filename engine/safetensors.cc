#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "kernels/dtype.h"

namespace duet::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The reference implementation's cap: a larger header is corrupt or hostile,
// and parsing it would cost memory before any other check could fail.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr char kMetadataKey[] = "__metadata__";
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr char kSingleFile[] = "model.safetensors";

std::optional<DType> ParseDType(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "I32") return DType::kI32;
  return std::nullopt;
}

// product(shape) * elem_bytes, or nullopt on a negative dim or overflow.
std::optional<uint64_t> CheckedBytes(const std::vector<int64_t>& shape, uint64_t elem_bytes) {
  uint64_t total = elem_bytes;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (__builtin_mul_overflow(total, static_cast<uint64_t>(d), &total)) return std::nullopt;
  }
  return total;
}

// Reads a JSON integer that must be >= 0 and fit in int64.
std::optional<int64_t> NonNegativeInt(const json& v) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i < 0) return std::nullopt;
    return i;
  }
  return std::nullopt;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i ? "," : "", shape[i]);
  return s + "]";
}

// Shard names come from a file we did not write; keep them inside the model
// directory.
bool IsSafeRelativePath(const std::string& name) {
  if (name.empty()) return false;
  fs::path p(name);
  if (p.is_absolute()) return false;
  for (const auto& part : p) {
    if (part == "..") return false;
  }
  return true;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  return std::move(ss).str();
}

// ---------------------------------------------------------------- writing

absl::Status WriteAll(int fd, const void* data, size_t bytes, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat("write to ", path));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

struct Chunk {
  const void* data;
  size_t bytes;
};

// Writes chunks to a temporary sibling of `path`, fsyncs it, renames it over
// `path` and fsyncs the directory, so a crash at any point leaves either the
// previous file or the complete new one, never a prefix.
absl::Status WriteFileAtomically(const std::string& path, const std::vector<Chunk>& chunks) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1, std::memory_order_relaxed));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", tmp));
  absl::Status status;
  for (const Chunk& c : chunks) {
    status = WriteAll(fd, c.data, c.bytes, tmp);
    if (!status.ok()) break;
  }
  if (status.ok() && ::fsync(fd) != 0) status = absl::ErrnoToStatus(errno, absl::StrCat("fsync ", tmp));
  if (::close(fd) != 0 && status.ok()) status = absl::ErrnoToStatus(errno, absl::StrCat("close ", tmp));
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = absl::ErrnoToStatus(errno, absl::StrCat("rename ", tmp, " to ", path));
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  // Makes the rename itself durable.
  std::string dir = fs::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("open directory ", dir));
  if (::fsync(dfd) != 0) status = absl::ErrnoToStatus(errno, absl::StrCat("fsync directory ", dir));
  ::close(dfd);
  return status;
}

absl::Status ValidateTensors(const std::string& where, const std::vector<TensorToWrite>& tensors) {
  std::map<std::string_view, int> seen;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": invalid tensor name \"", t.name, "\""));
    }
    if (!seen.emplace(t.name, 0).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": duplicate tensor name \"", t.name, "\""));
    }
    std::optional<uint64_t> bytes = CheckedBytes(t.shape, DTypeSize(t.dtype));
    if (!bytes) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": tensor \"", t.name,
                                                     "\": invalid shape ", ShapeString(t.shape)));
    }
    if (*bytes != t.num_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": tensor \"", t.name, "\": ", DTypeName(t.dtype), " shape ", ShapeString(t.shape),
          " needs ", *bytes, " bytes but ", t.num_bytes, " were given"));
    }
    if (t.num_bytes > 0 && t.data == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tensor \"", t.name, "\": null data"));
    }
  }
  return absl::OkStatus();
}

// Writes an already validated tensor list.
absl::Status WriteValidated(const std::string& path, const std::vector<const TensorToWrite*>& tensors,
                            const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the header in file order, which makes files easy to
  // read by eye; readers do not depend on it.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& m = header[kMetadataKey];
    m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
  }
  uint64_t offset = 0;
  for (const TensorToWrite* t : tensors) {
    auto& e = header[t->name];
    e["dtype"] = DTypeName(t->dtype);
    e["shape"] = t->shape;
    e["data_offsets"] = {offset, offset + t->num_bytes};
    offset += t->num_bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    // dump() throws on names or metadata that are not valid UTF-8.
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot encode header: ", e.what()));
  }
  // Pads so the data section starts 8-byte aligned in the file (and in a
  // page-aligned mapping of it).
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');

  uint8_t len_bytes[8];
  uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(len >> (8 * i));
  std::vector<Chunk> chunks = {{len_bytes, 8}, {text.data(), text.size()}};
  for (const TensorToWrite* t : tensors) {
    if (t->num_bytes > 0) chunks.push_back({t->data, t->num_bytes});
  }
  return WriteFileAtomically(path, chunks);
}

}  // namespace

// ---------------------------------------------------------------- dtypes

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
  }
  CHECK(false) << "bad DType " << static_cast<int>(dtype);
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI32:
      return "I32";
  }
  CHECK(false) << "bad DType " << static_cast<int>(dtype);
  return "";
}

int64_t TensorView::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------- reading

SafetensorsFile::SafetensorsFile(std::string path, void* map, size_t map_bytes)
    : path_(std::move(path)), map_(map), map_bytes_(map_bytes) {}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open safetensors file ", path));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status s = absl::ErrnoToStatus(errno, absl::StrCat("cannot stat ", path));
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": file is ", size, " bytes, shorter than the 8-byte header length field"));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  // The mapping holds its own reference to the file.
  ::close(fd);
  if (map == MAP_FAILED) return absl::ErrnoToStatus(errno, absl::StrCat("cannot mmap ", path));
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile(path, map, size));
  RETURN_IF_ERROR(file->Parse());
  return file;
}

absl::Status SafetensorsFile::Parse() {
  const auto* base = static_cast<const uint8_t*>(map_);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(base[i]) << (8 * i);
  const uint64_t after_len = map_bytes_ - 8;
  if (header_len > after_len) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": header length ", header_len,
                                                   " exceeds the ", after_len,
                                                   " bytes after the length field"));
  }
  if (header_len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": header length ", header_len,
                                                   " exceeds the limit of ", kMaxHeaderBytes));
  }
  const char* text = reinterpret_cast<const char*>(base + 8);
  json header;
  try {
    header = json::parse(text, text + header_len);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": header is not a JSON object"));
  }
  const uint8_t* data = base + 8 + header_len;
  const uint64_t data_bytes = after_len - header_len;

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == kMetadataKey) {
      if (entry.is_object()) {
        for (auto m = entry.begin(); m != entry.end(); ++m) {
          if (m.value().is_string()) metadata_[m.key()] = m.value().get<std::string>();
        }
      }
      continue;
    }
    auto error = [&](absl::string_view field, absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": tensor \"", name, "\": field \"", field, "\": ", what));
    };
    if (!entry.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": tensor \"", name, "\": entry is not a JSON object"));
    }
    TensorView view;
    view.name = name;
    view.file = path_;

    auto dt = entry.find("dtype");
    if (dt == entry.end()) return error("dtype", "missing");
    if (!dt->is_string()) return error("dtype", "not a string");
    const std::string dtype_name = dt->get<std::string>();
    std::optional<DType> dtype = ParseDType(dtype_name);
    if (!dtype) {
      return error("dtype", absl::StrCat("unsupported dtype \"", dtype_name,
                                         "\" (supported: F32, F16, BF16, and I32 for GPTQ's packed tensors)"));
    }
    view.dtype = *dtype;

    auto sh = entry.find("shape");
    if (sh == entry.end()) return error("shape", "missing");
    if (!sh->is_array()) return error("shape", "not an array");
    for (const json& d : *sh) {
      std::optional<int64_t> dim = NonNegativeInt(d);
      if (!dim) return error("shape", absl::StrCat("dimension ", d.dump(), " is not a non-negative integer"));
      view.shape.push_back(*dim);
    }
    std::optional<uint64_t> expected = CheckedBytes(view.shape, DTypeSize(view.dtype));
    if (!expected) {
      return error("shape", absl::StrCat(ShapeString(view.shape), " overflows the byte count"));
    }

    auto off = entry.find("data_offsets");
    if (off == entry.end()) return error("data_offsets", "missing");
    if (!off->is_array() || off->size() != 2) return error("data_offsets", "not a [begin, end] pair");
    std::optional<int64_t> begin = NonNegativeInt((*off)[0]);
    std::optional<int64_t> end = NonNegativeInt((*off)[1]);
    if (!begin || !end) return error("data_offsets", "not non-negative integers");
    if (*begin > *end) {
      return error("data_offsets", absl::StrCat("begin ", *begin, " is after end ", *end));
    }
    if (static_cast<uint64_t>(*end) > data_bytes) {
      return error("data_offsets", absl::StrCat("[", *begin, ", ", *end,
                                                "] extends beyond the data section of ",
                                                data_bytes, " bytes (file truncated?)"));
    }
    const uint64_t bytes = static_cast<uint64_t>(*end - *begin);
    if (bytes != *expected) {
      return error("data_offsets",
                   absl::StrCat("span of ", bytes, " bytes does not match ", DTypeName(view.dtype),
                                " shape ", ShapeString(view.shape), " (", *expected, " bytes)"));
    }
    view.data = data + *begin;
    view.num_bytes = static_cast<size_t>(bytes);
    tensors_.emplace(name, std::move(view));
  }
  return absl::OkStatus();
}

const TensorView* SafetensorsFile::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> SafetensorsFile::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, view] : tensors_) names.push_back(name);
  return names;
}

absl::StatusOr<std::unique_ptr<SafetensorsModel>> SafetensorsModel::Open(const std::string& model_dir,
                                                                         std::string_view prefix) {
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsModel> model, OpenAll(model_dir));
  if (prefix.empty()) return model;
  std::map<std::string, const TensorView*, std::less<>> kept;
  for (const auto& [name, view] : model->tensors_) {
    if (std::string_view(name).substr(0, prefix.size()) == prefix) kept[name.substr(prefix.size())] = view;
  }
  model->tensors_ = std::move(kept);
  return model;
}

absl::StatusOr<std::unique_ptr<SafetensorsModel>> SafetensorsModel::OpenAll(const std::string& model_dir) {
  std::unique_ptr<SafetensorsModel> model(new SafetensorsModel(model_dir));
  const std::string index_path = (fs::path(model_dir) / kIndexFile).string();
  const std::string single_path = (fs::path(model_dir) / kSingleFile).string();
  std::error_code ec;

  if (!fs::exists(index_path, ec)) {
    if (!fs::exists(single_path, ec)) {
      return absl::NotFoundError(absl::StrCat("no ", kSingleFile, " or ", kIndexFile, " in ",
                                              model_dir));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(single_path));
    for (const std::string& name : file->Names()) model->tensors_[name] = file->Find(name);
    model->files_.push_back(std::move(file));
    return model;
  }

  ASSIGN_OR_RETURN(std::string text, ReadWholeFile(index_path));
  json index;
  try {
    index = json::parse(text);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": not valid JSON: ", e.what()));
  }
  if (!index.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": not a JSON object"));
  }
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": field \"weight_map\" is missing or not an object"));
  }
  // shard -> tensors it should hold; each shard is mapped once.
  std::map<std::string, std::vector<std::string>> by_shard;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string() || !IsSafeRelativePath(it.value().get<std::string>())) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": tensor \"", it.key(), "\": field \"weight_map\": shard ",
                       it.value().dump(), " is not a relative file name inside ", model_dir));
    }
    by_shard[it.value().get<std::string>()].push_back(it.key());
  }
  for (const auto& [shard, names] : by_shard) {
    const std::string shard_path = (fs::path(model_dir) / shard).string();
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(shard_path);
    if (!file.ok()) {
      return absl::Status(file.status().code(),
                          absl::StrCat(index_path, ": tensor \"", names.front(), "\" maps to shard \"",
                                       shard, "\": ", file.status().message()));
    }
    for (const std::string& name : names) {
      const TensorView* view = (*file)->Find(name);
      if (view == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor \"", name,
                                                       "\" maps to shard \"", shard,
                                                       "\", which has no such tensor"));
      }
      model->tensors_[name] = view;
    }
    model->files_.push_back(std::move(*file));
  }
  return model;
}

const TensorView* SafetensorsModel::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second;
}

absl::StatusOr<const TensorView*> SafetensorsModel::Get(std::string_view name) const {
  const TensorView* view = Find(name);
  if (view == nullptr) {
    return absl::NotFoundError(absl::StrCat("missing tensor ", std::string(name), " in ", dir_));
  }
  return view;
}

std::vector<std::string> SafetensorsModel::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, view] : tensors_) names.push_back(name);
  return names;
}

// ---------------------------------------------------------------- conversion

absl::Status ToFloat32(const TensorView& t, float* out) {
  std::optional<uint64_t> bytes = CheckedBytes(t.shape, DTypeSize(t.dtype));
  if (!bytes || *bytes != t.num_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        t.file, ": tensor \"", t.name, "\": ", t.num_bytes, " bytes do not match ",
        DTypeName(t.dtype), " shape ", ShapeString(t.shape)));
  }
  const size_t n = t.num_bytes / DTypeSize(t.dtype);
  switch (t.dtype) {
    case DType::kI32:
      return absl::InvalidArgumentError(absl::StrCat(t.file, ": tensor \"", t.name,
                                                     "\" is I32 where a float tensor belongs"));
    case DType::kF32:
      if (n > 0) std::memcpy(out, t.data, t.num_bytes);
      break;
    case DType::kF16:
    case DType::kBF16: {
      const bool f16 = t.dtype == DType::kF16;
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;  // memcpy: the data is only byte-aligned in general.
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = f16 ? kernels::HalfToFloat(h) : kernels::Bf16ToFloat(h);
      }
      break;
    }
  }
  return absl::OkStatus();
}

std::vector<float> ToFloat32(const TensorView& t) {
  std::vector<float> out(t.num_bytes / DTypeSize(t.dtype));
  absl::Status s = ToFloat32(t, out.data());
  CHECK(s.ok()) << s.ToString();
  return out;
}

// ---------------------------------------------------------------- writing

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  RETURN_IF_ERROR(ValidateTensors(path, tensors));
  std::vector<const TensorToWrite*> ptrs;
  ptrs.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) ptrs.push_back(&t);
  return WriteValidated(path, ptrs, metadata);
}

absl::Status WriteShardedSafetensors(const std::string& model_dir,
                                     const std::vector<TensorToWrite>& tensors,
                                     uint64_t max_shard_bytes) {
  if (max_shard_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(model_dir, ": max_shard_bytes must be > 0"));
  }
  RETURN_IF_ERROR(ValidateTensors(model_dir, tensors));
  std::error_code ec;
  fs::create_directories(model_dir, ec);
  if (ec) return absl::ErrnoToStatus(ec.value(), absl::StrCat("cannot create ", model_dir));

  std::vector<std::vector<const TensorToWrite*>> shards(1);
  uint64_t shard_bytes = 0;
  uint64_t total_bytes = 0;
  for (const TensorToWrite& t : tensors) {
    if (!shards.back().empty() && shard_bytes + t.num_bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&t);
    shard_bytes += t.num_bytes;
    total_bytes += t.num_bytes;
  }

  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name =
        absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, shards.size());
    RETURN_IF_ERROR(WriteValidated((fs::path(model_dir) / name).string(), shards[i], {}));
    for (const TensorToWrite* t : shards[i]) weight_map[t->name] = name;
  }
  json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  std::string text;
  try {
    text = index.dump(2) + "\n";
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(model_dir, ": cannot encode index: ", e.what()));
  }
  return WriteFileAtomically((fs::path(model_dir) / kIndexFile).string(),
                             {{text.data(), text.size()}});
}

}  // namespace duet::engine
