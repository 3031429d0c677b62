// The flags that say how a model is loaded, declared once for every command
// that loads one (the workers, generate, profile, precision-plan).
//
//   AddLoadFlags(f);
//   ASSIGN_OR_RETURN(engine::LoadOptions load, LoadOptionsFromFlags(f));
#ifndef DUET_TOOLS_LOAD_FLAGS_H_
#define DUET_TOOLS_LOAD_FLAGS_H_

#include "absl/status/statusor.h"
#include "base/flags.h"
#include "engine/model.h"

namespace duet::tools {

// --weight-dtype, --precision-map, --kv-dtype, --tp, --pp (the command
// declares --threads, which the tensor-parallel ranks share).
void AddLoadFlags(FlagSet& f);
// The options those flags say; the precision map is read and checked here
// (its layer count against the model's when the model loads).
absl::StatusOr<engine::LoadOptions> LoadOptionsFromFlags(const FlagSet& f);

}  // namespace duet::tools

#endif  // DUET_TOOLS_LOAD_FLAGS_H_
