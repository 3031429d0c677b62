#include "placement/place.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace duet::placement {
double KvCapacity(const ModelSpec& m, const GpuSpec& g, const Parallel& p, double fraction) {
  return (fraction * g.memory_bytes * p.gpus() - static_cast<double>(m.WeightBytes())) /
         static_cast<double>(m.KvBytesPerToken());
}

namespace {

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

namespace {

struct Pool {
  const GpuSpec* gpu;
  LatencyModel* latency;
  int nodes, gpus_per_node;
  int total() const { return nodes * gpus_per_node; }
};

std::vector<Pool> Pools(const GpuSpec& gpu, LatencyModel& latency, const PlaceOptions& o) {
  std::vector<Pool> pools = {{&gpu, &latency, o.nodes, o.gpus_per_node}};
  if (o.second_gpu != nullptr) {
    pools.push_back({o.second_gpu, o.second_latency != nullptr ? o.second_latency : &latency, o.second_nodes,
                     o.second_gpus_per_node});
  }
  return pools;
}

// The model an instance of precision `prec` holds, and the latency model
// that times it in `pool` (nullptr: the cluster's default).
const ModelSpec& ModelOf(const PlaceOptions& o, const ModelSpec& model, int prec) {
  return prec >= 0 ? o.precisions[static_cast<size_t>(prec)].model : model;
}
LatencyModel* LatencyOf(const PlaceOptions& o, int pool, int prec) {
  if (prec >= 0) return o.precisions[static_cast<size_t>(prec)].latency[static_cast<size_t>(pool)];
  return pool == 1 ? o.second_latency : nullptr;
}

// An instance shape of a pool: its parallelism and its weights' precision.
struct Shape {
  Parallel par;
  int prec = -1;
};

}  // namespace

std::string Plan::Describe() const {
  auto role = [this](const char* name, const RoleConfig& r, int pool, const std::string& dtype) {
    return absl::StrCat(r.count, " x ", name, " (tp ", r.par.tp, ", pp ", r.par.pp, dtype.empty() ? "" : ", ", dtype,
                        ")", prefill_pool != decode_pool || pool > 0 ? absl::StrCat(" on pool ", pool + 1) : "");
  };
  if (colocated) return role("colocated", prefill, prefill_pool, prefill_dtype);
  return absl::StrCat(role("prefill", prefill, prefill_pool, prefill_dtype), " + ",
                      role("decode", decode, decode_pool, decode_dtype));
}

ClusterSpec MakeCluster(const Plan& plan, const ModelSpec& model, const GpuSpec& gpu, const PlaceOptions& o) {
  auto gpu_of = [&](int pool) -> const GpuSpec& { return pool == 1 && o.second_gpu != nullptr ? *o.second_gpu : gpu; };
  ClusterSpec c;
  c.policy = o.policy;
  const GpuSpec& pg = gpu_of(plan.prefill_pool);
  const GpuSpec& dg = gpu_of(plan.decode_pool);
  // High affinity: KV crosses nodes when instances are on different nodes;
  // low affinity pairs them in a node. A node's link is the optimistic case;
  // across pools, the slower network of the two.
  if (plan.prefill_pool != plan.decode_pool) {
    c.kv_link_bytes_per_s = std::min(pg.inter_node_bw, dg.inter_node_bw);
  } else {
    const int nodes = plan.prefill_pool == 1 ? o.second_nodes : o.nodes;
    c.kv_link_bytes_per_s = o.affinity == "low" || nodes == 1 ? pg.intra_node_bw : pg.inter_node_bw;
  }
  auto add = [&](InstanceRole role, const RoleConfig& r, int pool, int prec) {
    for (int i = 0; i < r.count; ++i) {
      InstanceSpec s = Instance(role, r.par, ModelOf(o, model, prec), gpu_of(pool), o);
      s.latency = LatencyOf(o, pool, prec);
      c.instances.push_back(s);
    }
  };
  if (plan.colocated) {
    add(InstanceRole::kColocated, plan.prefill, plan.prefill_pool, plan.prefill_precision);
    return c;
  }
  add(InstanceRole::kPrefill, plan.prefill, plan.prefill_pool, plan.prefill_precision);
  add(InstanceRole::kDecode, plan.decode, plan.decode_pool, plan.decode_precision);
  return c;
}

std::string PlanToClusterJson(const Plan& plan, const ModelSpec& model, const GpuSpec& gpu, const PlaceOptions& o) {
  auto gpu_of = [&](int pool) -> const GpuSpec& { return pool == 1 && o.second_gpu != nullptr ? *o.second_gpu : gpu; };
  nlohmann::ordered_json j;
  j["model"] = model.name;
  j["kv_link_gbps"] = MakeCluster(plan, model, gpu, o).kv_link_bytes_per_s / 1e9;
  auto pool = [&](const RoleConfig& r, int p, const std::string& dtype) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (int i = 0; i < r.count; ++i) {
      nlohmann::ordered_json one = {{"tp", r.par.tp}, {"pp", r.par.pp}, {"device", "cuda"}, {"gpu", gpu_of(p).id},
                                    {"max_batch_tokens", o.max_batch_tokens}};
      if (!dtype.empty()) one["weight_dtype"] = dtype;
      list.push_back(one);
    }
    return list;
  };
  if (plan.colocated) {
    j["colocated"] = pool(plan.prefill, plan.prefill_pool, plan.prefill_dtype);
  } else {
    j["prefill"] = pool(plan.prefill, plan.prefill_pool, plan.prefill_dtype);
    j["decode"] = pool(plan.decode, plan.decode_pool, plan.decode_dtype);
  }
  return j.dump(2) + "\n";
}

