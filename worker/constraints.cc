#include "worker/constraints.h"

#include <utility>

#include "base/logging.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "grammar/grammar_spec.h"
#include "text/tokenizer.h"

namespace duet::worker {

namespace {
constexpr size_t kCachedGrammars = 256;
}

Constraints::Constraints(std::string model_dir, std::vector<int32_t> eos_ids, const std::string& role)
    : cache_(
          [dir = std::move(model_dir), eos_ids = std::move(eos_ids)]()
              -> absl::StatusOr<std::shared_ptr<const grammar::Vocabulary>> {
            const absl::Time start = absl::Now();
            auto tokenizer = text::Tokenizer::Load(dir);
            if (!tokenizer.ok()) {
              return absl::FailedPreconditionError(absl::StrCat(
                  "structured outputs need the model's tokenizer, which did not load: ", tokenizer.status().message()));
            }
            auto vocab = grammar::Vocabulary::FromTokenizer(**tokenizer, eos_ids);
            LOG(INFO) << "structured outputs: the vocabulary of " << (*tokenizer)->vocab_size() << " tokens built in "
                      << absl::ToDoubleMilliseconds(absl::Now() - start) << " ms";
            return vocab;
          },
          kCachedGrammars) {
  MetricsRegistry& m = MetricsRegistry::Default();
  const Labels labels = {{"role", role}};
  compile_seconds_ = m.GetHistogram("duet_grammar_compile_seconds",
                                    "Time to get a request's grammar (compiled, or found cached)", labels,
                                    {1e-5, 1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 1});
  mask_seconds_ = m.GetHistogram("duet_grammar_mask_seconds", "Time to compute one token mask", labels,
                                 {5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 2.5e-2});
  constrained_ = m.GetCounter("duet_requests_constrained_total", "Requests whose output follows a grammar", labels);
}

absl::StatusOr<std::unique_ptr<grammar::TokenConstraint>> Constraints::For(const proto::GenerationSpec& spec,
                                                                           absl::Span<const int32_t> generated) {
  ASSIGN_OR_RETURN(std::unique_ptr<grammar::TokenConstraint> c, Make(spec, generated));
  if (c != nullptr) constrained_->Increment();
  return c;
}

absl::Status Constraints::Check(const proto::GenerationSpec& spec, absl::Span<const int32_t> generated) {
  return Make(spec, generated).status();
}

absl::StatusOr<std::unique_ptr<grammar::TokenConstraint>> Constraints::Make(const proto::GenerationSpec& spec,
                                                                            absl::Span<const int32_t> generated) {
  if (spec.grammar().kind() == proto::GrammarSpec::GRAMMAR_NONE) return nullptr;
  ASSIGN_OR_RETURN(grammar::GrammarCache * cache, cache_.Get());
  const grammar::ConstraintRequest r = grammar::FromProto(spec.grammar());
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<const grammar::Grammar>> g = cache->Get(r);
  compile_seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  if (!g.ok()) return absl::InvalidArgumentError(absl::StrCat("the request's grammar: ", g.status().message()));
  auto c = std::make_unique<grammar::TokenConstraint>(*std::move(g), r.triggers);
  for (size_t i = 0; i < generated.size(); ++i) {
    if (!c->Accept(generated[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("generated token ", i, " (id ", generated[i], ") does not follow the request's grammar"));
    }
  }
  return c;
}

}  // namespace duet::worker
