// Package metrics owns the consumer engine's Prometheus instruments: the counters and
// histograms bridge/consumer adds to as it delivers, reads and writes, and the per-consumer
// gauges read at scrape time, whose label cardinality it bounds. It knows nothing of
// consumers: the engine hands it a function that reads their numbers.
//
// # Locks
//
// It has none. Collect calls the engine's function with no lock held; that function takes
// the engine's own, as its package doc orders them.
package metrics

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"
)

// gaugesMax bounds the consumers that get their own pending and ack-pending series: the
// first ones by stream and name. Totals over all consumers are always reported, so the
// label cardinality stays bounded however many consumers exist.
const gaugesMax = 100

// ConsumerGauges are one served consumer's numbers at scrape time.
type ConsumerGauges struct {
	Stream, Consumer             string
	Pending, AckPending, Waiting int
}

// Instruments are the consumer engine's metrics.
type Instruments struct {
	Pulls         prometheus.Counter
	Delivered     prometheus.Counter
	Redeliveries  prometheus.Counter
	Acks          prometheus.Counter
	AcksDropped   prometheus.Counter
	TailHits      prometheus.Counter
	TailMisses    prometheus.Counter
	DBReads       prometheus.Counter
	ReadsShared   prometheus.Counter
	Ticks         prometheus.Counter
	TickReads     prometheus.Counter
	CursorWrites  prometheus.Counter
	Recounts      prometheus.Counter
	RecountsLate  prometheus.Counter
	CursorLatency prometheus.Histogram
	SubLatency    prometheus.Histogram
	E2ELatency    prometheus.Histogram

	PushDelivered prometheus.Counter
	FCRequests    prometheus.Counter
	FCStalls      prometheus.Counter
	FCStallTime   prometheus.Counter
	ReadWaitTime  prometheus.Counter
	Heartbeats    prometheus.Counter

	gauges         func() []ConsumerGauges
	pendingDesc    *prometheus.Desc
	ackPendingDesc *prometheus.Desc
	waitingDesc    *prometheus.Desc
	totalsDesc     *prometheus.Desc
}

// New builds the instruments and registers them with reg, unless it is nil. gauges reads
// every served consumer's numbers at scrape time.
func New(reg prometheus.Registerer, gauges func() []ConsumerGauges) *Instruments {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	latency := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help,
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)})
	}
	m := &Instruments{
		gauges:        gauges,
		Pulls:         counter("jetgres_pull_requests_total", "Pull requests queued at a consumer."),
		Delivered:     counter("jetgres_consumer_delivered_total", "Messages delivered to pull requests and deliver subjects, redeliveries included."),
		Redeliveries:  counter("jetgres_consumer_redelivered_total", "Messages delivered again after ack wait, a nak or a restart."),
		Acks:          counter("jetgres_consumer_acks_total", "Acks that moved a consumer's ack floor."),
		AcksDropped:   counter("jetgres_consumer_acks_dropped_total", "Acks dropped because the consumer's queue was full."),
		TailHits:      counter("jetgres_tail_cache_hits_total", "Consumer reads served by a stream's tail cache."),
		TailMisses:    counter("jetgres_tail_cache_misses_total", "Consumer reads that were behind the tail cache."),
		DBReads:       counter("jetgres_consumer_db_reads_total", "Range reads of PostgreSQL through the pop lane."),
		ReadsShared:   counter("jetgres_consumer_db_reads_shared_total", "Consumer reads of PostgreSQL that joined another consumer's read of the same rows in flight instead of reading them again."),
		Ticks:         counter("jetgres_ticks_total", "Ticker polls of stream high-water marks."),
		TickReads:     counter("jetgres_tick_range_reads_total", "Shared range reads a tick made into a tail cache."),
		CursorWrites:  counter("jetgres_cursor_writes_total", "Consumer cursor (ack floor) writes."),
		Recounts:      counter("jetgres_consumer_pending_recounts_total", "Counts of a consumer's pending messages redone in PostgreSQL after rows were removed."),
		RecountsLate:  counter("jetgres_consumer_pending_recounts_deferred_total", "Consumer passes that put off a stale pending count's recount: after an expensive recount the next waits 4x its duration."),
		CursorLatency: latency("jetgres_cursor_write_seconds", "Cursor write latency, permit wait included."),
		SubLatency:    latency("jetgres_subscriber_latency_seconds", "Subscriber latency: pull request received to its first message sent."),
		E2ELatency:    latency("jetgres_end_to_end_latency_seconds", "End-to-end latency: message stored to first delivered."),
		PushDelivered: counter("jetgres_push_delivered_total", "Messages push consumers delivered to their deliver subjects, redeliveries included (part of jetgres_consumer_delivered_total)."),
		FCRequests:    counter("jetgres_push_flow_control_requests_total", "Flow-control requests push consumers sent."),
		FCStalls:      counter("jetgres_push_flow_control_stalls_total", "Times a push consumer stopped delivering because its client owed the answer to a flow-control request."),
		FCStallTime:   counter("jetgres_push_flow_control_stall_seconds_total", "Time push consumers spent not delivering while their client owed the answer to a flow-control request."),
		ReadWaitTime:  counter("jetgres_consumer_read_wait_seconds_total", "Time consumers spent waiting for a read of PostgreSQL before they could deliver on."),
		Heartbeats:    counter("jetgres_push_heartbeats_total", "Idle heartbeats push consumers sent to their deliver subjects."),
		pendingDesc: prometheus.NewDesc("jetgres_consumer_pending_messages",
			"Messages a consumer has yet to receive (estimate).", []string{"stream", "consumer"}, nil),
		ackPendingDesc: prometheus.NewDesc("jetgres_consumer_ack_pending_messages",
			"Messages delivered and waiting for an ack.", []string{"stream", "consumer"}, nil),
		waitingDesc: prometheus.NewDesc("jetgres_consumer_waiting_requests",
			"Pull requests parked at a consumer.", []string{"stream", "consumer"}, nil),
		totalsDesc: prometheus.NewDesc("jetgres_consumers_total_messages",
			"Sums over every consumer this process serves, by kind (pending, ack_pending, waiting).", []string{"kind"}, nil),
	}
	if reg != nil {
		reg.MustRegister(m.Pulls, m.Delivered, m.Redeliveries, m.Acks, m.AcksDropped, m.TailHits, m.TailMisses,
			m.DBReads, m.ReadsShared, m.Ticks, m.TickReads, m.CursorWrites, m.Recounts, m.RecountsLate, m.CursorLatency, m.SubLatency, m.E2ELatency,
			m.PushDelivered, m.FCRequests, m.FCStalls, m.FCStallTime, m.ReadWaitTime, m.Heartbeats, m)
	}
	return m
}

