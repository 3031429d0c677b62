// Shared pieces of the cluster tests: the request mix, the reference
// outputs computed in-process by engine::Generate, and response parsing.
#ifndef DUET_TESTS_SERVING_UTIL_H_
#define DUET_TESTS_SERVING_UTIL_H_

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/generator.h"

namespace duet::testing {

// Bytes of one f32 KV block of the tiny model: layers x K/V x kv heads x slots x head dim x 4.
inline constexpr int64_t kTinyBlockBytes = 4 * 2 * 2 * 16 * 32 * 4;

struct TestRequest {
  std::vector<int32_t> prompt;
  int max_tokens = 8;
  float temperature = 0;
  uint64_t seed = 0;
  uint64_t choice = 0;  // choice index (n > 1 requests)
  int logprobs = 0;  // 0: none
  bool stream = false;
  bool ignore_eos = true;
  nlohmann::json extra = nlohmann::json::object();  // More body fields (a grammar's).
};

// `n` requests of mixed prompt lengths (1..max_prompt), output lengths,
// sampling (greedy with or without logprobs, seeded temperature 1) and
// streaming, from a fixed seed.
std::vector<TestRequest> MixedRequests(int n, int vocab, int max_prompt, int max_tokens, uint32_t seed);

std::string CompletionBody(const TestRequest& r, const std::string& model);

struct ParsedCompletion {
  std::vector<int32_t> ids;
  std::vector<double> token_logprobs;
  std::vector<std::vector<double>> top_logprobs;  // Values, any order.
  std::string finish_reason;
  std::string error;  // Non-empty when the response (or a stream event) was an error.
  int64_t cached_tokens = -1;  // A non-stream response's usage.prompt_tokens_details.cached_tokens.
};
// Parses a non-stream JSON body or an SSE stream body: the choice `index`.
ParsedCompletion ParseCompletion(const std::string& body, bool stream, int index = 0);

// The reference: engine::Generate on `model_dir` for each request.
std::vector<engine::GenerateResult> ReferenceOutputs(const std::string& model_dir,
                                                     const std::vector<TestRequest>& requests);
// The same with the prompt run on the model as `prefill` loads it and decode
// on the model as `decode` loads it (a cluster whose pools load different
// precision maps); both must name the same KV dtype.
std::vector<engine::GenerateResult> ReferenceOutputs(const std::string& model_dir,
                                                     const std::vector<TestRequest>& requests,
                                                     const engine::LoadOptions& prefill,
                                                     const engine::LoadOptions& decode);

// Empty when `got` matches `want` (ids, finish reason, logprobs within
// 1e-4); else a description of the first difference.
std::string Compare(const ParsedCompletion& got, const engine::GenerateResult& want, const TestRequest& r);

// Batched forward passes round differently from one request alone (BLAS
// kernels differ by matrix shape), so where two tokens are within float noise
// of each other the cluster may take the other branch. The verdict on an
// output that differs from the reference: teacher-force the reference along
// the cluster's own tokens and require every token to be the one the
// reference samples at that position, except at a near-tie (greedy: top
// logits within 1e-3; sampling: the draw within 1e-5 of the CDF boundary
// between the two tokens). Logprobs must match the teacher-forced reference
// within 1e-4 at every position. Empty when the output passes; `near_ties`
// counts the tolerated positions.
std::string CheckTeacherForced(const std::string& model_dir, const ParsedCompletion& got, const TestRequest& r,
                               int* near_ties);

// Compare, falling back to CheckTeacherForced; counts exact matches and
// tolerated near-ties.
struct Verdicts {
  int exact = 0;
  int near_tie = 0;
};
std::string Verify(const std::string& model_dir, const ParsedCompletion& got, const engine::GenerateResult& want,
                   const TestRequest& r, Verdicts* v);

// Every request at once (a thread each) to the router's API on 127.0.0.1:port;
// an HTTP or transport error lands in the completion's `error`.
std::vector<ParsedCompletion> SendAll(int port, const std::vector<TestRequest>& reqs, const std::string& model);

// Polls the router's /stats on 127.0.0.1:port until `pred` holds (each call
// is a round trip that bounds the rate); DeadlineExceeded with the last
// /stats after `timeout`.
absl::StatusOr<nlohmann::json> PollStats(int port, const std::function<bool(const nlohmann::json&)>& pred,
                                         absl::Duration timeout);

// The sum of `name`'s samples whose labels contain `label` (e.g.
// `reason="peer_lost"`; "" for all) in the Prometheus text that 127.0.0.1:port
// serves at /metrics; 0 when it has none.
absl::StatusOr<double> ScrapeMetric(int port, const std::string& name, const std::string& label);

// No request or lease on any worker, and every block free (blocks only the
// prefix cache holds count as free).
bool AllIdle(const nlohmann::json& stats);

}  // namespace duet::testing

#endif  // DUET_TESTS_SERVING_UTIL_H_
