#include "engine/precision_map.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace duet::engine {
namespace {

absl::StatusOr<kernels::DType> DTypeAt(const nlohmann::json& v, const std::string& where) {
  if (!v.is_string()) return absl::InvalidArgumentError(absl::StrCat(where, " is not a dtype name: ", v.dump()));
  const std::string name = v.get<std::string>();
  std::optional<kernels::DType> d = kernels::ParseDType(name);
  if (!d) {
    std::string names;
    for (kernels::DType k : kernels::kAllDTypes) absl::StrAppend(&names, names.empty() ? "" : ", ", kernels::DTypeName(k));
    return absl::InvalidArgumentError(absl::StrCat(where, " is \"", name, "\", not one of ", names));
  }
  return *d;
}

}  // namespace

absl::StatusOr<PrecisionMap> ParsePrecisionMap(const std::string& json_text, const std::string& source) {
  const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  PrecisionMap map;
  map.source = source;
  for (const auto& [key, value] : j.items()) {
    if (key == "layers" || key == "experts") {
      if (!value.is_array() || value.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": \"", key, "\" must be a non-empty array of dtypes"));
      }
      for (size_t i = 0; i < value.size(); ++i) {
        absl::StatusOr<kernels::DType> d = DTypeAt(value[i], absl::StrCat(source, ": ", key, "[", i, "]"));
        if (!d.ok()) return d.status();
        (key == "layers" ? map.layers : map.experts).push_back(*d);
      }
    } else if (key == "embedding" || key == "lm_head") {
      absl::StatusOr<kernels::DType> d = DTypeAt(value, absl::StrCat(source, ": \"", key, "\""));
      if (!d.ok()) return d.status();
      (key == "embedding" ? map.embedding : map.lm_head) = *d;
    } else if (key != "plan") {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": unknown key \"", key, "\" (a precision map has layers, experts, embedding, lm_head, plan)"));
    }
  }
  if (map.layers.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": no \"layers\""));
  if (!map.experts.empty() && map.experts.size() != map.layers.size()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": \"experts\" has ", map.experts.size(),
                                                   " entries and \"layers\" ", map.layers.size(), "; one per layer"));
  }
  return map;
}

absl::StatusOr<PrecisionMap> ReadPrecisionMap(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("precision map ", path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  return ParsePrecisionMap(text.str(), path);
}

std::string PrecisionMapJson(const PrecisionMap& map, const std::string& plan) {
  nlohmann::ordered_json j;
  j["layers"] = nlohmann::ordered_json::array();
  for (kernels::DType d : map.layers) j["layers"].push_back(kernels::DTypeName(d));
  if (!map.experts.empty()) {
    j["experts"] = nlohmann::ordered_json::array();
    for (kernels::DType d : map.experts) j["experts"].push_back(kernels::DTypeName(d));
  }
  if (map.embedding) j["embedding"] = kernels::DTypeName(*map.embedding);
  if (map.lm_head) j["lm_head"] = kernels::DTypeName(*map.lm_head);
  if (!plan.empty()) j["plan"] = nlohmann::ordered_json::parse(plan);
  return j.dump(2) + "\n";
}

}  // namespace duet::engine
