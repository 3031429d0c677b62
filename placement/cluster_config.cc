#include "placement/cluster_config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "dispatch/dispatch.h"
#include "kernels/dtype.h"

namespace duet::placement {

using nlohmann::json;

namespace {

absl::Status Bad(const std::string& source, const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", where, " ", what));
}

absl::Status CheckKeys(const json& j, const std::set<std::string>& allowed, const std::string& source,
                       const std::string& where) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!allowed.count(it.key())) return Bad(source, where, absl::StrCat("has an unknown field \"", it.key(), "\""));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ClusterConfig> ParseClusterConfig(const std::string& text, const std::string& source,
                                                 bool for_simulation) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  if (auto s = CheckKeys(j, {"model", "served_model_name", "router", "prefill", "decode", "colocated", "kv_link_gbps"},
                         source, "the file");
      !s.ok()) {
    return s;
  }
  ClusterConfig c;
  if (j.contains("kv_link_gbps")) {
    if (!j["kv_link_gbps"].is_number() || !(j["kv_link_gbps"].get<double>() > 0)) {
      return Bad(source, "\"kv_link_gbps\"", "must be a positive number");
    }
    c.kv_link_gbps = j["kv_link_gbps"];
  }
  if (j.contains("model")) {
    if (!j["model"].is_string()) return Bad(source, "\"model\"", "must be a string");
    c.model = j["model"];
  }
  if (j.contains("served_model_name")) {
    if (!j["served_model_name"].is_string()) return Bad(source, "\"served_model_name\"", "must be a string");
    c.served_model_name = j["served_model_name"];
  }
  if (j.contains("router")) {
    const json& r = j["router"];
    if (!r.is_object()) return Bad(source, "\"router\"", "must be an object");
    if (auto s = CheckKeys(r, {"port", "policy"}, source, "\"router\""); !s.ok()) return s;
    if (r.contains("port")) {
      if (!r["port"].is_number_integer() || r["port"] < 0 || r["port"] > 65535) return Bad(source, "router.port", "must be 0..65535");
      c.router_port = r["port"];
    }
    if (r.contains("policy")) {
      if (!r["policy"].is_string() || !dispatch::ParseDispatchPolicy(r["policy"].get<std::string>()).ok()) {
        return Bad(source, "router.policy", "must be \"least_loaded\", \"round_robin\" or \"cache_aware\"");
      }
      c.policy = r["policy"];
    }
  }
  for (const char* pool : {"prefill", "decode", "colocated"}) {
    if (!j.contains(pool)) continue;
    if (!j[pool].is_array()) return Bad(source, absl::StrCat("\"", pool, "\""), "must be a list of instances");
    int i = 0;
    for (const json& inst : j[pool]) {
      const std::string where = absl::StrCat(pool, "[", i++, "]");
      if (!inst.is_object()) return Bad(source, where, "must be an object");
      if (auto s = CheckKeys(inst, {"tp", "pp", "device", "kv_memory_gib", "kv_blocks", "threads", "cpus",
                                    "max_batch_tokens", "gpu", "weight_dtype", "kv_dtype", "precision_map"},
                             source, where);
          !s.ok()) {
        return s;
      }
      InstanceConfig ic;
      ic.role = pool;
      auto get_int = [&](const char* k, int64_t min, int64_t& out) -> absl::Status {
        if (!inst.contains(k)) return absl::OkStatus();
        if (!inst[k].is_number_integer() || inst[k].get<int64_t>() < min) {
          return Bad(source, absl::StrCat(where, ".", k), absl::StrCat("must be an integer >= ", min));
        }
        out = inst[k];
        return absl::OkStatus();
      };
      int64_t tp = 1, pp = 1, threads = 0;
      if (auto s = get_int("tp", 1, tp); !s.ok()) return s;
      if (auto s = get_int("pp", 1, pp); !s.ok()) return s;
      if (auto s = get_int("threads", 0, threads); !s.ok()) return s;
      if (auto s = get_int("kv_blocks", 0, ic.kv_blocks); !s.ok()) return s;
      if (auto s = get_int("max_batch_tokens", 1, ic.max_batch_tokens); !s.ok()) return s;
      ic.tp = static_cast<int>(tp);
      ic.pp = static_cast<int>(pp);
      ic.threads = static_cast<int>(threads);
      if (inst.contains("device")) {
        if (!inst["device"].is_string()) return Bad(source, where + ".device", "must be a string");
        ic.device = inst["device"];
      }
      if (inst.contains("kv_memory_gib")) {
        if (!inst["kv_memory_gib"].is_number() || !(inst["kv_memory_gib"].get<double>() > 0)) {
          return Bad(source, where + ".kv_memory_gib", "must be a positive number");
        }
        ic.kv_memory_gib = inst["kv_memory_gib"];
      }
      if (inst.contains("cpus")) {
        if (!inst["cpus"].is_array()) return Bad(source, where + ".cpus", "must be a list of core numbers");
        for (const json& cpu : inst["cpus"]) {
          if (!cpu.is_number_integer() || cpu < 0) return Bad(source, where + ".cpus", "must hold core numbers >= 0");
          ic.cpus.push_back(cpu);
        }
      }
      for (auto [key, field] : {std::pair<const char*, std::string*>{"gpu", &ic.gpu},
                                {"weight_dtype", &ic.weight_dtype},
                                {"kv_dtype", &ic.kv_dtype},
                                {"precision_map", &ic.precision_map}}) {
        if (!inst.contains(key)) continue;
        if (!inst[key].is_string()) return Bad(source, absl::StrCat(where, ".", key), "must be a string");
        *field = inst[key];
      }
      if (!ic.weight_dtype.empty() && !kernels::ParseDType(ic.weight_dtype)) {
        return Bad(source, where + ".weight_dtype", absl::StrCat("is \"", ic.weight_dtype, "\", not a weight dtype"));
      }
      if (for_simulation) {
        c.instances.push_back(ic);
        continue;
      }
      if (ic.device != "cpu") {
        return Bad(source, where + ".device",
                   absl::StrCat("is \"", ic.device, "\": this build serves on the CPU backend only"));
      }
      c.instances.push_back(ic);
    }
  }
  if (c.instances.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": no workers (prefill, decode or colocated)"));
  return c;
}

absl::StatusOr<ClusterConfig> LoadClusterConfig(const std::string& path, bool for_simulation) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseClusterConfig(ss.str(), path, for_simulation);
}

}  // namespace duet::placement
