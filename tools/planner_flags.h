// The SLA planner's flags (placement/planner.h), declared once for every
// command that runs it: `duet sim --autoscale` and `duet planner`.
//
//   AddPlannerFlags(f);
//   ASSIGN_OR_RETURN(placement::PlannerOptions o, PlannerFromFlags(f));
#ifndef DUET_TOOLS_PLANNER_FLAGS_H_
#define DUET_TOOLS_PLANNER_FLAGS_H_

#include "absl/status/statusor.h"
#include "base/flags.h"
#include "placement/planner.h"

namespace duet::tools {

// --interval, --burst-check, --planner-target, --margin, --cooldown, --decode-utilization,
// --forecast, --min-prefill, --max-prefill, --min-decode, --max-decode,
// --max-instances, --switch-roles, --slo-ttft and --slo-tpot (the names
// `duet place` gives them) are the caller's.
void AddPlannerFlags(FlagSet& f);

// The options those flags say (SLOs from --slo-ttft and --slo-tpot; the
// instance shapes and the cluster are the caller's); InvalidArgument for a
// value out of range.
absl::StatusOr<placement::PlannerOptions> PlannerFromFlags(const FlagSet& f);

}  // namespace duet::tools

#endif  // DUET_TOOLS_PLANNER_FLAGS_H_
