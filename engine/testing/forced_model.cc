#include "engine/testing/forced_model.h"

#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "engine/safetensors.h"
#include "kernels/dtype.h"

namespace duet::testing {

absl::StatusOr<std::string> WriteForcedModel(const std::string& src, const std::string& dst,
                                             const std::map<int32_t, int32_t>& next) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dst, ec);
  for (const auto& e : fs::directory_iterator(src)) {
    if (e.path().filename() == "model.safetensors") continue;
    fs::copy(e.path(), fs::path(dst) / e.path().filename(), fs::copy_options::overwrite_existing, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot copy ", e.path().string(), ": ", ec.message()));
  }
  ASSIGN_OR_RETURN(auto in, engine::SafetensorsModel::Open(src));
  if (in->Find("lm_head.weight") == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(src, ": a tied LM head cannot be forced apart from the embedding"));
  }
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<engine::TensorToWrite> out;
  const std::vector<std::string> names = in->Names();
  bytes.reserve(names.size());
  for (const std::string& name : names) {
    const engine::TensorView* t = in->Find(name);
    if (t->dtype != engine::DType::kBF16) {
      return absl::InvalidArgumentError(absl::StrCat(src, ": tensor ", name, " is not BF16"));
    }
    std::vector<uint8_t>& b = bytes.emplace_back(t->data, t->data + t->num_bytes);
    auto set = [&](int64_t i, float v) {
      const uint16_t h = kernels::FloatToBf16(v);
      std::memcpy(b.data() + 2 * i, &h, 2);
    };
    const bool zeroed = name.find("o_proj") != std::string::npos || name.find("down_proj") != std::string::npos;
    if (zeroed || name == "lm_head.weight") std::fill(b.begin(), b.end(), 0);
    if (name == "model.norm.weight") {
      for (int64_t i = 0; i < t->NumElements(); ++i) set(i, 1.0f);
    }
    if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
      const int64_t hidden = t->shape[1];
      if (static_cast<int64_t>(next.size()) > hidden) {
        return absl::InvalidArgumentError(absl::StrCat("a forced model of hidden size ", hidden, " holds at most ",
                                                       hidden, " successors, not ", next.size()));
      }
      int64_t dim = 0;
      for (const auto& [from, to] : next) {
        const int64_t row = name == "lm_head.weight" ? to : from;
        if (name == "model.embed_tokens.weight") {
          for (int64_t j = 0; j < hidden; ++j) set(row * hidden + j, 0.0f);
        }
        set(row * hidden + dim, 1.0f);
        ++dim;
      }
    }
    out.push_back({.name = name, .dtype = t->dtype, .shape = t->shape, .data = b.data(), .num_bytes = b.size()});
  }
  RETURN_IF_ERROR(engine::WriteSafetensors((fs::path(dst) / "model.safetensors").string(), out));
  return dst;
}

}  // namespace duet::testing
