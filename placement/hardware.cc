#include "placement/hardware.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace duet::placement {

// Generated from placement/hardware/*.json: {id, file text}.
extern const std::vector<std::pair<std::string, std::string>>& BuiltinGpuFiles();

namespace {

absl::StatusOr<GpuSpec> Parse(const std::string& id, const std::string& text, const std::string& where) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, " is not a JSON object"));
  GpuSpec g;
  g.id = id;
  g.name = j.value("name", id);
  g.source = j.value("source", "");
  for (auto [key, out, scale] : {std::tuple<const char*, double*, double>{"bf16_tflops", &g.flops, 1e12},
                                 {"memory_gbps", &g.memory_bw, 1e9},
                                 {"memory_gib", &g.memory_bytes, 1073741824.0},
                                 {"intra_node_gbps", &g.intra_node_bw, 1e9},
                                 {"inter_node_gbps", &g.inter_node_bw, 1e9}}) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number() || it->get<double>() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": \"", key, "\" must be a positive number"));
    }
    *out = it->get<double>() * scale;
  }
  g.sms = j.value("sms", 0);
  return g;
}

}  // namespace

std::vector<std::string> GpuIds() {
  std::vector<std::string> ids;
  for (const auto& [id, text] : BuiltinGpuFiles()) ids.push_back(id);
  return ids;
}

absl::StatusOr<GpuSpec> LoadGpu(const std::string& id_or_path) {
  for (const auto& [id, text] : BuiltinGpuFiles()) {
    if (id == id_or_path) return Parse(id, text, absl::StrCat("placement/hardware/", id, ".json"));
  }
  if (std::filesystem::exists(id_or_path)) {
    std::ifstream in(id_or_path);
    std::stringstream ss;
    ss << in.rdbuf();
    return Parse(std::filesystem::path(id_or_path).stem().string(), ss.str(), id_or_path);
  }
  return absl::NotFoundError(absl::StrCat("unknown GPU '", id_or_path, "'; built in: ", absl::StrJoin(GpuIds(), ", "),
                                          " (or a JSON file)"));
}

double KernelSeconds(const GpuSpec& g, const KernelCost& k, const RooflineEfficiency& e) {
  const double compute = k.flops / (g.flops * e.compute);
  const double memory = k.bytes / (g.memory_bw * e.memory);
  return (e.overlap ? std::max(compute, memory) : compute + memory) + e.fixed_s;
}

double AllReduceSeconds(const GpuSpec& g, int n, double bytes, double latency_s, double link_efficiency) {
  if (n < 2) return 0;
  return latency_s + 2.0 * (n - 1) / n * bytes / (g.intra_node_bw * link_efficiency);
}

}  // namespace duet::placement
