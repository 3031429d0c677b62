// The SLA planner on a 64-GPU fleet over a simulated day, beside the best
// fixed plan sized for the peak and a queue-threshold autoscaler:
//
//   bazel run -c opt //tools/bench:autoscale_fleet [-- --svg PATH --hours H]
//
// OPT-13B on A100-80GB timed by DistServe's fit (and DistServe's per-batch
// costs), SLO TTFT 0.2 s and TPOT 0.1 s (DistServe's example), every
// instance DistServe's plan's shape (prefill and decode TP 2). Lengths from
// the Splitwise conversation trace (placement/testdata/splitwise_conv.csv,
// the shared data's file), overlong prompts truncated to OPT's 2,048
// tokens. The peak rate is what the best 64-GPU split of 32 instances
// serves at 90% attainment on Poisson arrivals. The day: Poisson arrivals
// whose rate follows placement::DiurnalRate (trough 30% of the peak) with
// four 2x bursts of 5 minutes, seed 1.
//   - fixed: the best split of 32 instances, each simulated over the day;
//   - planner: `duet sim --autoscale`'s SLA planner (placement/planner.h),
//     interval 30 s, burst checks every 5 s, a started instance serving
//     60 s after the decision, within 64 GPUs; a fleet's settings, a
//     target of 0.98 per pool and decode utilization up to 0.95 (the
//     defaults, 0.995 and 0.85, keep small clusters safe; --target and
//     --decode-utilization set them);
//   - queue threshold: HPA's formula on queued prompts per prefill instance
//     and requests per decode instance, its bounds swept, attainment
//     interpolated to the planner's GPU-hours.
// Prints attainment and GPU-hours of each, the ratios the issue asks for
// (attainment within 2 pp of fixed at <= 70% of its GPU-hours, above the
// queue autoscaler at equal GPU-hours), and writes the day's replicas and
// load as an SVG.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/flags.h"
#include "placement/hardware.h"
#include "placement/latency.h"
#include "placement/model.h"
#include "placement/place.h"
#include "placement/planner.h"
#include "placement/sim.h"
#include "placement/workload.h"

