#include "autoscale/live_planner.h"

#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace duet::autoscale {

FiguresSource RouterFigures(http::Endpoint router, absl::Duration window) {
  return [router, window]() -> absl::StatusOr<placement::LoadFigures> {
    const std::string path = absl::StrCat("/figures?window_s=", absl::ToDoubleSeconds(window));
    ASSIGN_OR_RETURN(http::HttpResult r, http::HttpCall(router, "GET", path, "", absl::Seconds(10)));
    if (r.status != 200) {
      return absl::UnavailableError(absl::StrCat("router ", router.host, ":", router.port, path, ": HTTP ", r.status,
                                                 ": ", r.body));
    }
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(r.body);
    } catch (const nlohmann::json::exception& e) {
      return absl::DataLossError(absl::StrCat("router ", path, ": not JSON: ", e.what()));
    }
    return placement::FiguresFromJson(j);
  };
}

absl::StatusOr<double> WorkerKvCapacity(const placement::LoadFigures& f) {
  if (f.decode.ready < 1 || f.decode.kv_capacity <= 0) {
    return absl::UnavailableError("the router lists no decode worker's KV capacity");
  }
  return f.decode.kv_capacity / f.decode.ready;
}

absl::StatusOr<double> WorkerKvCapacity(const http::Endpoint& router) {
  ASSIGN_OR_RETURN(placement::LoadFigures now, RouterFigures(router, absl::Seconds(1))());
  return WorkerKvCapacity(now);
}

namespace {

Counter* Decisions(const char* direction) {
  return MetricsRegistry::Default().GetCounter("duet_planner_decisions_total",
                                               "Planner decisions, by what they did to the pools",
                                               {{"direction", direction}});
}

Gauge* PoolGauge(const char* role, const char* state) {
  return MetricsRegistry::Default().GetGauge(
      "duet_planner_instances", "Instances per pool as the planner saw them (ready, starting, draining) and its target",
      {{"role", role}, {"state", state}});
}

}  // namespace

LivePlanner::LivePlanner(placement::Autoscaler& scaler, Actuator& actuator, LivePlannerOptions options)
    : scaler_(scaler),
      planner_(dynamic_cast<placement::Planner*>(&scaler)),
      actuator_(actuator),
      o_(std::move(options)),
      up_(Decisions("up")),
      down_(Decisions("down")),
      hold_(Decisions("hold")),
      errors_(MetricsRegistry::Default().GetCounter("duet_planner_errors_total",
                                                    "Planner intervals that changed nothing: figures or actuator "
                                                    "unreachable")) {
  if (!o_.log) o_.log = [](const std::string&) {};
}

absl::Status LivePlanner::Step() {
  absl::Status st = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(placement::LoadFigures f, o_.figures());
    RETURN_IF_ERROR(actuator_.Observe(f));
    placement::ScaleDecision d = scaler_.Decide(f);
    RETURN_IF_ERROR(actuator_.Apply(d, f));
    Export(f, d);
    figures_ = std::move(f);
    last_ = std::move(d);
    return absl::OkStatus();
  }();
  if (!st.ok()) {
    errors_->Increment();
    o_.log(absl::StrCat("planner: no decision this interval: ", st.message()));
  }
  return st;
}

bool LivePlanner::Check() {
  if (!o_.recent) return false;
  absl::StatusOr<placement::LoadFigures> f = o_.recent();
  if (!f.ok() || !actuator_.Observe(*f).ok()) return false;
  std::optional<placement::ScaleDecision> d = scaler_.Check(*f);
  if (!d.has_value() || !actuator_.Apply(*d, *f).ok()) return false;
  Export(*f, *d);
  figures_ = *std::move(f);
  last_ = *std::move(d);
  return true;
}

void LivePlanner::Export(const placement::LoadFigures& f, const placement::ScaleDecision& d) {
  const bool grew = d.prefill > f.prefill.planned() || d.decode > f.decode.planned();
  const bool shrank = d.prefill < f.prefill.planned() || d.decode < f.decode.planned();
  (grew ? up_ : shrank ? down_ : hold_)->Increment();
  for (auto [role, pool, target] : {std::tuple<const char*, const placement::PoolFigures*, int>{"prefill", &f.prefill,
                                                                                                 d.prefill},
                                    {"decode", &f.decode, d.decode}}) {
    PoolGauge(role, "ready")->Set(pool->ready);
    PoolGauge(role, "starting")->Set(pool->starting);
    PoolGauge(role, "draining")->Set(pool->draining);
    PoolGauge(role, "target")->Set(target);
  }
  auto& m = MetricsRegistry::Default();
  m.GetGauge("duet_planner_arrival_rate", "Requests per second, observed over the last interval and planned for",
             {{"kind", "observed"}})
      ->Set(f.arrival_rate());
  std::string line;
  if (planner_ != nullptr) {
    const placement::PlannerRecord& r = planner_->last();
    m.GetGauge("duet_planner_arrival_rate", "", {{"kind", "planned"}})->Set(r.planned_rate);
    const char* kTtft = "duet_planner_ttft_seconds";
    const char* kTpot = "duet_planner_tpot_seconds";
    const char* help = "Median latency the planner's simulation predicted for its pools, and the one observed";
    m.GetGauge(kTtft, help, {{"kind", "predicted"}})->Set(r.predicted_ttft_p50);
    m.GetGauge(kTtft, help, {{"kind", "observed"}})->Set(r.observed_ttft_p50);
    m.GetGauge(kTpot, help, {{"kind", "predicted"}})->Set(r.predicted_tpot_p50);
    m.GetGauge(kTpot, help, {{"kind", "observed"}})->Set(r.observed_tpot_p50);
    const char* kCorr = "duet_planner_latency_correction";
    const char* help2 = "Factor on the latency model from observed / predicted medians, per phase";
    m.GetGauge(kCorr, help2, {{"phase", "prefill"}})->Set(r.correction_prefill);
    m.GetGauge(kCorr, help2, {{"phase", "decode"}})->Set(r.correction_decode);
    line = r.Describe();
  } else {
    line = absl::StrFormat("t=%.0f s rate %.3g/s: prefill %d -> %d, decode %d -> %d (%s)", f.now, f.arrival_rate(),
                           f.prefill.planned(), d.prefill, f.decode.planned(), d.decode, d.why);
  }
  o_.log(absl::StrCat("planner: ", line));
}

void LivePlanner::Run(const std::function<bool()>& should_stop) {
  while (!should_stop()) {
    const absl::Time next = absl::Now() + o_.interval;
    (void)Step();
    absl::Time check = absl::Now() + o_.check;
    while (!should_stop() && absl::Now() < next) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (o_.recent && absl::Now() >= check && absl::Now() < next) {
        (void)Check();
        check += o_.check;
      }
    }
  }
}

}  // namespace duet::autoscale
