#include "placement/autoscale.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace duet::placement {

double Quantile(std::vector<double>& v, double q) {
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return v[k];
}

void SetLatencyQuantiles(LoadFigures& f, std::vector<double>& ttft, std::vector<double>& tpot) {
  f.ttft_p50 = ttft.empty() ? -1 : Quantile(ttft, 0.5);
  f.ttft_p90 = ttft.empty() ? -1 : Quantile(ttft, 0.9);
  f.tpot_p50 = tpot.empty() ? -1 : Quantile(tpot, 0.5);
  f.tpot_p90 = tpot.empty() ? -1 : Quantile(tpot, 0.9);
}

namespace {

using Json = nlohmann::json;

Json PoolToJson(const PoolFigures& p) {
  return Json{{"ready", p.ready},       {"starting", p.starting}, {"draining", p.draining},
              {"waiting", p.waiting},   {"running", p.running},   {"kv_used", p.kv_used},
              {"kv_capacity", p.kv_capacity}};
}

// Reads `name` into `out` when present; InvalidArgument for a wrong type.
template <typename T>
absl::Status Read(const Json& j, const char* name, T& out) {
  auto it = j.find(name);
  if (it == j.end()) return absl::OkStatus();
  try {
    out = it->get<T>();
  } catch (const Json::exception&) {
    return absl::InvalidArgumentError(absl::StrCat("figures: \"", name, "\" has the wrong type: ", it->dump()));
  }
  return absl::OkStatus();
}

absl::Status PoolFromJson(const Json& j, const char* name, PoolFigures& p) {
  auto it = j.find(name);
  if (it == j.end()) return absl::OkStatus();
  if (!it->is_object()) return absl::InvalidArgumentError(absl::StrCat("figures: \"", name, "\" is not an object"));
  for (absl::Status s : {Read(*it, "ready", p.ready), Read(*it, "starting", p.starting),
                         Read(*it, "draining", p.draining), Read(*it, "waiting", p.waiting),
                         Read(*it, "running", p.running), Read(*it, "kv_used", p.kv_used),
                         Read(*it, "kv_capacity", p.kv_capacity)}) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

Json FiguresToJson(const LoadFigures& f) {
  return Json{{"now", f.now},
              {"interval_s", f.interval_s},
              {"arrivals", f.arrivals},
              {"prompt_lens", f.prompt_lens},
              {"output_lens", f.output_lens},
              {"prompt_tokens", f.prompt_tokens},
              {"cached_tokens", f.cached_tokens},
              {"first_tokens", f.first_tokens},
              {"finished", f.finished},
              {"ttft_p50", f.ttft_p50},
              {"ttft_p90", f.ttft_p90},
              {"tpot_p50", f.tpot_p50},
              {"tpot_p90", f.tpot_p90},
              {"prefill", PoolToJson(f.prefill)},
              {"decode", PoolToJson(f.decode)}};
}

absl::StatusOr<LoadFigures> FiguresFromJson(const Json& j) {
  if (!j.is_object() || !j.contains("interval_s")) {
    return absl::InvalidArgumentError("figures: not an object with \"interval_s\"");
  }
  LoadFigures f;
  for (absl::Status s :
       {Read(j, "now", f.now), Read(j, "interval_s", f.interval_s), Read(j, "arrivals", f.arrivals),
        Read(j, "prompt_lens", f.prompt_lens), Read(j, "output_lens", f.output_lens),
        Read(j, "prompt_tokens", f.prompt_tokens), Read(j, "cached_tokens", f.cached_tokens),
        Read(j, "first_tokens", f.first_tokens), Read(j, "finished", f.finished), Read(j, "ttft_p50", f.ttft_p50),
        Read(j, "ttft_p90", f.ttft_p90), Read(j, "tpot_p50", f.tpot_p50), Read(j, "tpot_p90", f.tpot_p90),
        PoolFromJson(j, "prefill", f.prefill), PoolFromJson(j, "decode", f.decode)}) {
    if (!s.ok()) return s;
  }
  if (!(f.interval_s > 0)) return absl::InvalidArgumentError("figures: \"interval_s\" must be positive");
  return f;
}

}  // namespace duet::placement
