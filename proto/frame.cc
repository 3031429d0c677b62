#include "proto/frame.h"

namespace duet::proto {

Frame NewFrame() {
  Frame f;
  f.set_protocol_version(PROTOCOL_VERSION_CURRENT);
  return f;
}

}  // namespace duet::proto