namespace {
// Pipeline stages cost hand-offs, more processes and more memory for the
// same weights: a plan with PP leads only if its goodput per GPU beats every
// simulated PP-free plan's by kPipelineMargin; else the best PP-free plan
// moves to the front. plans[0, n) are ranked by simulated goodput.
constexpr double kPipelineMargin = 1.05;
void PreferPipelineFree(std::vector<Plan>& plans, size_t n) {
  auto uses_pp = [](const Plan& p) { return p.prefill.par.pp > 1 || (!p.colocated && p.decode.par.pp > 1); };
  if (n == 0 || !uses_pp(plans[0])) return;
  for (size_t i = 1; i < n; ++i) {
    if (uses_pp(plans[i])) continue;
    if (plans[0].goodput.per_gpu < kPipelineMargin * plans[i].goodput.per_gpu) {
      std::rotate(plans.begin(), plans.begin() + static_cast<long>(i), plans.begin() + static_cast<long>(i) + 1);
    }
    return;  // the first PP-free plan is the best one
  }
}
}  // namespace

absl::StatusOr<PlaceResult> Place(const ModelSpec& model, const GpuSpec& gpu, LatencyModel& latency,
                                  const std::vector<SimRequest>& workload, const PlaceOptions& o,
                                  LatencyModel* colocated_latency) {
  if (o.nodes < 1 || o.gpus_per_node < 1) return absl::InvalidArgumentError("nodes and GPUs per node must be >= 1");
  if (o.affinity != "high" && o.affinity != "low") return absl::InvalidArgumentError("affinity must be high or low");
  if (o.second_gpu != nullptr && (o.second_nodes < 1 || o.second_gpus_per_node < 1)) {
    return absl::InvalidArgumentError("the second pool needs nodes and GPUs per node >= 1");
  }
  const std::vector<Pool> pools = Pools(gpu, latency, o);
  // The precisions a role may take: those within the quality bound (-1
  // alone: the model as given).
  std::vector<int> precs;
  for (size_t i = 0; i < o.precisions.size(); ++i) {
    if (o.precisions[i].latency.size() < pools.size()) {
      return absl::InvalidArgumentError(absl::StrCat("precision ", o.precisions[i].dtype, " has no latency model for "
                                                     "every pool"));
    }
    if (o.precisions[i].sensitivity <= o.max_sensitivity) precs.push_back(static_cast<int>(i));
  }
  if (o.precisions.empty()) precs = {-1};
  if (precs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no precision is within the sensitivity bound ", o.max_sensitivity));
  }
  // The latency model of a shape in pool k.
  auto lat = [&](size_t k, int prec) -> LatencyModel& {
    LatencyModel* l = LatencyOf(o, static_cast<int>(k), prec);
    return l != nullptr ? *l : *pools[k].latency;
  };
  auto dtype = [&](int prec) { return prec >= 0 ? o.precisions[static_cast<size_t>(prec)].dtype : std::string(); };
  auto sensitivity = [&](int prec) { return prec >= 0 ? o.precisions[static_cast<size_t>(prec)].sensitivity : 0.0; };
  PlaceResult result;
  // Per pool, the instance shapes the model fits on at each precision (room
  // for one context).
  std::vector<std::vector<Shape>> shapes(pools.size());
  for (size_t k = 0; k < pools.size(); ++k) {
    const Pool& pl = pools[k];
    for (int prec : precs) {
      for (int tp = 1; tp <= pl.gpus_per_node; tp *= 2) {
        for (int pp = 1; pp <= o.max_pp && tp * pp <= pl.total(); ++pp) {
          const Parallel p{.tp = tp, .pp = pp};
          if (o.affinity == "low" && 2 * tp * pp > pl.gpus_per_node && pp > 1) continue;
          if (!lat(k, prec).Supports(p)) continue;
          if (KvCapacity(ModelOf(o, model, prec), *pl.gpu, p, o.memory_fraction) <
              static_cast<double>(model.max_context)) {
            continue;
          }
          shapes[k].push_back({p, prec});
        }
      }
    }
  }
  if (shapes[0].empty() && (shapes.size() < 2 || shapes[1].empty())) {
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
  // Per pool and shape: one prefill instance against TTFT alone, one decode
  // against TPOT alone (the second pool's instances, and each precision's,
  // carry their own model).
  std::vector<std::vector<double>> gp(pools.size()), gd(pools.size());
  for (size_t k = 0; k < pools.size(); ++k) {
    gp[k].assign(shapes[k].size(), 0);
    gd[k].assign(shapes[k].size(), 0);
    if (o.exhaustive) continue;
    for (size_t i = 0; i < shapes[k].size(); ++i) {
      const int pk = static_cast<int>(k), prec = shapes[k][i].prec;
      const Parallel& par = shapes[k][i].par;
      Plan pre{.prefill = {par, 1}, .decode = {par, 0}, .prefill_pool = pk, .decode_pool = pk,
               .prefill_precision = prec, .decode_precision = prec};
      gp[k][i] = goodput(pre, lat(k, prec), {.ttft = o.slo.ttft, .tpot = inf}, 0.05, 0, true).rate;
      // The decode-only model through the pool's latency: a cluster of one
      // instant prefill and this decode, timed by DecodeOnlyLatency.
      DecodeOnlyLatency decode_only(lat(k, prec));
      Plan dec{.prefill = {par, 1}, .decode = {par, 1}, .prefill_precision = prec, .decode_precision = prec};
      ClusterSpec c = MakeCluster(dec, model, *pools[k].gpu, o);
      for (InstanceSpec& s : c.instances) s.latency = nullptr;
      Goodput g = FindGoodput(c, model, decode_only, sample, {.ttft = inf, .tpot = o.slo.tpot}, o.target, 0.05);
      result.simulations += g.simulations;
      gd[k][i] = g.rate;
    }
  }
  // Disaggregated candidates: prefill from pool a, decode from pool b.
  std::vector<Plan> plans;
  for (size_t pa = 0; pa < pools.size(); ++pa) {
    for (size_t pb = 0; pb < pools.size(); ++pb) {
      for (size_t a = 0; a < shapes[pa].size(); ++a) {
        for (size_t b = 0; b < shapes[pb].size(); ++b) {
          const int ga = shapes[pa][a].par.gpus(), gb = shapes[pb][b].par.gpus();
          const bool same = pa == pb;
          const int budget_a = pools[pa].total(), budget_b = pools[pb].total();
          for (int np = 1; np * ga + (same ? gb : 0) <= budget_a; ++np) {
            for (int nd = 1; same ? np * ga + nd * gb <= budget_a : nd * gb <= budget_b; ++nd) {
              if (o.affinity == "low" && same && ga + gb > pools[pa].gpus_per_node && np != nd) continue;
              const int qa = shapes[pa][a].prec, qb = shapes[pb][b].prec;
              Plan p{.prefill = {shapes[pa][a].par, np},
                     .decode = {shapes[pb][b].par, nd},
                     .prefill_pool = static_cast<int>(pa),
                     .decode_pool = static_cast<int>(pb),
                     .prefill_precision = qa,
                     .decode_precision = qb,
                     .prefill_dtype = dtype(qa),
                     .decode_dtype = dtype(qb),
                     .sensitivity = std::max(sensitivity(qa), sensitivity(qb))};
              p.gpus = np * ga + nd * gb;
              p.estimate = o.exhaustive ? 0 : std::min(np * gp[pa][a], nd * gd[pb][b]);
              plans.push_back(p);
            }
          }
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
  // Equal goodput (a role that is not the bottleneck): the lower sensitivity.
  std::stable_sort(plans.begin(), plans.begin() + static_cast<long>(verify), [](const Plan& x, const Plan& y) {
    return x.goodput.per_gpu != y.goodput.per_gpu ? x.goodput.per_gpu > y.goodput.per_gpu
                                                  : x.sensitivity < y.sensitivity;
  });
  PreferPipelineFree(plans, verify);
  result.disaggregated = std::move(plans);
  // Colocated: per pool and shape, as many instances as the pool holds.
  // Each shape is estimated from one instance on the sample (times the
  // count); the best kColocatedVerify are then simulated whole, the pool's
  // instances together on the whole workload (instances behind one router
  // serve more than count times one alone: their queues pool), by the same
  // bisection `duet sim --goodput` runs.
  constexpr size_t kColocatedVerify = 3;
  struct Timed {
    Plan plan;
    LatencyModel* lat;
  };
  std::vector<Timed> coloc;
  auto timed = [&](const Plan& plan, LatencyModel& lat, double tol, bool estimate) {
    ClusterSpec c = MakeCluster(plan, model, gpu, o);
    for (InstanceSpec& is : c.instances) is.latency = nullptr;  // timed by the colocated model
    Goodput g = FindGoodput(c, model, lat, estimate ? sample : workload, o.slo, o.target, tol);
    result.simulations += g.simulations;
    return g;
  };
  for (size_t k = 0; k < pools.size(); ++k) {
    for (const Shape& shape : shapes[k]) {
      const Parallel& s = shape.par;
      // A precision's own model times it; else --colocated-latency for the first pool.
      LatencyModel& cl = k == 0 && colocated_latency != nullptr && shape.prec < 0 ? *colocated_latency
                                                                                 : lat(k, shape.prec);
      if (!cl.Supports(s)) continue;
      const int pk = static_cast<int>(k);
      Plan p{.colocated = true, .prefill = {s, 1}, .prefill_pool = pk, .decode_pool = pk,
             .prefill_precision = shape.prec, .prefill_dtype = dtype(shape.prec),
             .sensitivity = sensitivity(shape.prec)};
      p.gpus = s.gpus();
      const double one = timed(p, cl, 0.05, true).rate;
      p.prefill.count = pools[k].total() / s.gpus();
      p.gpus = p.prefill.count * s.gpus();
      p.estimate = one * p.prefill.count;
      p.goodput = Goodput{.rate = p.estimate, .per_gpu = p.estimate / p.gpus};
      coloc.push_back({p, &cl});
    }
  }
  std::sort(coloc.begin(), coloc.end(), [](const Timed& x, const Timed& y) {
    return x.plan.goodput.per_gpu > y.plan.goodput.per_gpu;
  });
  for (size_t i = 0; i < coloc.size() && i < kColocatedVerify; ++i) {
    coloc[i].plan.goodput = timed(coloc[i].plan, *coloc[i].lat, 0.01, false);
  }
  for (Timed& t : coloc) {
    t.plan.cluster = MakeCluster(t.plan, model, gpu, o);
    result.colocated.push_back(std::move(t.plan));
  }
  const size_t verified = std::min(result.colocated.size(), kColocatedVerify);
  std::stable_sort(result.colocated.begin(), result.colocated.begin() + static_cast<long>(verified),
                   [](const Plan& x, const Plan& y) {
                     return x.goodput.per_gpu != y.goodput.per_gpu ? x.goodput.per_gpu > y.goodput.per_gpu
                                                                   : x.sensitivity < y.sensitivity;
                   });
  PreferPipelineFree(result.colocated, verified);
  return result;
}

}  // namespace duet::placement
