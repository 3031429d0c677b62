// Collectives between the ranks of one tensor- or pipeline-parallel
// instance: what the sharded forward pass (engine/model.h, LoadOptions::tp
// and ::pp) exchanges between its ranks.
//
//   std::vector<CommunicatorPtr> comms = NewThreadCommunicators(2);
//   // rank r, on its own thread:
//   comms[r]->AllReduceSum(partial.data(), n);  // every rank: the same sum
//
// The interface is NCCL's shape (all-reduce, send, receive between ranks of
// a group); ThreadCommunicator is its implementation over threads of one
// process, which is what runs TP and PP on the CPU backend (and in CI).
// Every call is a collective or a matched pair: each rank of the group must
// make the same calls in the same order, one thread per rank; a rank's
// communicator is not shared between threads.
#ifndef DUET_KERNELS_COMMUNICATOR_H_
#define DUET_KERNELS_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <vector>

namespace duet::kernels {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Replaces `data` (n floats) on every rank by the element-wise sum over the
  // ranks, added in rank order (((r0 + r1) + r2) ...), so every rank holds
  // the same bits. Returns when every rank's buffer holds the sum.
  virtual void AllReduceSum(float* data, int64_t n) = 0;
  // Point to point: Send copies `n` floats out and returns; Recv waits for
  // the next message from `peer` and copies it into `data`, whose size must
  // be the one sent (a mismatch is a bug: CHECK).
  virtual void Send(int peer, const float* data, int64_t n) = 0;
  virtual void Recv(int peer, float* data, int64_t n) = 0;
};
using CommunicatorPtr = std::unique_ptr<Communicator>;

// `n` communicators of one group over shared memory, rank i at index i.
// They share state, which lives as long as any of them.
std::vector<CommunicatorPtr> NewThreadCommunicators(int n);

}  // namespace duet::kernels

#endif  // DUET_KERNELS_COMMUNICATOR_H_
