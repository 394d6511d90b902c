package republish

import "github.com/prometheus/client_golang/prometheus"

// Why a message was not republished, the label values of jetgres_republish_dropped_total.
const (
	reasonQueueFull      = "queue_full"      // Config.QueueBytes
	reasonLink           = "link"            // the link's outbound buffer, or the link gone
	reasonInvalidSubject = "invalid_subject" // a destination nats-server refuses too
)

type republishMetrics struct {
	sent      prometheus.Counter
	dropped   *prometheus.CounterVec
	lookups   *prometheus.CounterVec
	forgotten prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, r *Republisher) *republishMetrics {
	m := &republishMetrics{
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_republished_total",
			Help: "Messages republished by streams with a republish.",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetgres_republish_dropped_total",
			Help: "Stored messages that were not republished, by reason: queue_full, link, invalid_subject.",
		}, []string{"reason"}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetgres_republish_lookups_total",
			Help: "Reads of subjects' last sequences from PostgreSQL for Nats-Last-Sequence, by result.",
		}, []string{"result"}),
		forgotten: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_republish_subjects_forgotten_total",
			Help: "Times a stream forgot its subjects' last sequences because all streams held more than the bound.",
		}),
	}
	for _, reason := range []string{reasonQueueFull, reasonLink, reasonInvalidSubject} {
		m.dropped.WithLabelValues(reason)
	}
	if reg == nil {
		return m
	}
	queued := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "jetgres_republish_queue_bytes",
		Help: "Bytes of messages waiting to be republished.",
	}, func() float64 {
		r.mu.Lock()
		defer r.mu.Unlock()
		return float64(r.bytes)
	})
	reg.MustRegister(m.sent, m.dropped, m.lookups, m.forgotten, queued)
	return m
}
