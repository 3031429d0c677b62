// Host memory that stands for a device's: its pages are inaccessible
// (mprotect PROT_NONE) except while a GuardWindow is open, in any thread,
// so host code that dereferences it at any other time faults, as a host
// dereference of a device pointer does on a GPU; a handler names the address.
//
//   ASSIGN_OR_RETURN(BufferPtr b, GuardedMemoryType().Allocate(bytes, "x"));
//   b->Write(0, host, bytes);            // copies open a window themselves
//   { GuardWindow open; RunOp(b->base()); }   // an op reaches it inside one
//
// What uses it: the tests' protected CPU backend (kernels/testing) and the
// SIMT executor's emulated device memory (kernels/simt). All guarded buffers
// of the process are one domain with one count of open windows: the pages
// open when the first window opens and close when the last one closes.
#ifndef DUET_KERNELS_GUARDED_MEMORY_H_
#define DUET_KERNELS_GUARDED_MEMORY_H_

#include "kernels/buffer.h"

namespace duet::kernels {

// Guarded buffers (IsHost: code inside a window addresses them).
BufferType& GuardedMemoryType();

// Opens every guarded buffer's pages for as long as it lives.
class GuardWindow {
 public:
  GuardWindow();
  ~GuardWindow();
  GuardWindow(const GuardWindow&) = delete;
  GuardWindow& operator=(const GuardWindow&) = delete;
};

// Whether no window is open now: what a test checks before it trusts a run
// without a fault.
bool GuardedMemoryClosed();

}  // namespace duet::kernels

#endif  // DUET_KERNELS_GUARDED_MEMORY_H_
