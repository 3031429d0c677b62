#include "tools/load_flags.h"

#include "base/status_macros.h"
#include "engine/precision_map.h"

namespace duet::tools {

void AddLoadFlags(FlagSet& f) {
  f.String("weight-dtype", "auto", engine::kWeightDTypeHelp);
  f.String("precision-map", "",
           "JSON file of each layer's weight dtype (as duet precision-plan writes it); --weight-dtype then applies "
           "to the embedding and lm_head where the map names no dtype for them");
  f.String("kv-dtype", "auto", engine::kKvDTypeHelp);
}

absl::StatusOr<engine::LoadOptions> LoadOptionsFromFlags(const FlagSet& f) {
  engine::LoadOptions o;
  ASSIGN_OR_RETURN(o.weight_dtype, engine::ParseWeightDType(f.GetString("weight-dtype")));
  ASSIGN_OR_RETURN(o.kv_dtype, engine::ParseKvDType(f.GetString("kv-dtype")));
  if (!f.GetString("precision-map").empty()) {
    ASSIGN_OR_RETURN(o.precision_map, engine::ReadPrecisionMap(f.GetString("precision-map")));
  }
  return o;
}

}  // namespace duet::tools
