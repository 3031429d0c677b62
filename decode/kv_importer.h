// KvImporter: how the batch engine gets the KV of a request that another
// worker computed (the decode side of disaggregation). The engine reserves
// the blocks, then Start()s the import and Poll()s it once per step while it
// decodes other requests; KvPuller (kv_puller.h) implements it with a
// kvtransfer pull, tests with fakes.
//
//   RETURN_IF_ERROR(importer->Start(id, seq.block_table()));
//   if (auto done = importer->Poll(id)) { /* *done: OK or why it failed */ }
//
// Called only from the engine's thread.
#ifndef DUET_DECODE_KV_IMPORTER_H_
#define DUET_DECODE_KV_IMPORTER_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace duet::decode {

class KvImporter {
 public:
  virtual ~KvImporter() = default;
  // Starts filling `blocks` (the request's block table, covering at least its
  // imported positions) with request_id's KV; returns at once. An error ends
  // the request and its message reaches the router.
  virtual absl::Status Start(uint64_t request_id, absl::Span<const int32_t> blocks) = 0;
  // nullopt while in flight; OK once the blocks hold the KV; an error (its
  // code and message for the router) when the import failed. Either way the
  // import is over and forgotten.
  virtual std::optional<absl::Status> Poll(uint64_t request_id) = 0;
  // The request ends before its import did (cancel, error, shutdown):
  // stop any transfer and tell the source. Returns only once nothing writes
  // the request's blocks any more, because the caller frees them next.
  // Unknown ids are ignored.
  virtual void Abandon(uint64_t request_id) = 0;
};

}  // namespace duet::decode

#endif  // DUET_DECODE_KV_IMPORTER_H_
