// NewFrame: a control-plane Frame stamped with this build's protocol
// version, the one way every process (router, workers, test fakes) starts
// a frame it sends.
//
//   proto::Frame f = proto::NewFrame();
//   f.mutable_cancel()->set_request_id(id);
#ifndef DUET_PROTO_FRAME_H_
#define DUET_PROTO_FRAME_H_

#include "absl/strings/string_view.h"
#include "proto/control.pb.h"

namespace duet::proto {

Frame NewFrame();

// "prefill", "decode", "colocated" ("unspecified" for any other value).
absl::string_view RoleName(Role role);

}  // namespace duet::proto

#endif  // DUET_PROTO_FRAME_H_
