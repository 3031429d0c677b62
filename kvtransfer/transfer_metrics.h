// The KV-transfer metrics every transport records (DESIGN.md, Observability):
// duet_kv_transfer_bytes_total and duet_kv_transfer_seconds for completed
// pulls, duet_kv_transfer_failures_total{reason} for the others, and the
// gauge duet_kv_transfers_in_flight, each with the transport's name as its
// `transport` label.
//
//   TransferMetrics metrics("ucx");
//   metrics.Started();        // once per pull, when it is issued
//   metrics.Record(result);   // once per pull, when it ends
//
// Thread-safe (the counters are).
#ifndef DUET_KVTRANSFER_TRANSFER_METRICS_H_
#define DUET_KVTRANSFER_TRANSFER_METRICS_H_

#include <map>
#include <string>

#include "base/metrics.h"
#include "kvtransfer/transport.h"

namespace duet::kvtransfer {

class TransferMetrics {
 public:
  explicit TransferMetrics(const std::string& transport);

  // A pull issued: one more in flight until its Record (or Withdrawn, when
  // the transport refuses it with an error after all).
  void Started();
  void Withdrawn();
  // A terminal result: its bytes and duration when kDone, one failure of its
  // state's reason otherwise; one fewer in flight.
  void Record(const TransferResult& result);

 private:
  Gauge* in_flight_;
  Counter* bytes_total_;
  Histogram* seconds_;
  std::map<TransferState, Counter*> failures_;
};

}  // namespace duet::kvtransfer

#endif  // DUET_KVTRANSFER_TRANSFER_METRICS_H_
