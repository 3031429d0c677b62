#include "placement/place.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace duet::placement {
namespace {

// A latency model whose prefill costs nothing: a decode instance measured alone.
class NoPrefill : public LatencyModel {
 public:
  explicit NoPrefill(LatencyModel& inner) : inner_(inner) {}
  double Prefill(const Parallel&, absl::Span<const int64_t>) override { return 0; }
  double Decode(const Parallel& p, absl::Span<const int64_t> c) override { return inner_.Decode(p, c); }
  bool Supports(const Parallel& p) const override { return inner_.Supports(p); }
  std::string Describe() const override { return inner_.Describe(); }

 private:
  LatencyModel& inner_;
};

double KvCapacity(const ModelSpec& m, const GpuSpec& g, const Parallel& p, double fraction) {
  return (fraction * g.memory_bytes * p.gpus() - static_cast<double>(m.WeightBytes())) /
         static_cast<double>(m.KvBytesPerToken());
}

InstanceSpec Instance(InstanceRole role, const Parallel& p, const ModelSpec& m, const GpuSpec& g,
                      const PlaceOptions& o) {
  InstanceSpec s;
  s.role = role;
  s.par = p;
  s.kv_capacity_tokens = KvCapacity(m, g, p, o.memory_fraction);
  s.max_batch_tokens = o.max_batch_tokens;
  return s;
}

}  // namespace

std::string Plan::Describe() const {
  auto role = [](const char* name, const RoleConfig& r) {
    return absl::StrCat(r.count, " x ", name, " (tp ", r.par.tp, ", pp ", r.par.pp, ")");
  };
  if (colocated) return role("colocated", prefill);
  return absl::StrCat(role("prefill", prefill), " + ", role("decode", decode));
}

ClusterSpec MakeCluster(const Plan& plan, const ModelSpec& model, const GpuSpec& gpu, const PlaceOptions& o) {
  ClusterSpec c;
  c.policy = o.policy;
  // High affinity: KV crosses nodes when instances are on different nodes;
  // low affinity pairs them in a node. A node's link is the optimistic case.
  c.kv_link_bytes_per_s = o.affinity == "low" || o.nodes == 1 ? gpu.intra_node_bw : gpu.inter_node_bw;
  if (plan.colocated) {
    for (int i = 0; i < plan.prefill.count; ++i) {
      c.instances.push_back(Instance(InstanceRole::kColocated, plan.prefill.par, model, gpu, o));
    }
    return c;
  }
  for (int i = 0; i < plan.prefill.count; ++i) {
    c.instances.push_back(Instance(InstanceRole::kPrefill, plan.prefill.par, model, gpu, o));
  }
  for (int i = 0; i < plan.decode.count; ++i) {
    c.instances.push_back(Instance(InstanceRole::kDecode, plan.decode.par, model, gpu, o));
  }
  return c;
}

std::string PlanToClusterJson(const Plan& plan, const ModelSpec& model, const GpuSpec& gpu, const PlaceOptions& o) {
  nlohmann::ordered_json j;
  j["model"] = model.name;
  j["kv_link_gbps"] = MakeCluster(plan, model, gpu, o).kv_link_bytes_per_s / 1e9;
  auto pool = [&](const RoleConfig& r) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (int i = 0; i < r.count; ++i) {
      list.push_back({{"tp", r.par.tp}, {"pp", r.par.pp}, {"device", "cuda"}, {"gpu", gpu.id},
                      {"max_batch_tokens", o.max_batch_tokens}});
    }
    return list;
  };
  if (plan.colocated) {
    j["colocated"] = pool(plan.prefill);
  } else {
    j["prefill"] = pool(plan.prefill);
    j["decode"] = pool(plan.decode);
  }
  return j.dump(2) + "\n";
}

