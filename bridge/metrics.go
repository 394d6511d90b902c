package bridge

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Reject and drop reasons, the label values of jetgres_publish_rejected_total and
// jetgres_publish_dropped_total. The SQL mover (bridge/sqlmove) counts its refusals with
// the same values for the same reasons, spelled there again: change them together.
const (
	reasonIntakeFull = "intake_full"
	reasonIntakeAll  = "intake_total_full"
	reasonTooLarge   = "too_large"
	reasonUnstorable = "unstorable"
	reasonExpected   = "expected_header"
	reasonDatabase   = "database"
	reasonStopping   = "stopping"
	reasonDuplicate  = "duplicate"
	reasonSealed     = "sealed"
	reasonNoStream   = "no_stream"
)

// publishMetrics are the publish path's instruments.
type publishMetrics struct {
	accepted  prometheus.Counter
	rejected  *prometheus.CounterVec
	dropped   *prometheus.CounterVec
	batchMsgs prometheus.Histogram
	batchTx   prometheus.Histogram
	txMsgs    prometheus.Histogram
	overlaps  prometheus.Counter
	// retentionPasses counts interest and work-queue retention passes.
	retentionPasses prometheus.Counter
	commit          prometheus.Histogram
	pubAck          prometheus.Histogram
	apiReqs         *prometheus.CounterVec
	// apiUnsupported counts requests jetgres does not serve, by request; the labels are
	// those of unsupportedRequests, all present from the start.
	apiUnsupported *prometheus.CounterVec
}

func newPublishMetrics(reg prometheus.Registerer) *publishMetrics {
	m := &publishMetrics{
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_publish_accepted_total",
			Help: "Publishes stored in a committed transaction (duplicates included).",
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetgres_publish_rejected_total",
			Help: "Publishes answered with an error, by reason.",
		}, []string{"reason"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetgres_publish_dropped_total",
			Help: "Publishes without a reply subject that could not be stored, by reason.",
		}, []string{"reason"}),
		batchMsgs: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "jetgres_fusion_batch_messages",
			Help:    "Messages per stream per flush.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 9),
		}),
		batchTx: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "jetgres_fusion_streams_per_transaction",
			Help:    "Streams that shared one push transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}),
		retentionPasses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_retention_passes_total",
			Help: "Retention passes over interest and work-queue streams: each reads the stream's consumers and removes what none of them needs.",
		}),
		overlaps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_fusion_overlaps_total",
			Help: "Push transactions started beside one in flight that had run longer than the flush overlap time (hung on a lock, or a big bundle).",
		}),
		txMsgs: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "jetgres_fusion_transaction_messages",
			Help:    "Messages per push transaction, of all its streams.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 9),
		}),
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "jetgres_fusion_commit_seconds",
			Help:    "Database round trip of one push transaction, from connection to commit.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		pubAck: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "jetgres_publish_ack_seconds",
			Help:    "Producer latency: publish received to PubAck sent (after commit).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		apiReqs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetgres_api_requests_total",
			Help: "JetStream API requests, by outcome (ok, error, unavailable: the database could not be reached, overloaded).",
		}, []string{"outcome"}),
		apiUnsupported: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetgres_api_unsupported_total",
			Help: "JetStream API requests jetgres does not serve (answered with err_code 10036), by request.",
		}, []string{"request"}),
	}
	for _, u := range unsupportedRequests {
		m.apiUnsupported.WithLabelValues(u.name)
	}
	if reg != nil {
		reg.MustRegister(m.accepted, m.rejected, m.dropped, m.batchMsgs, m.batchTx, m.txMsgs, m.overlaps, m.retentionPasses, m.commit, m.pubAck, m.apiReqs, m.apiUnsupported)
	}
	return m
}