namespace duet::placement {
namespace {

constexpr int kInstances = 32;  // 64 GPUs at TP 2
const Slo kSlo{.ttft = 0.2, .tpot = 0.1};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Setup {
  ModelSpec model;
  std::unique_ptr<LatencyModel> latency;
  InstanceSpec prefill, decode;
  ClusterSpec base;  // link, policy; no instances
};

ClusterSpec Fixed(const Setup& s, int prefill, int decode) {
  ClusterSpec c = s.base;
  c.instances.assign(static_cast<size_t>(prefill), s.prefill);
  c.instances.insert(c.instances.end(), static_cast<size_t>(decode), s.decode);
  return c;
}

struct Outcome {
  std::string name;
  double attainment = 0;
  double gpu_hours = 0;
  double wall = 0;
  SimResult result;
};

std::string Svg(const std::vector<FleetSample>& t, const WorkloadOptions& day, int fixed_p, int fixed_d) {
  const double w = 900, h = 420, l = 60, r = 60, top = 30, b = 50;
  const double hours = day.duration_s / 3600;
  double peak = 0;
  for (double x = 0; x < day.duration_s; x += 60) peak = std::max(peak, DiurnalRate(day, x));
  auto X = [&](double s) { return l + (w - l - r) * s / day.duration_s; };
  auto Yn = [&](double n) { return top + (h - top - b) * (1 - n / kInstances); };
  auto Yr = [&](double rate) { return top + (h - top - b) * (1 - rate / peak); };
  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      w, h);
  absl::StrAppendFormat(&s, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n", l, Yn(0), w - r,
                        Yn(0));
  for (int n = 0; n <= kInstances; n += 8) {
    absl::StrAppendFormat(&s, "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%d</text>\n", l - 6, Yn(n) + 4, n);
  }
  for (int k = 0; k <= 4; ++k) {
    absl::StrAppendFormat(&s, "<text x=\"%g\" y=\"%g\">%.0f</text>\n", w - r + 6, Yr(peak * k / 4) + 4,
                          peak * k / 4);
  }
  for (double hr = 0; hr <= hours + 1e-9; hr += std::max(1.0, hours / 12)) {
    absl::StrAppendFormat(&s, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%gh</text>\n", X(hr * 3600),
                          Yn(0) + 16, hr);
  }
  absl::StrAppendFormat(&s,
                        "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">instances (left, TP 2 each) and arrival "
                        "rate (right, requests/s) over the day</text>\n",
                        (l + w - r) / 2, h - 10);
  std::string load, observed, pre, dec;
  for (double x = 0; x < day.duration_s; x += 60) absl::StrAppendFormat(&load, "%g,%g ", X(x), Yr(DiurnalRate(day, x)));
  for (const FleetSample& f : t) {
    absl::StrAppendFormat(&observed, "%g,%g ", X(f.t), Yr(f.arrival_rate));
    absl::StrAppendFormat(&pre, "%g,%g ", X(f.t), Yn(f.prefill));
    absl::StrAppendFormat(&dec, "%g,%g ", X(f.t), Yn(f.decode));
  }
  absl::StrAppendFormat(&s, "<polyline fill=\"none\" stroke=\"#bbbbbb\" stroke-width=\"1\" points=\"%s\"/>\n",
                        observed);
  absl::StrAppendFormat(&s, "<polyline fill=\"none\" stroke=\"black\" stroke-width=\"1.5\" points=\"%s\"/>\n", load);
  absl::StrAppendFormat(&s, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"%s\"/>\n", pre);
  absl::StrAppendFormat(&s, "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" points=\"%s\"/>\n", dec);
  for (auto [n, color] : {std::pair<int, const char*>{fixed_p, "#1f77b4"}, {fixed_d, "#d62728"}}) {
    absl::StrAppendFormat(&s,
                          "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"%s\" stroke-dasharray=\"4\"/>\n", l,
                          Yn(n), w - r, Yn(n), color);
  }
  const char* legend[][2] = {{"black", "arrival rate (curve x bursts)"},
                             {"#bbbbbb", "observed rate (30 s)"},
                             {"#1f77b4", "prefill instances (dashed: fixed plan)"},
                             {"#d62728", "decode instances (dashed: fixed plan)"}};
  for (int k = 0; k < 4; ++k) {
    absl::StrAppendFormat(&s, "<text x=\"%g\" y=\"%g\" fill=\"%s\">%s</text>\n", l + 10 + 210 * k, top - 10,
                          legend[k][0], legend[k][1]);
  }
  s += "</svg>\n";
  return s;
}

int Main(int argc, char** argv) {
  FlagSet f("autoscale_fleet", "The SLA planner on a simulated 64-GPU day, beside fixed and queue-threshold plans.");
  f.String("svg", "", "write the day's replicas and load here");
  f.Double("hours", 24, "the day's length (the curve's period), hours");
  f.Double("startup", 60, "seconds from a start decision to serving (a node with the image and weights at hand)");
  f.Double("interval", 30, "autoscaler interval, seconds");
  f.Double("burst-check", AutoscaleOptions{}.check_s, "seconds between the planner's burst checks (0: none)");
  f.String("data", "placement/testdata/", "where the fit and the trace are");
  f.Bool("log", "print each planner decision");
  f.Bool("hourly", "print each plan's attainment by hour");
  // A fleet's settings: a lower target per pool than the defaults' (which
  // keep small clusters at 99.5%), the decode pool's long-run bound nearer
  // its capacity (the simulation of its window still holds TPOT).
  f.Double("target", 0.98, "the planner's attainment target per pool");
  f.Double("margin", PlannerOptions{}.margin, "the planner's load margin");
  f.Double("decode-utilization", 0.95, "the planner's decode utilization bound");
  f.Double("cooldown", PlannerOptions{}.cooldown_s, "the planner's scale-down cool-down, seconds");
  f.Double("correction-damping", PlannerOptions{}.correction_damping,
           "the planner's latency correction moves by (observed / predicted)^this each settled interval (0: none)");
  f.Int("window-requests", PlannerOptions{}.max_window_requests,
        "the most requests in the planner's simulated window (a shorter window at high rates)");
  f.Bool("planner-only", "skip the fixed and queue-threshold runs");
  f.Bool("switch-roles", "the planner switches instances between the pools (drained, serving in the other role "
                         "`--switch-delay` later) instead of a drain and a start");
  f.Double("switch-delay", AutoscaleOptions{}.switch_s, "with --switch-roles: seconds from drained to serving");
  if (!f.Parse(argc, argv).ok()) return 2;
  const double t0 = Now();
  Setup s;
  s.model = ModelPreset("opt-13b").value();
  auto fit = LoadDistServeFit(f.GetString("data") + "distserve-a100-80g.json", s.model);
  if (!fit.ok()) {
    std::fprintf(stderr, "%s\n", std::string(fit.status().message()).c_str());
    return 1;
  }
  s.latency = NewOverheadLatency(NewDistServeLatency(*fit, "DistServe A100 fit"), 2e-3, 1e-7);
  const GpuSpec gpu = LoadGpu("a100-80g").value();
  for (auto [spec, role] : {std::pair<InstanceSpec*, InstanceRole>{&s.prefill, InstanceRole::kPrefill},
                            {&s.decode, InstanceRole::kDecode}}) {
    spec->role = role;
    spec->par = {.tp = 2, .pp = 1};
    spec->kv_capacity_tokens = KvCapacity(s.model, gpu, spec->par);
  }
  s.base.kv_link_bytes_per_s = gpu.intra_node_bw;

  // The peak: the best split's goodput at 90% on Poisson arrivals.
  WorkloadOptions probe{.arrivals = "poisson",
                        .rate = 20,
                        .lengths = "trace",
                        .trace = f.GetString("data") + "splitwise_conv.csv",
                        .num_requests = 50000,
                        .max_context = s.model.max_context,
                        .overlong = "truncate",
                        .seed = 1};
  const Workload base = MakeWorkload(probe).value();
  int best_p = 0;
  double peak = 0;
  for (int p = 8; p <= 18; ++p) {
    const Goodput g = FindGoodput(Fixed(s, p, kInstances - p), s.model, *s.latency, base.requests, kSlo, 0.9, 0.01,
                                  peak > 0 ? peak : 0);
    std::fprintf(stderr, "  split %2d prefill + %2d decode: %.2f req/s at 90%%\n", p, kInstances - p, g.rate);
    if (g.rate > peak) peak = g.rate, best_p = p;
  }
  std::fprintf(stderr, "peak: %.2f req/s (%d prefill + %d decode, TP 2); %.1f s\n", peak, best_p,
               kInstances - best_p, Now() - t0);

  const double day_s = f.GetDouble("hours") * 3600;
  WorkloadOptions day = probe;
  day.arrivals = "diurnal";
  day.rate = peak;
  day.duration_s = day_s;
  day.period_s = day_s;
  day.trough = 0.3;
  // Bursts where twice the curve stays within the fleet (at 2, 6, 18 and
  // 22 h of 24: 0.31 to 0.48 of the peak before doubling); one at the peak
  // would exceed any 64-GPU plan, the planner's included.
  for (double at : {2.0 / 24, 6.0 / 24, 18.0 / 24, 22.0 / 24}) {
    day.bursts.push_back({.start_s = at * day_s, .duration_s = 300, .factor = 2});
  }
  const Workload w = MakeWorkload(day).value();
  std::fprintf(stderr, "day: %zu requests over %.1f h (mean %.2f req/s, peak %.2f)\n", w.requests.size(),
               day_s / 3600, static_cast<double>(w.requests.size()) / day_s, peak);

  auto run_fixed = [&](int p) {
    Outcome o;
    o.name = absl::StrFormat("fixed %d prefill + %d decode", p, kInstances - p);
    const double t = Now();
    o.result = Simulate(Fixed(s, p, kInstances - p), s.model, *s.latency, w.requests);
    o.wall = Now() - t;
    o.attainment = o.result.Attainment(kSlo);
    o.gpu_hours = o.result.gpu_seconds / 3600;
    std::fprintf(stderr, "  %s: %.2f%% attainment, %.0f GPU-hours; %.1f s\n", o.name.c_str(), 100 * o.attainment,
                 o.gpu_hours, o.wall);
    return o;
  };
  // The best fixed plan: the peak's split and its neighbours, over the day.
  Outcome fixed;
  for (int p : {best_p - 1, best_p, best_p + 1}) {
    if (f.GetBool("planner-only") && p != best_p) continue;
    Outcome o = run_fixed(p);
    if (o.attainment > fixed.attainment) fixed = std::move(o);
  }

  AutoscaleOptions a{.prefill = s.prefill,
                     .decode = s.decode,
                     .interval_s = f.GetDouble("interval"),
                     .check_s = f.GetDouble("burst-check"),
                     .startup_s = f.GetDouble("startup"),
                     .switch_s = f.GetDouble("switch-delay")};
  // The day starts at its trough with the pools the planner holds there.
  const ClusterSpec start = Fixed(s, 6, 8);
  auto run_scaled = [&](Autoscaler& scaler, const std::string& name) {
    Outcome o;
    o.name = name;
    a.scaler = &scaler;
    const double t = Now();
    o.result = SimulateAutoscaled(start, s.model, *s.latency, w.requests, a);
    o.wall = Now() - t;
    o.attainment = o.result.Attainment(kSlo);
    o.gpu_hours = o.result.gpu_seconds / 3600;
    std::fprintf(stderr, "  %s: %.2f%% attainment, %.0f GPU-hours (%lld started, %lld drained, %lld switched); %.1f s\n",
                 name.c_str(), 100 * o.attainment, o.gpu_hours, static_cast<long long>(o.result.started),
                 static_cast<long long>(o.result.drained), static_cast<long long>(o.result.switched), o.wall);
    return o;
  };
  PlannerOptions po{.slo = kSlo,
                    .prefill = s.prefill,
                    .decode = s.decode,
                    .min_prefill = 1,
                    .max_prefill = kInstances - 1,
                    .min_decode = 1,
                    .max_decode = kInstances - 1,
                    .max_instances = kInstances,
                    .cluster = s.base};
  po.target = f.GetDouble("target");
  po.margin = f.GetDouble("margin");
  po.decode_utilization = f.GetDouble("decode-utilization");
  po.cooldown_s = f.GetDouble("cooldown");
  po.correction_damping = f.GetDouble("correction-damping");
  po.max_window_requests = f.GetInt("window-requests");
  po.switch_roles = f.GetBool("switch-roles");
  // Each decision logged with --log.
  if (f.GetBool("log")) {
    po.on_decision = [](const PlannerRecord& r, const LoadFigures& x) {
      std::fprintf(stderr, "  [%s] ttft p90 %.3f tpot p90 %.4f pw %lld dw %lld dr %lld\n", r.Describe().c_str(),
                   x.ttft_p90, x.tpot_p90, (long long)x.prefill.waiting, (long long)x.decode.waiting,
                   (long long)x.decode.running);
    };
  }
  Planner planner(s.model, *s.latency, po);
  Outcome sla = run_scaled(planner, absl::StrFormat("SLA planner (target %g, decode utilization %g)", po.target, po.decode_utilization));

  // Queue threshold, bounds swept; each pool within the fixed plan's size
  // (its maxReplicas, as a Deployment's autoscaler has its own).
  int fixed_p = 0, fixed_d = 0;
  std::sscanf(fixed.name.c_str(), "fixed %d prefill + %d decode", &fixed_p, &fixed_d);
  std::vector<Outcome> queue;
  for (auto [pb, db] : {std::pair<double, double>{1, 55}, {4, 85}, {16, 130}, {64, 200}, {256, 400}}) {
    if (f.GetBool("planner-only")) break;
    QueueThresholdScaler q({.prefill_bound = pb, .decode_bound = db, .max_prefill = fixed_p, .max_decode = fixed_d});
    queue.push_back(run_scaled(q, absl::StrFormat("queue threshold %.1f / %.0f", pb, db)));
  }
  std::sort(queue.begin(), queue.end(), [](const Outcome& x, const Outcome& y) { return x.gpu_hours < y.gpu_hours; });
  double queue_at = -1;
  for (size_t k = 0; k + 1 < queue.size(); ++k) {
    const Outcome &lo = queue[k], &hi = queue[k + 1];
    if (sla.gpu_hours >= lo.gpu_hours && sla.gpu_hours <= hi.gpu_hours && hi.gpu_hours > lo.gpu_hours) {
      queue_at = lo.attainment + (hi.attainment - lo.attainment) * (sla.gpu_hours - lo.gpu_hours) /
                                     (hi.gpu_hours - lo.gpu_hours);
    }
  }

  if (f.GetBool("hourly")) {
    for (const Outcome* o : {&fixed, &sla}) {
      std::fprintf(stderr, "%s, attainment by hour:", o->name.c_str());
      std::vector<int64_t> ok(static_cast<size_t>(day_s / 3600) + 1), all(ok.size()), ttft_ok(ok.size());
      for (const RequestOutcome& r : o->result.requests) {
        const size_t h = static_cast<size_t>(r.arrival / 3600);
        ++all[h];
        ok[h] += r.finish >= 0 && r.ttft() <= kSlo.ttft && r.tpot() <= kSlo.tpot;
        ttft_ok[h] += r.first_token >= 0 && r.ttft() <= kSlo.ttft;
      }
      for (size_t h = 0; h < ok.size(); ++h) {
        if (all[h] > 0) std::fprintf(stderr, " %.1f(%.1f)", 100.0 * ok[h] / all[h], 100.0 * ttft_ok[h] / all[h]);
      }
      std::fprintf(stderr, "\n");
    }
    // Each burst's arrivals and the ten minutes after it began.
    for (const Outcome* o : {&fixed, &sla}) {
      std::fprintf(stderr, "%s, attainment in each burst's 10 min:", o->name.c_str());
      for (const Burst& b : day.bursts) {
        int64_t ok = 0, all = 0;
        for (const RequestOutcome& r : o->result.requests) {
          if (r.arrival < b.start_s || r.arrival >= b.start_s + 600) continue;
          ++all;
          ok += r.finish >= 0 && r.ttft() <= kSlo.ttft && r.tpot() <= kSlo.tpot;
        }
        std::fprintf(stderr, " %.1f (%lld)", all > 0 ? 100.0 * ok / all : 0, static_cast<long long>(all));
      }
      std::fprintf(stderr, "\n");
    }
    std::vector<double> p(static_cast<size_t>(day_s / 3600) + 1), d(p.size()), n(p.size());
    for (const FleetSample& x : sla.result.timeline) {
      const size_t h = static_cast<size_t>(x.t / 3600);
      p[h] += x.prefill_ready, d[h] += x.decode_ready, n[h] += 1;
    }
    std::fprintf(stderr, "planner's mean ready prefill / decode by hour:");
    for (size_t h = 0; h < p.size(); ++h) {
      if (n[h] > 0) std::fprintf(stderr, " %.1f/%.1f", p[h] / n[h], d[h] / n[h]);
    }
    std::fprintf(stderr, "\n");
  }
  std::printf("OPT-13B, DistServe A100 fit, SLO TTFT %.1f s TPOT %.1f s; %.0f h, %zu requests, peak %.2f req/s, "
              "4 bursts of 2x for 5 min; instances TP 2; start-up %.0f s, interval %.0f s\n\n",
              kSlo.ttft, kSlo.tpot, day_s / 3600, w.requests.size(), peak, a.startup_s, a.interval_s);
  std::printf("| plan | SLO attainment | GPU-hours | of fixed |\n|---|---|---|---|\n");
  for (const Outcome* o : {&fixed, &sla}) {
    std::printf("| %s | %.2f%% | %.0f | %.2f |\n", o->name.c_str(), 100 * o->attainment, o->gpu_hours,
                o->gpu_hours / fixed.gpu_hours);
  }
  for (const Outcome& o : queue) {
    std::printf("| %s | %.2f%% | %.0f | %.2f |\n", o.name.c_str(), 100 * o.attainment, o.gpu_hours,
                o.gpu_hours / fixed.gpu_hours);
  }
  std::printf("\nplanner vs fixed: %+.2f pp attainment at %.2f of its GPU-hours (targets: >= -2 pp, <= 0.70)\n",
              100 * (sla.attainment - fixed.attainment), sla.gpu_hours / fixed.gpu_hours);
  if (queue_at >= 0) {
    std::printf("planner vs queue threshold at equal GPU-hours (%.0f): %.2f%% vs %.2f%% (%+.2f pp)\n", sla.gpu_hours,
                100 * sla.attainment, 100 * queue_at, 100 * (sla.attainment - queue_at));
  } else {
    std::printf("planner vs queue threshold: the sweep does not bracket the planner's %.0f GPU-hours\n",
                sla.gpu_hours);
  }
  std::printf("wall %.0f s\n", Now() - t0);
  if (!f.GetString("svg").empty()) std::ofstream(f.GetString("svg")) << Svg(sla.result.timeline, day, fixed_p, fixed_d);
  return 0;
}

}  // namespace
}  // namespace duet::placement

int main(int argc, char** argv) { return duet::placement::Main(argc, argv); }
