#include "tools/workload_flags.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"

namespace duet::tools {

void AddWorkloadFlags(FlagSet& f, int64_t default_requests) {
  f.String("arrivals", "poisson",
           "poisson | gamma | trace | diurnal (Poisson whose rate follows a day's curve peaking at --rate: "
           "trough + (1 - trough) x s^2, s = (1 - cos(2 pi t / period)) / 2, times --bursts)");
  f.Double("rate", 1.0, "requests/s (poisson, gamma; diurnal: the curve's peak)");
  f.Double("duration", 0, "diurnal arrivals: seconds of arrivals");
  f.Double("period", 86400, "diurnal arrivals: the curve's period, seconds (lowest at 0 and at its end)");
  f.Double("trough", 0.3, "diurnal arrivals: the curve's lowest rate, a fraction of its peak");
  f.String("bursts", "", "diurnal arrivals: START:SECONDS:FACTOR,... stretches of FACTOR times the curve");
  f.Double("cv", 1.0, "gamma arrivals: coefficient of variation of the gaps");
  f.Int("requests", default_requests, "requests in the workload (0 with trace arrivals: the whole trace)");
  f.String("lengths", "", "fixed:P,O | uniform:PMIN,PMAX,OMIN,OMAX | trace | rag (default: trace with --trace, else "
                          "fixed:512,128)");
  f.Int("rag-documents", 1000, "--lengths rag: documents in the corpus");
  f.Double("rag-zipf", 1.1, "--lengths rag: Zipf exponent of document popularity (rank k drawn with weight 1/k^S)");
  f.Double("rag-shift", 0.5, "--lengths rag: reshuffle the popularity ranking after this fraction of requests (0: never)");
  f.Int("rag-docs-per-request", 2, "--lengths rag: distinct documents per prompt, after the system prompt");
  f.String("rag-doc-tokens", "100,300", "--lengths rag: MIN,MAX tokens of a document");
  f.Int("rag-system-tokens", 32, "--lengths rag: tokens of the system prompt every request starts with");
  f.String("rag-question-tokens", "16,32", "--lengths rag: MIN,MAX tokens of a request's own question");
  f.Int("rag-output", 8, "--lengths rag: output tokens of every request");
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
  wo.duration_s = f.GetDouble("duration");
  wo.period_s = f.GetDouble("period");
  wo.trough = f.GetDouble("trough");
  for (absl::string_view b : absl::StrSplit(f.GetString("bursts"), ',', absl::SkipEmpty())) {
    const std::vector<std::string> v = absl::StrSplit(b, ':');
    placement::Burst burst;
    if (v.size() != 3 || !absl::SimpleAtod(v[0], &burst.start_s) || !absl::SimpleAtod(v[1], &burst.duration_s) ||
        !absl::SimpleAtod(v[2], &burst.factor)) {
      burst.factor = -1;  // MakeWorkload refuses it
    }
    wo.bursts.push_back(burst);
  }
  placement::RagOptions& rag = wo.rag;
  rag.documents = f.GetInt("rag-documents");
  rag.zipf = f.GetDouble("rag-zipf");
  rag.shift_at = f.GetDouble("rag-shift");
  rag.docs_per_request = f.GetInt("rag-docs-per-request");
  rag.system_tokens = f.GetInt("rag-system-tokens");
  rag.output = f.GetInt("rag-output");
  auto range = [&f](const char* name, int64_t* lo, int64_t* hi) {
    const std::vector<std::string> v = absl::StrSplit(f.GetString(name), ',');
    if (v.size() != 2 || !absl::SimpleAtoi(v[0], lo) || !absl::SimpleAtoi(v[1], hi)) *lo = *hi = -1;  // refused
  };
  range("rag-doc-tokens", &rag.doc_min, &rag.doc_max);
  range("rag-question-tokens", &rag.question_min, &rag.question_max);
  return wo;
}

absl::Status CheckWorkloadFlags(const FlagSet& f) {
  const std::string arrivals = f.GetString("arrivals");
  RETURN_IF_ERROR(f.RefuseUnless(arrivals != "trace", {"rate"}, "with --arrivals trace (use --rate-scale)"));
  RETURN_IF_ERROR(f.RefuseUnless(arrivals == "gamma", {"cv"}, "unless --arrivals gamma"));
  RETURN_IF_ERROR(f.RefuseUnless(arrivals == "trace", {"rate-scale"}, "unless --arrivals trace"));
  RETURN_IF_ERROR(f.RefuseUnless(arrivals == "diurnal", {"duration", "period", "trough", "bursts"},
                                 "unless --arrivals diurnal"));
  RETURN_IF_ERROR(f.RefuseUnless(arrivals != "diurnal", {"requests"}, "with --arrivals diurnal (--duration says how long)"));
  const bool trace_lengths = f.GetString("lengths").empty() || f.GetString("lengths") == "trace";
  RETURN_IF_ERROR(f.RefuseUnless(arrivals == "trace" || trace_lengths, {"trace"},
                                 "with --lengths " + f.GetString("lengths") + " and --arrivals " + arrivals));
  RETURN_IF_ERROR(f.RefuseUnless(f.GetString("lengths") == "rag",
                                 {"rag-documents", "rag-zipf", "rag-shift", "rag-docs-per-request", "rag-doc-tokens",
                                  "rag-system-tokens", "rag-question-tokens", "rag-output"},
                                 "unless --lengths rag"));
  RETURN_IF_ERROR(f.RefuseUnless(f.GetString("lengths") != "rag", {"length-scale", "overlong"},
                                 "with --lengths rag (its token ids fix the lengths; overlong prompts are dropped)"));
  return absl::OkStatus();
}

void AddLatencyFlags(FlagSet& f) {
  f.String("batch-overhead-ms", "",
           "BASE[,PER_CONTEXT_TOKEN]: ms added to every prefill batch and decode step, plus ms per prompt or "
           "context token in it (DistServe's simulator adds 2,0.0001 for its Ray calls)");
}

absl::StatusOr<std::unique_ptr<placement::LatencyModel>> LoadLatencyWithOverhead(const FlagSet& f,
                                                                                 const std::string& spec,
                                                                                 const placement::ModelSpec& model,
                                                                                 uint64_t seed) {
  ASSIGN_OR_RETURN(std::unique_ptr<placement::LatencyModel> base, placement::LoadLatencyModel(spec, model, seed));
  const std::string overhead = f.GetString("batch-overhead-ms");
  if (overhead.empty()) return base;
  std::vector<std::string> parts = absl::StrSplit(overhead, ',');
  double fixed_ms = 0, per_token_ms = 0;
  if (parts.size() > 2 || !absl::SimpleAtod(parts[0], &fixed_ms) ||
      (parts.size() == 2 && !absl::SimpleAtod(parts[1], &per_token_ms)) || fixed_ms < 0 || per_token_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--batch-overhead-ms: BASE[,PER_CONTEXT_TOKEN], non-negative ms; got \"",
                                                   overhead, "\""));
  }
  return placement::NewOverheadLatency(std::move(base), fixed_ms / 1e3, per_token_ms / 1e3);
}

absl::StatusOr<std::unique_ptr<placement::LatencyModel>> LoadLatencyForWeights(const FlagSet& f,
                                                                               const std::string& spec,
                                                                               const placement::ModelSpec& as_given,
                                                                               const placement::ModelSpec& model,
                                                                               uint64_t seed) {
  ASSIGN_OR_RETURN(auto l, LoadLatencyWithOverhead(f, spec, model, seed));
  if (model.WeightBytes() == as_given.WeightBytes()) return l;
  ASSIGN_OR_RETURN(auto base, LoadLatencyWithOverhead(f, spec, as_given, seed));
  const std::vector<int64_t> one = {512};
  if (l->Decode({}, one) == base->Decode({}, one)) {
    return absl::InvalidArgumentError(absl::StrCat("the latency model ", l->Describe(), " times ", model.weight_dtype,
                                                   " weights as it times the model as given; use a roofline"));
  }
  return l;
}

uint64_t LatencySeed(const FlagSet& f) { return static_cast<uint64_t>(f.GetInt("seed")) ^ 0x9e3779b97f4a7c15ull; }

}  // namespace duet::tools
