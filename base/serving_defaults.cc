#include "base/serving_defaults.h"

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace duet {

std::string CacheAwareWeights::ToString() const { return absl::StrCat(uncached, ",", queued); }

absl::StatusOr<CacheAwareWeights> ParseCacheAwareWeights(absl::string_view text) {
  const std::vector<std::string> parts = absl::StrSplit(text, ',');
  CacheAwareWeights w;
  if (parts.size() != 2 || !absl::SimpleAtod(parts[0], &w.uncached) || !absl::SimpleAtod(parts[1], &w.queued) ||
      !(w.uncached >= 0) || !(w.queued >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cache-aware-weights must be U,Q with U, Q >= 0, got \"", text, "\""));
  }
  return w;
}

}  // namespace duet
