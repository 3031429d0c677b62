// Workloads for the simulator: arrival times and prompt / output lengths.
//
//   ASSIGN_OR_RETURN(Workload w, MakeWorkload({.arrivals = "poisson", .rate = 2.0,
//                                              .lengths = "trace:conv.csv", .num_requests = 10000}));
//
// Arrivals: "poisson" (exponential gaps at `rate`), "gamma" (gaps of
// coefficient of variation `cv`, mean 1/rate), "trace" (the arrival times
// of the trace file, divided by rate_scale), or "diurnal" (Poisson whose
// rate follows DiurnalRate over `duration_s`: a day's curve peaking at
// `rate`, times any bursts; num_requests is not used). Lengths: "fixed:P,O",
// "uniform:PMIN,PMAX,OMIN,OMAX", "trace" (the file's rows in order,
// cycling; arXiv-style files without arrival times work for lengths only),
// each multiplied by length_scale, or "rag" (RagOptions: prompts with their
// token ids, for the prefix caches). A request longer than max_context is
// dropped or truncated (its prompt shortened to fit), as `overlong` says;
// the counts are reported.
#ifndef DUET_PLACEMENT_WORKLOAD_H_
#define DUET_PLACEMENT_WORKLOAD_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace duet::placement {

// A prompt's token ids (the RAG generator's): what the simulator's prefix
// caches look up.
struct PromptTokens {
  std::vector<int32_t> tokens;
  std::vector<int64_t> boundaries;  // where each document, and what follows them, starts
  int64_t doc_begin = 0, doc_end = 0;  // the documents' tokens: [doc_begin, doc_end)
};

struct SimRequest {
  double arrival = 0;  // seconds
  int64_t prompt = 0;  // tokens
  int64_t output = 1;  // tokens, including the first
  // The prompt's ids, owned by the Workload it came from (which must outlive
  // its simulation; copies with rescaled arrivals share them). nullptr:
  // lengths only, nothing is cached. A plain pointer keeps SimRequest
  // trivially copyable: million-request workloads copy it.
  const PromptTokens* content = nullptr;
};

// A RAG workload's prompts: a system prompt, documents drawn by Zipf
// popularity (rank k with weight 1 / k^zipf) whose ranking is reshuffled
// once `shift_at` of the requests have arrived (0: never), and a question
// of its own. A document is the same tokens in every request.
struct RagOptions {
  int64_t documents = 1000;
  double zipf = 1.1;
  double shift_at = 0.5;
  int64_t docs_per_request = 2;  // distinct, in the order drawn
  int64_t doc_min = 100, doc_max = 300;
  int64_t system_tokens = 32;
  int64_t question_min = 16, question_max = 32;
  int64_t output = 8;
};

// A stretch of `factor` times the curve's rate.
struct Burst {
  double start_s = 0;
  double duration_s = 300;
  double factor = 2;
};

struct WorkloadOptions {
  std::string arrivals = "poisson";  // poisson | gamma | trace | diurnal
  double rate = 1.0;                 // requests/s (poisson, gamma)
  double cv = 1.0;                   // gamma
  // diurnal
  double duration_s = 0;
  double period_s = 86400;
  double trough = 0.3;  // the curve's lowest rate, a fraction of its peak
  std::vector<Burst> bursts;
  double rate_scale = 1.0;           // trace arrivals: times / rate_scale
  std::string lengths = "fixed:512,128";  // or "rag": prompts from `rag`
  RagOptions rag;
  std::string trace;                 // CSV path for "trace" arrivals or lengths
  double length_scale = 1.0;
  int64_t num_requests = 1000;       // 0 with trace arrivals: the whole trace
  int64_t max_context = 0;           // 0: no limit
  std::string overlong = "drop";     // drop | truncate
  uint64_t seed = 1;
};

struct Workload {
  std::vector<SimRequest> requests;
  std::shared_ptr<std::deque<PromptTokens>> prompts;  // what requests' `content` points to (rag)
  int64_t dropped = 0;
  int64_t truncated = 0;
};

absl::StatusOr<Workload> MakeWorkload(const WorkloadOptions& o);

// The "diurnal" arrivals' rate at `t` seconds: rate x (trough + (1 - trough)
// x s^2), s = (1 - cos(2 pi t / period)) / 2, lowest at t = 0 and at the
// period's end, highest at its middle (a day whose busy hours are fewer
// than its quiet ones: the mean is trough + 3/8 (1 - trough)), times the
// factor of any burst covering t.
double DiurnalRate(const WorkloadOptions& o, double t);

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
