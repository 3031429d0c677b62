#include "tools/planner_flags.h"

#include "absl/strings/str_cat.h"

namespace duet::tools {

void AddPlannerFlags(FlagSet& f) {
  const placement::PlannerOptions d;
  f.Double("interval", 30, "seconds between the autoscaler's decisions");
  f.Double("burst-check", 5,
           "seconds between the SLA planner's burst checks, between intervals: arrivals past what the pools were "
           "sized for by more than Poisson noise grow the pools at once (0: none)");
  f.Double("planner-target", d.target, "attainment each pool must reach in the planner's simulation of the load");
  f.Double("margin", d.margin, "the planner sizes the pools for the forecast load times (1 + this)");
  f.Double("cooldown", d.cooldown_s,
           "seconds a pool keeps its size before it may shrink (and the span whose largest need it keeps)");
  f.Double("decode-utilization", d.decode_utilization,
           "the decode pool's long-run load (its KV and batch rows by Little's law) stays below this share");
  f.String("forecast", d.forecast, "trend (the larger of the last interval's rate and Holt's forecast) | last");
  f.Int("min-prefill", d.min_prefill, "prefill instances at least");
  f.Int("max-prefill", d.max_prefill, "prefill instances at most");
  f.Int("min-decode", d.min_decode, "decode instances at least");
  f.Int("max-decode", d.max_decode, "decode instances at most");
  f.Int("max-instances", d.max_instances, "prefill + decode instances at most (0: the pools' maxima only)");
  f.Bool("switch-roles", "instances switch between prefill and decode (drained, weights kept) instead of one "
                         "draining while another starts, when both roles have the same shape");
}

absl::StatusOr<placement::PlannerOptions> PlannerFromFlags(const FlagSet& f) {
  placement::PlannerOptions o;
  o.slo = {.ttft = f.GetDouble("slo-ttft"), .tpot = f.GetDouble("slo-tpot")};
  o.target = f.GetDouble("planner-target");
  o.margin = f.GetDouble("margin");
  o.cooldown_s = f.GetDouble("cooldown");
  o.decode_utilization = f.GetDouble("decode-utilization");
  o.forecast = f.GetString("forecast");
  o.min_prefill = static_cast<int>(f.GetInt("min-prefill"));
  o.max_prefill = static_cast<int>(f.GetInt("max-prefill"));
  o.min_decode = static_cast<int>(f.GetInt("min-decode"));
  o.max_decode = static_cast<int>(f.GetInt("max-decode"));
  o.max_instances = static_cast<int>(f.GetInt("max-instances"));
  o.switch_roles = f.GetBool("switch-roles");
  if (!(f.GetDouble("interval") > 0)) return absl::InvalidArgumentError("--interval must be positive");
  if (!(f.GetDouble("burst-check") >= 0)) return absl::InvalidArgumentError("--burst-check must be >= 0");
  if (!(o.target > 0 && o.target <= 1)) return absl::InvalidArgumentError("--planner-target must be in (0, 1]");
  if (!(o.margin >= 0)) return absl::InvalidArgumentError("--margin must be >= 0");
  if (!(o.cooldown_s >= 0)) return absl::InvalidArgumentError("--cooldown must be >= 0");
  if (!(o.decode_utilization > 0 && o.decode_utilization <= 1)) {
    return absl::InvalidArgumentError("--decode-utilization must be in (0, 1]");
  }
  if (o.forecast != "trend" && o.forecast != "last") {
    return absl::InvalidArgumentError(absl::StrCat("--forecast must be trend or last, not ", o.forecast));
  }
  if (o.min_prefill < 1 || o.max_prefill < o.min_prefill || o.min_decode < 1 || o.max_decode < o.min_decode) {
    return absl::InvalidArgumentError("need 1 <= --min-prefill <= --max-prefill and 1 <= --min-decode <= --max-decode");
  }
  if (o.max_instances != 0 && o.max_instances < o.min_prefill + o.min_decode) {
    return absl::InvalidArgumentError("--max-instances must hold --min-prefill + --min-decode (or be 0)");
  }
  if (!(o.slo.ttft > 0 && o.slo.tpot > 0)) return absl::InvalidArgumentError("--slo-ttft and --slo-tpot must be positive");
  return o;
}

}  // namespace duet::tools
