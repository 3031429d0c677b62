// The control plane's GrammarSpec and the grammar engine's
// ConstraintRequest, one to the other (the router writes one, the workers
// read it).
#ifndef DUET_GRAMMAR_GRAMMAR_SPEC_H_
#define DUET_GRAMMAR_GRAMMAR_SPEC_H_

#include "grammar/constraint.h"
#include "proto/control.pb.h"

namespace duet::grammar {

ConstraintRequest FromProto(const proto::GrammarSpec& spec);
proto::GrammarSpec ToProto(const ConstraintRequest& request);

}  // namespace duet::grammar

#endif  // DUET_GRAMMAR_GRAMMAR_SPEC_H_
