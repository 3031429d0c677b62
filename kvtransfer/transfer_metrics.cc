#include "kvtransfer/transfer_metrics.h"

namespace duet::kvtransfer {

TransferMetrics::TransferMetrics(const std::string& transport) {
  MetricsRegistry& m = MetricsRegistry::Default();
  const Labels labels = {{"transport", transport}};
  bytes_total_ = m.GetCounter("duet_kv_transfer_bytes_total", "KV cache bytes moved", labels);
  seconds_ = m.GetHistogram("duet_kv_transfer_seconds", "Duration of completed KV pulls", labels,
                            TransferBucketsSeconds());
  in_flight_ = m.GetGauge("duet_kv_transfers_in_flight", "KV pulls issued and not yet ended", labels);
  for (TransferState s : {TransferState::kPeerLost, TransferState::kLeaseExpired, TransferState::kTimedOut,
                          TransferState::kCancelled}) {
    failures_[s] = m.GetCounter("duet_kv_transfer_failures_total", "KV pulls that did not complete",
                                {{"transport", transport}, {"reason", TransferStateName(s)}});
  }
}

void TransferMetrics::Started() { in_flight_->Increment(); }
void TransferMetrics::Withdrawn() { in_flight_->Decrement(); }

void TransferMetrics::Record(const TransferResult& r) {
  in_flight_->Decrement();
  if (r.state == TransferState::kDone) {
    bytes_total_->Increment(static_cast<double>(r.bytes));
    seconds_->Observe(absl::ToDoubleSeconds(r.duration));
  } else if (auto it = failures_.find(r.state); it != failures_.end()) {
    it->second->Increment();
  }
}

}  // namespace duet::kvtransfer
