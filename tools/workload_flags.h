// The workload flags `duet sim` and `duet place` share, declared once so
// both commands parse, document and default them alike.
//
//   AddWorkloadFlags(f, /*default_requests=*/10000);
//   ASSIGN_OR_RETURN(placement::WorkloadOptions wo, WorkloadFromFlags(f, model));
#ifndef DUET_TOOLS_WORKLOAD_FLAGS_H_
#define DUET_TOOLS_WORKLOAD_FLAGS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/flags.h"
#include "placement/latency.h"
#include "placement/model.h"
#include "placement/workload.h"

namespace duet::tools {

// --arrivals, --rate, --cv, --duration, --period, --trough, --bursts,
// --requests, --lengths, --trace, --rate-scale, --length-scale, --overlong,
// --seed.
void AddWorkloadFlags(FlagSet& f, int64_t default_requests);

// The options those flags say; lengths default to the trace's when --trace
// is given, else fixed:512,128; requests longer than the model's context
// follow --overlong.
placement::WorkloadOptions WorkloadFromFlags(const FlagSet& f, const placement::ModelSpec& model);

// InvalidArgument for a workload flag the chosen arrivals and lengths
// ignore (--rate with trace arrivals, --cv without gamma, --rate-scale
// without trace arrivals, --trace with neither trace arrivals nor lengths).
absl::Status CheckWorkloadFlags(const FlagSet& f);

// --batch-overhead-ms, which both commands take.
void AddLatencyFlags(FlagSet& f);
// The latency model `spec` names (placement::LoadLatencyModel), with
// --batch-overhead-ms BASE[,PER_CONTEXT_TOKEN] added to every batch and step.
absl::StatusOr<std::unique_ptr<placement::LatencyModel>> LoadLatencyWithOverhead(const FlagSet& f,
                                                                                 const std::string& spec,
                                                                                 const placement::ModelSpec& model,
                                                                                 uint64_t seed);

// The same for `model` at its weight dtype (placement::AtWeightDType):
// InvalidArgument when the latency model `spec` names times it exactly as it
// times `as_given` although their weights differ in bytes (a fitted profile,
// which knows one precision), as precision could not be ranked by it.
absl::StatusOr<std::unique_ptr<placement::LatencyModel>> LoadLatencyForWeights(const FlagSet& f,
                                                                               const std::string& spec,
                                                                               const placement::ModelSpec& as_given,
                                                                               const placement::ModelSpec& model,
                                                                               uint64_t seed);

// The latency model's random stream: derived from --seed but apart from the
// workload's, so service times never echo the arrival gaps.
uint64_t LatencySeed(const FlagSet& f);

}  // namespace duet::tools

#endif  // DUET_TOOLS_WORKLOAD_FLAGS_H_