absl::StatusOr<PlaceResult> Place(const ModelSpec& model, const GpuSpec& gpu, LatencyModel& latency,
                                  const std::vector<SimRequest>& workload, const PlaceOptions& o,
                                  LatencyModel* colocated_latency) {
  LatencyModel& coloc_lat = colocated_latency != nullptr ? *colocated_latency : latency;
  if (o.nodes < 1 || o.gpus_per_node < 1) return absl::InvalidArgumentError("nodes and GPUs per node must be >= 1");
  if (o.affinity != "high" && o.affinity != "low") return absl::InvalidArgumentError("affinity must be high or low");
  const int total = o.nodes * o.gpus_per_node;
  PlaceResult result;
  // Instance shapes the model fits on (with room for at least one context).
  std::vector<Parallel> shapes;
  for (int tp = 1; tp <= o.gpus_per_node; tp *= 2) {
    for (int pp = 1; pp <= o.max_pp && tp * pp <= total; ++pp) {
      const Parallel p{.tp = tp, .pp = pp};
      if (o.affinity == "low" && 2 * tp * pp > o.gpus_per_node && pp > 1) continue;
      if (!latency.Supports(p)) continue;
      if (KvCapacity(model, gpu, p, o.memory_fraction) < static_cast<double>(model.max_context)) continue;
      shapes.push_back(p);
    }
  }
  if (shapes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(model.name, " fits no instance shape of up to ", o.gpus_per_node,
                                                   " x ", gpu.name, " (and the latency model's TP degrees)"));
  }
  // Estimates rank candidates only: the first 2,000 requests, a coarser bisection.
  const std::vector<SimRequest> sample(workload.begin(),
                                       workload.begin() + static_cast<long>(std::min<size_t>(workload.size(), 2000)));
  auto goodput = [&](const Plan& p, LatencyModel& lat, const Slo& slo, double tol = 0.02, double hint = 0,
                     bool estimate = false) {
    ClusterSpec c = MakeCluster(p, model, gpu, o);
    Goodput g = FindGoodput(c, model, lat, estimate ? sample : workload, slo, o.target, tol, hint);
    result.simulations += g.simulations;
    return g;
  };
  const double inf = 1e18;
  // Per shape: one prefill instance against TTFT alone, one decode against TPOT alone.
  NoPrefill decode_only(latency);
  std::vector<double> gp(shapes.size()), gd(shapes.size());
  if (!o.exhaustive) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      Plan pre{.prefill = {shapes[i], 1}, .decode = {shapes[i], 0}};
      gp[i] = goodput(pre, latency, {.ttft = o.slo.ttft, .tpot = inf}, 0.05, 0, true).rate;
      Plan dec{.prefill = {shapes[i], 1}, .decode = {shapes[i], 1}};
      gd[i] = goodput(dec, decode_only, {.ttft = inf, .tpot = o.slo.tpot}, 0.05, 0, true).rate;
    }
  }
  // Disaggregated candidates.
  std::vector<Plan> plans;
  for (size_t a = 0; a < shapes.size(); ++a) {
    for (size_t b = 0; b < shapes.size(); ++b) {
      const int ga = shapes[a].gpus(), gb = shapes[b].gpus();
      for (int np = 1; np * ga + gb <= total; ++np) {
        for (int nd = 1; np * ga + nd * gb <= total; ++nd) {
          if (o.affinity == "low") {
            // Pairs inside a node: prefill and decode stages share nodes.
            if (ga + gb > o.gpus_per_node && np != nd) continue;
          }
          Plan p{.prefill = {shapes[a], np}, .decode = {shapes[b], nd}};
          p.gpus = np * ga + nd * gb;
          p.estimate = o.exhaustive ? 0 : std::min(np * gp[a], nd * gd[b]);
          plans.push_back(p);
        }
      }
    }
  }
  result.candidates = static_cast<int>(plans.size());
  std::sort(plans.begin(), plans.end(), [](const Plan& x, const Plan& y) {
    const double ex = x.estimate / x.gpus, ey = y.estimate / y.gpus;
    return ex != ey ? ex > ey : x.gpus < y.gpus;
  });
  // Small searches simulate every candidate whole.
  const bool all = o.exhaustive || plans.size() <= 64;
  const size_t verify = all ? plans.size() : std::min<size_t>(plans.size(), static_cast<size_t>(o.verify));
  for (size_t i = 0; i < verify; ++i) {
    plans[i].cluster = MakeCluster(plans[i], model, gpu, o);
    plans[i].goodput = goodput(plans[i], latency, o.slo, 0.02, plans[i].estimate);
  }
  std::stable_sort(plans.begin(), plans.begin() + static_cast<long>(verify),
                   [](const Plan& x, const Plan& y) { return x.goodput.per_gpu > y.goodput.per_gpu; });
  result.disaggregated = std::move(plans);
  // Colocated: per shape, one instance (instances scale out by count).
  for (const Parallel& s : shapes) {
    if (!coloc_lat.Supports(s)) continue;
    Plan p{.colocated = true, .prefill = {s, 1}};
    p.gpus = s.gpus();
    p.cluster = MakeCluster(p, model, gpu, o);
    // Coarse on the sample, then refined on the whole workload from there.
    const double coarse = goodput(p, coloc_lat, o.slo, 0.05, 0, true).rate;
    if (coarse > 0) p.goodput = goodput(p, coloc_lat, o.slo, 0.02, coarse);
    // As many as the cluster holds.
    p.prefill.count = total / s.gpus();
    p.goodput.rate *= p.prefill.count;
    p.gpus = p.prefill.count * s.gpus();
    p.cluster = MakeCluster(p, model, gpu, o);
    result.colocated.push_back(p);
  }
  std::sort(result.colocated.begin(), result.colocated.end(),
            [](const Plan& x, const Plan& y) { return x.goodput.per_gpu > y.goodput.per_gpu; });
  return result;
}

}  // namespace duet::placement
