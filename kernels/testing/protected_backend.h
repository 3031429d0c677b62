// A test backend over another (the CPU one) whose buffers are guarded
// memory (kernels/guarded_memory.h): inaccessible whenever none of its ops,
// nor one of its buffers' copies, is running, so whoever touches a buffer's
// memory outside them (an engine loop over the activations, a read of the
// KV pool) faults, and the handler names the address. What a device
// backend's memory would be to the host, on a CPU.
//
//   kernels::ProtectedBackend be(kernels::NewCpuBackend(2));
//   model = Model::Load(dir, &be); BlockPool pool(layout, blocks, be.DefaultBufferType());
//   model->Forward(batch, pool);   // faults if the engine reads or writes memory itself
//
// Guarded memory is one domain for the process: while one rank of a sharded
// model runs an op, every guarded page is open, so the ranks (each with a
// backend of its own) reach one another's buffers in their collectives and
// share the caller's KV pool, and the others' host code is not caught then.
// Only ops and copies may reach a protected buffer's base(): a transport
// that registers a pool's memory and reads it itself would fault, so none
// is given one.
#ifndef DUET_KERNELS_TESTING_PROTECTED_BACKEND_H_
#define DUET_KERNELS_TESTING_PROTECTED_BACKEND_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/synchronization/mutex.h"
#include "kernels/forwarding_backend.h"
#include "kernels/guarded_memory.h"

namespace duet::kernels {

class ProtectedBackend final : public ForwardingBackend {
 public:
  explicit ProtectedBackend(KernelBackendPtr inner) : ForwardingBackend(std::move(inner)) {}

  std::string Name() const override { return "protected(" + ForwardingBackend::Name() + ")"; }
  BufferType& DefaultBufferType() override { return GuardedMemoryType(); }
  // How many times each op (kOpNames) has run.
  std::map<std::string, int64_t> calls() const;

 protected:
  void Call(const char* op, absl::FunctionRef<void()> run) override;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, int64_t> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace duet::kernels

#endif  // DUET_KERNELS_TESTING_PROTECTED_BACKEND_H_
