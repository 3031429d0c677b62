#include "tools/workload_flags.h"

namespace duet::tools {

void AddWorkloadFlags(FlagSet& f, int64_t default_requests) {
  f.String("arrivals", "poisson", "poisson | gamma | trace");
  f.Double("rate", 1.0, "requests/s (poisson, gamma)");
  f.Double("cv", 1.0, "gamma arrivals: coefficient of variation of the gaps");
  f.Int("requests", default_requests, "requests in the workload (0 with trace arrivals: the whole trace)");
  f.String("lengths", "", "fixed:P,O | uniform:PMIN,PMAX,OMIN,OMAX | trace (default: trace with --trace, else "
                          "fixed:512,128)");
  f.String("trace", "", "trace CSV (arrived_at, num_prefill_tokens, num_decode_tokens)");
  f.Double("rate-scale", 1.0, "trace arrivals: speed up by this factor");
  f.Double("length-scale", 1.0, "multiply prompt and output lengths");
  f.String("overlong", "drop", "requests longer than the model's context: drop | truncate");
  f.Int("seed", 1, "workload (and exponential latency) seed");
}

placement::WorkloadOptions WorkloadFromFlags(const FlagSet& f, const placement::ModelSpec& model) {
  placement::WorkloadOptions wo;
  wo.arrivals = f.GetString("arrivals");
  wo.rate = f.GetDouble("rate");
  wo.cv = f.GetDouble("cv");
  wo.num_requests = f.GetInt("requests");
  wo.lengths = f.GetString("lengths");
  if (wo.lengths.empty()) wo.lengths = f.GetString("trace").empty() ? "fixed:512,128" : "trace";
  wo.trace = f.GetString("trace");
  wo.rate_scale = f.GetDouble("rate-scale");
  wo.length_scale = f.GetDouble("length-scale");
  wo.overlong = f.GetString("overlong");
  wo.max_context = model.max_context;
  wo.seed = static_cast<uint64_t>(f.GetInt("seed"));
  return wo;
}

uint64_t LatencySeed(const FlagSet& f) { return static_cast<uint64_t>(f.GetInt("seed")) ^ 0x9e3779b97f4a7c15ull; }

}  // namespace duet::tools
