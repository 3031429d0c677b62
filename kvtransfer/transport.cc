#include "kvtransfer/transport.h"

namespace duet::kvtransfer {

const char* TransferStateName(TransferState state) {
  switch (state) {
    case TransferState::kInFlight:
      return "in_flight";
    case TransferState::kDone:
      return "done";
    case TransferState::kCancelled:
      return "cancelled";
    case TransferState::kPeerLost:
      return "peer_lost";
    case TransferState::kLeaseExpired:
      return "lease_expired";
    case TransferState::kTimedOut:
      return "timed_out";
  }
  return "unknown";
}

}  // namespace duet::kvtransfer
