// Safetensors reader and writer: the on-disk weight format the engine loads.
//
// Use SafetensorsModel to load a Hugging Face model directory (one
// model.safetensors, or shards listed by model.safetensors.index.json);
// SafetensorsFile for one file; WriteSafetensors for tests and converters.
//
//   ASSIGN_OR_RETURN(auto model, SafetensorsModel::Open("/models/llama"));
//   ASSIGN_OR_RETURN(const TensorView* wq, model->Get("layers.0.attn.wq"));
//
// Files are memory-mapped read-only, so opening costs no copy and the kernel
// pages weights in as they are used. A TensorView points into the mapping: it
// is valid while the SafetensorsFile (or SafetensorsModel) that returned it
// lives. Every header field is validated on Open, so a TensorView's bytes are
// always inside the file and match its dtype and shape. Objects are immutable
// after Open; their const methods are thread-safe.
#ifndef DUET_ENGINE_SAFETENSORS_H_
#define DUET_ENGINE_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace duet::engine {

// The dtypes the engine reads: floats, and I32 for GPTQ's packed tensors.
// Files holding others (I8, F64, ...) are rejected on Open rather than
// misread later.
enum class DType { kF32, kF16, kBF16, kI32 };

size_t DTypeSize(DType dtype);
// "F32", "F16", "BF16", "I32": the names the safetensors header uses.
const char* DTypeName(DType dtype);

// One tensor inside a mapped file. `data` points into the mapping.
struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // Empty for a scalar.
  const uint8_t* data;         // Not aligned beyond 1 byte in general.
  size_t num_bytes;
  std::string file;  // The file it lives in, for error messages.

  int64_t NumElements() const;
};

// One .safetensors file, memory-mapped.
class SafetensorsFile {
 public:
  // Errors: NotFound / PermissionDenied for an unopenable file,
  // InvalidArgument for any malformed header (the message names the file and,
  // where relevant, the tensor and the field).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // nullptr when absent.
  const TensorView* Find(std::string_view name) const;
  // Sorted.
  std::vector<std::string> Names() const;
  // The header's "__metadata__" string entries (other values are ignored).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile(std::string path, void* map, size_t map_bytes);
  // Validates the header and fills tensors_ and metadata_.
  absl::Status Parse();

  std::string path_;
  void* map_;
  size_t map_bytes_;
  std::map<std::string, TensorView, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A model directory: model.safetensors.index.json plus its shards, or a
// single model.safetensors. Owns the mapped files.
class SafetensorsModel {
 public:
  // Errors: NotFound when the directory has neither file or the index names
  // a missing shard; InvalidArgument for a malformed index or shard, or an
  // index naming a tensor its shard lacks.
  // With a `prefix`, only the tensors whose names start with it are seen,
  // under their names less it (a multimodal checkpoint's text model:
  // "language_model.").
  static absl::StatusOr<std::unique_ptr<SafetensorsModel>> Open(const std::string& model_dir,
                                                                std::string_view prefix = "");

  // nullptr when absent.
  const TensorView* Find(std::string_view name) const;
  // NotFound "missing tensor NAME in DIR" when absent.
  absl::StatusOr<const TensorView*> Get(std::string_view name) const;
  // Sorted.
  std::vector<std::string> Names() const;
  const std::string& dir() const { return dir_; }

 private:
  explicit SafetensorsModel(std::string dir) : dir_(std::move(dir)) {}
  static absl::StatusOr<std::unique_ptr<SafetensorsModel>> OpenAll(const std::string& model_dir);

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*, std::less<>> tensors_;
};

// --- Conversion -----------------------------------------------------------

// (F16 and BF16 values convert with kernels/dtype.h's HalfToFloat,
// Bf16ToFloat, FloatToHalf and FloatToBf16.)

// Writes t.NumElements() floats to `out`. InvalidArgument when the view's
// byte count does not match its dtype and shape (only a hand-built view can).
absl::Status ToFloat32(const TensorView& t, float* out);
// Convenience for views from Open, which are always consistent; CHECK-fails
// on an inconsistent hand-built view.
std::vector<float> ToFloat32(const TensorView& t);

// --- Writing --------------------------------------------------------------

// The caller keeps `data` alive during the write; nothing is copied, so
// multi-gigabyte tensors cost no extra memory.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
  size_t num_bytes;  // Must equal product(shape) * DTypeSize(dtype).
};

// Writes a standard safetensors file: the JSON header padded with spaces to a
// multiple of 8 bytes (so the data section starts 8-aligned), then the tensors
// back to back in the given order. The bytes go to a temporary file in the
// same directory that is fsynced and renamed over `path`, so a crash leaves
// either the old file or the whole new one. InvalidArgument for a bad tensor
// list (empty or duplicate name, size mismatch); an errno-derived status for
// I/O failures.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Writes `tensors` in order to model-00001-of-0000N.safetensors, ... in
// `model_dir` (created if missing), starting a new shard when the next tensor
// would push the current one past `max_shard_bytes` (a larger tensor gets a
// shard to itself), then model.safetensors.index.json with
// "metadata": {"total_size": N} and "weight_map". The index is written last,
// so it never names a shard that is not complete.
absl::Status WriteShardedSafetensors(const std::string& model_dir,
                                     const std::vector<TensorToWrite>& tensors,
                                     uint64_t max_shard_bytes);

}  // namespace duet::engine

#endif  // DUET_ENGINE_SAFETENSORS_H_