// Describe implements prometheus.Collector for the per-consumer gauges.
func (m *Instruments) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.pendingDesc
	ch <- m.ackPendingDesc
	ch <- m.waitingDesc
	ch <- m.totalsDesc
}

// Collect implements prometheus.Collector: it reads every consumer's numbers at scrape time.
func (m *Instruments) Collect(ch chan<- prometheus.Metric) {
	rows := m.gauges()
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Stream != rows[j].Stream {
			return rows[i].Stream < rows[j].Stream
		}
		return rows[i].Consumer < rows[j].Consumer
	})
	var pending, ackPending, waits int
	for i, r := range rows {
		pending += r.Pending
		ackPending += r.AckPending
		waits += r.Waiting
		if i >= gaugesMax {
			continue
		}
		ch <- prometheus.MustNewConstMetric(m.pendingDesc, prometheus.GaugeValue, float64(r.Pending), r.Stream, r.Consumer)
		ch <- prometheus.MustNewConstMetric(m.ackPendingDesc, prometheus.GaugeValue, float64(r.AckPending), r.Stream, r.Consumer)
		ch <- prometheus.MustNewConstMetric(m.waitingDesc, prometheus.GaugeValue, float64(r.Waiting), r.Stream, r.Consumer)
	}
	ch <- prometheus.MustNewConstMetric(m.totalsDesc, prometheus.GaugeValue, float64(pending), "pending")
	ch <- prometheus.MustNewConstMetric(m.totalsDesc, prometheus.GaugeValue, float64(ackPending), "ack_pending")
	ch <- prometheus.MustNewConstMetric(m.totalsDesc, prometheus.GaugeValue, float64(waits), "waiting")
}

// Tally counts per message on a consumer's goroutine what it adds to the metrics once
// per queue of events and once per pump: an atomic add per message costs more than the
// counting.
type Tally struct{ Delivered, Pushed, TailHits, Acks int }

// Flush adds what t counted to m and starts t again.
func (t *Tally) Flush(m *Instruments) {
	if t.Delivered > 0 {
		m.Delivered.Add(float64(t.Delivered))
	}
	if t.Pushed > 0 {
		m.PushDelivered.Add(float64(t.Pushed))
	}
	if t.Acks > 0 {
		m.Acks.Add(float64(t.Acks))
	}
	if t.TailHits > 0 {
		m.TailHits.Add(float64(t.TailHits))
	}
	*t = Tally{}
}
