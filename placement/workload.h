// Workloads for the simulator: arrival times and prompt / output lengths.
//
//   ASSIGN_OR_RETURN(Workload w, MakeWorkload({.arrivals = "poisson", .rate = 2.0,
//                                              .lengths = "trace:conv.csv", .num_requests = 10000}));
//
// Arrivals: "poisson" (exponential gaps at `rate`), "gamma" (gaps of
// coefficient of variation `cv`, mean 1/rate), or "trace" (the arrival times
// of the trace file, divided by rate_scale). Lengths: "fixed:P,O",
// "uniform:PMIN,PMAX,OMIN,OMAX", or "trace" (the file's rows in order,
// cycling; arXiv-style files without arrival times work for lengths only),
// each multiplied by length_scale. A request longer than max_context is
// dropped or truncated (its prompt shortened to fit), as `overlong` says;
// the counts are reported.
#ifndef DUET_PLACEMENT_WORKLOAD_H_
#define DUET_PLACEMENT_WORKLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace duet::placement {

struct SimRequest {
  double arrival = 0;  // seconds
  int64_t prompt = 0;  // tokens
  int64_t output = 1;  // tokens, including the first
};

struct WorkloadOptions {
  std::string arrivals = "poisson";  // poisson | gamma | trace
  double rate = 1.0;                 // requests/s (poisson, gamma)
  double cv = 1.0;                   // gamma
  double rate_scale = 1.0;           // trace arrivals: times / rate_scale
  std::string lengths = "fixed:512,128";
  std::string trace;                 // CSV path for "trace" arrivals or lengths
  double length_scale = 1.0;
  int64_t num_requests = 1000;       // 0 with trace arrivals: the whole trace
  int64_t max_context = 0;           // 0: no limit
  std::string overlong = "drop";     // drop | truncate
  uint64_t seed = 1;
};

struct Workload {
  std::vector<SimRequest> requests;
  int64_t dropped = 0;
  int64_t truncated = 0;
};

absl::StatusOr<Workload> MakeWorkload(const WorkloadOptions& o);

// Rows of a trace CSV: arrived_at (s, may be absent), num_prefill_tokens,
// num_decode_tokens, by header name.
struct TraceRow {
  double arrival = -1;  // -1: the file has no arrival times
  int64_t prompt = 0;
  int64_t output = 0;
};
absl::StatusOr<std::vector<TraceRow>> ReadTrace(const std::string& path);

}  // namespace duet::placement

#endif  // DUET_PLACEMENT_WORKLOAD_H_
