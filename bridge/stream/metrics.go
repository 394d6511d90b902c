package stream

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/bridge/tailcache"
	"github.com/jetgres/jetgres/pg"
)

// Reject and drop reasons, the label values of jetgres_publish_rejected_total and
// jetgres_publish_dropped_total. The SQL mover refuses staged messages with the same values
// where it refuses them for the same reasons.
const (
	ReasonIntakeFull = "intake_full"
	ReasonIntakeAll  = "intake_total_full"
	ReasonTooLarge   = "too_large"
	ReasonUnstorable = "unstorable"
	ReasonExpected   = "expected_header"
	ReasonDatabase   = "database"
	ReasonStopping   = "stopping"
	ReasonDuplicate  = "duplicate"
	ReasonSealed     = "sealed"
	ReasonLimit      = "limit"     // a discard-new limit
	ReasonNoStream   = "no_stream" // deleted, by another replica, while the publish waited
	// ReasonResources: the streams of the publish's storage type hold more than
	// Config.MaxMemory or Config.MaxStore.
	ReasonResources = "resources"
)

// RefusedReason is the reject reason of one message an append refused, err being its
// outcome's error: the publish path and the SQL mover count refusals alike.
func RefusedReason(err error) string {
	var le *pg.LimitError
	switch {
	case errors.As(err, &le), errors.Is(err, pg.ErrSeqExhausted):
		return ReasonLimit
	case errors.Is(err, pg.ErrNotFound):
		return ReasonNoStream
	}
	return ReasonExpected
}

// What reading back an append transaction whose commit got no answer found, the label values
// of jetgres_publish_outcome_unknown_total.
const (
	foundStored    = "stored"
	foundNotStored = "not_stored"
	foundUnknown   = "unknown"
)

// metrics are the publish path's instruments.
type metrics struct {
	outcomeUnknown *prometheus.CounterVec
	accepted       prometheus.Counter
	rejected       *prometheus.CounterVec
	dropped        *prometheus.CounterVec
	batchMsgs      prometheus.Histogram
	batchTx        prometheus.Histogram
	txMsgs         prometheus.Histogram
	overlaps       prometheus.Counter
	commit         prometheus.Histogram
	pubAck         prometheus.Histogram
	serverChanges  prometheus.Counter
	rewinds        prometheus.Counter
	rewound        prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		outcomeUnknown: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetgres_publish_outcome_unknown_total",
			Help: "Publishes whose transaction's commit got no answer (the connection broke or timed out during it), by what reading it back found: stored (acknowledged), not_stored (answered with an error), unknown (left unanswered, for the client's timeout and retry).",
		}, []string{"found"}),
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
			Help:    "Streams that shared one append transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}),
		overlaps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_fusion_overlaps_total",
			Help: "Append transactions started beside one in flight that had run longer than the flush overlap time (hung on a lock, or a big bundle).",
		}),
		txMsgs: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "jetgres_fusion_transaction_messages",
			Help:    "Messages per append transaction, of all its streams.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 9),
		}),
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "jetgres_fusion_commit_seconds",
			Help:    "Database round trip of one append transaction, from connection to commit.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		pubAck: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "jetgres_publish_ack_seconds",
			Help:    "Producer latency: publish received to PubAck sent (after commit).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		serverChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_database_server_changes_total",
			Help: "Times the database was found served by another PostgreSQL server than before (a standby promoted): what this process held of it in memory was dropped.",
		}),
		rewinds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_database_rewinds_total",
			Help: "Server changes after which the database was behind what this process had seen: an asynchronous standby promoted without the last commits.",
		}),
		rewound: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_database_rewound_messages_total",
			Help: "Sequences this process had seen committed that the database no longer held after a server change, over all streams.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.outcomeUnknown, m.accepted, m.rejected, m.dropped, m.batchMsgs, m.batchTx, m.txMsgs, m.overlaps, m.commit, m.pubAck,
			m.serverChanges, m.rewinds, m.rewound)
	}
	return m
}

// registerTailMetrics registers what the streams' tails hold together under their shared
// bound.
func registerTailMetrics(reg prometheus.Registerer, tails *tailcache.Budget) {
	if reg == nil {
		return
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "jetgres_tail_cache_bytes",
			Help: "Bytes held by all streams' tail caches together (bounded by --tail-total-bytes)."},
			func() float64 { return float64(tails.Used()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "jetgres_tail_cache_total_evictions_total",
			Help: "Messages evicted from a tail cache below its own bound because all tail caches together reached --tail-total-bytes."},
			func() float64 { return float64(tails.Evicted()) }))
}

// registerIntakeMetrics registers what waits for an append transaction: the streams in the
// ready queue (while one is in flight, what arrives for other streams waits for the next)
// and the bytes in all intakes, which IntakeTotalBytes bounds.
func registerIntakeMetrics(reg prometheus.Registerer, r *Registry) {
	if reg == nil {
		return
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "jetgres_fusion_streams_waiting",
			Help: "Streams whose publishes wait for the next append transaction."},
			func() float64 { return float64(r.ready.len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "jetgres_intake_bytes",
			Help: "Bytes of publishes waiting in all streams' intakes for an append transaction (bounded by --intake-total-bytes)."},
			func() float64 { return float64(r.intakeTotal.Load()) }))
}
