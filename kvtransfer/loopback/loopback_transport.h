// LoopbackKvTransport: the KvTransport within one process, by memcpy, for
// unit tests of the components that pull KV (decode) or export it (prefill)
// without UCX, processes or a network.
//
//   KvTransportPtr prefill = NewLoopbackTransport(), decode = NewLoopbackTransport();
//   PeerId p = decode->Connect(prefill->address()).value();  // then Pull/Wait as with UCX
//
// address() is a unique name in a process-wide registry; Connect looks it up.
// A pull runs to its end inside Pull() (Poll/Wait then return at once) with
// the same epoch protocol as UCX: read the promised epochs, copy, read them
// again; kLeaseExpired unless both match (the destination may then hold part
// of the data). A peer whose transport was destroyed gives kPeerLost; a zero
// or negative timeout gives kTimedOut; Cancel and Disconnect find nothing in
// flight. Descriptors and addresses are versioned and validated like UCX's.
//
// Metrics as UCX's, with transport="loopback". Thread-safe. DeregisterRegion
// and the destructor wait for copies that read or write their regions.
#ifndef DUET_KVTRANSFER_LOOPBACK_LOOPBACK_TRANSPORT_H_
#define DUET_KVTRANSFER_LOOPBACK_LOOPBACK_TRANSPORT_H_

#include <functional>

#include "kvtransfer/transport.h"

namespace duet::kvtransfer {

struct LoopbackOptions {
  // Test hook, run inside every pull between its data copy and its second
  // epoch read: lets a test end a lease "during" a pull deterministically.
  std::function<void()> during_pull;
};

KvTransportPtr NewLoopbackTransport(LoopbackOptions options = {});

}  // namespace duet::kvtransfer

#endif  // DUET_KVTRANSFER_LOOPBACK_LOOPBACK_TRANSPORT_H_
