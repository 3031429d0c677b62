// Structured outputs on a worker: the model's vocabulary as the grammar
// engine walks it (built from the model directory's tokenizer on the first
// constrained request), the compiled grammars by request text, and each
// request's TokenConstraint placed after the tokens it already has, so a
// hand-off, a resume or a migration continues the grammar where it was.
//
//   worker::Constraints constraints(model_dir, config.eos_token_ids, "decode");
//   ASSIGN_OR_RETURN(auto c, constraints.For(offer.spec(), offer.generated_ids()));  // null: no grammar
//
// The prefill worker masks a request's first token, the decode or
// colocated worker the rest (decode/batch_engine.h). Thread-safe.
#ifndef DUET_WORKER_CONSTRAINTS_H_
#define DUET_WORKER_CONSTRAINTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "base/metrics.h"
#include "grammar/constraint.h"
#include "proto/control.pb.h"

namespace duet::worker {

class Constraints {
 public:
  // `role` labels the metrics.
  Constraints(std::string model_dir, std::vector<int32_t> eos_ids, const std::string& role);

  // nullptr when the spec has no grammar; else its constraint after
  // `generated` (tokens the request generated before this worker). Errors:
  // InvalidArgument when the grammar does not compile or refuses a
  // generated token, FailedPrecondition when the model has no tokenizer.
  // Counted in duet_requests_constrained_total: call it once per request
  // and choice that samples here.
  absl::StatusOr<std::unique_ptr<grammar::TokenConstraint>> For(const proto::GenerationSpec& spec,
                                                                absl::Span<const int32_t> generated);
  // For's checks alone, uncounted (the grammar compiled, and cached for
  // the For that follows).
  absl::Status Check(const proto::GenerationSpec& spec, absl::Span<const int32_t> generated);
  // The metric a sampling loop observes each mask's time in.
  Histogram* mask_seconds() const { return mask_seconds_; }

 private:
  absl::StatusOr<std::unique_ptr<grammar::TokenConstraint>> Make(const proto::GenerationSpec& spec,
                                                                 absl::Span<const int32_t> generated);

  grammar::LazyGrammarCache cache_;
  Histogram* compile_seconds_;
  Histogram* mask_seconds_;
  Counter* constrained_;
};

}  // namespace duet::worker

#endif  // DUET_WORKER_CONSTRAINTS_H_
