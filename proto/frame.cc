#include "proto/frame.h"

namespace duet::proto {

Frame NewFrame() {
  Frame f;
  f.set_protocol_version(PROTOCOL_VERSION_CURRENT);
  return f;
}

absl::string_view RoleName(Role role) {
  switch (role) {
    case ROLE_PREFILL:
      return "prefill";
    case ROLE_DECODE:
      return "decode";
    case ROLE_COLOCATED:
      return "colocated";
    default:
      return "unspecified";
  }
}

}  // namespace duet::proto
