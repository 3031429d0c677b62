#include "grammar/grammar_spec.h"

namespace duet::grammar {

ConstraintRequest FromProto(const proto::GrammarSpec& spec) {
  ConstraintRequest r;
  r.kind = static_cast<ConstraintKind>(spec.kind());
  r.text = spec.text();
  r.choices.assign(spec.choices().begin(), spec.choices().end());
  r.whitespace = spec.whitespace();
  r.triggers.assign(spec.triggers().begin(), spec.triggers().end());
  return r;
}

proto::GrammarSpec ToProto(const ConstraintRequest& r) {
  proto::GrammarSpec spec;
  spec.set_kind(static_cast<proto::GrammarSpec::Kind>(r.kind));
  spec.set_text(r.text);
  for (const std::string& c : r.choices) spec.add_choices(c);
  spec.set_whitespace(r.whitespace);
  for (const std::string& t : r.triggers) spec.add_triggers(t);
  return spec;
}

}  // namespace duet::grammar
