package consumer

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"
)

// consumerGaugesMax bounds the consumers that get their own pending and ack-pending series:
// the first ones by stream and name. Totals over all consumers are always reported, so the
// label cardinality stays bounded however many consumers exist.
const consumerGaugesMax = 100

// consumerMetrics are the read path's instruments.
type consumerMetrics struct {
	side *Engine

	pulls         prometheus.Counter
	delivered     prometheus.Counter
	redeliveries  prometheus.Counter
	acks          prometheus.Counter
	acksDropped   prometheus.Counter
	tailHits      prometheus.Counter
	tailMisses    prometheus.Counter
	dbReads       prometheus.Counter
	readsShared   prometheus.Counter
	ticks         prometheus.Counter
	tickReads     prometheus.Counter
	cursorWrites  prometheus.Counter
	recounts      prometheus.Counter
	recountsLate  prometheus.Counter
	cursorLatency prometheus.Histogram
	subLatency    prometheus.Histogram
	e2eLatency    prometheus.Histogram

	pushDelivered prometheus.Counter
	fcRequests    prometheus.Counter
	fcStalls      prometheus.Counter
	heartbeats    prometheus.Counter

	pendingDesc    *prometheus.Desc
	ackPendingDesc *prometheus.Desc
	waitingDesc    *prometheus.Desc
	totalsDesc     *prometheus.Desc
}

func newConsumerMetrics(reg prometheus.Registerer, side *Engine) *consumerMetrics {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	latency := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help,
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)})
	}
	m := &consumerMetrics{
		side:          side,
		pulls:         counter("jetgres_pull_requests_total", "Pull requests queued at a consumer."),
		delivered:     counter("jetgres_consumer_delivered_total", "Messages delivered to pull requests and deliver subjects, redeliveries included."),
		redeliveries:  counter("jetgres_consumer_redelivered_total", "Messages delivered again after ack wait, a nak or a restart."),
		acks:          counter("jetgres_consumer_acks_total", "Acks that moved a consumer's ack floor."),
		acksDropped:   counter("jetgres_consumer_acks_dropped_total", "Acks dropped because the consumer's queue was full."),
		tailHits:      counter("jetgres_tail_cache_hits_total", "Consumer reads served by a stream's tail cache."),
		tailMisses:    counter("jetgres_tail_cache_misses_total", "Consumer reads that were behind the tail cache."),
		dbReads:       counter("jetgres_consumer_db_reads_total", "Range reads of PostgreSQL through the pop lane."),
		readsShared:   counter("jetgres_consumer_db_reads_shared_total", "Consumer reads of PostgreSQL that joined another consumer's read of the same rows in flight instead of reading them again."),
		ticks:         counter("jetgres_ticks_total", "Ticker polls of stream high-water marks."),
		tickReads:     counter("jetgres_tick_range_reads_total", "Shared range reads a tick made into a tail cache."),
		cursorWrites:  counter("jetgres_cursor_writes_total", "Consumer cursor (ack floor) writes."),
		recounts:      counter("jetgres_consumer_pending_recounts_total", "Counts of a consumer's pending messages redone in PostgreSQL after rows were removed."),
		recountsLate:  counter("jetgres_consumer_pending_recounts_deferred_total", "Consumer passes that put off a stale pending count's recount: after an expensive recount the next waits 4x its duration."),
		cursorLatency: latency("jetgres_cursor_write_seconds", "Cursor write latency, permit wait included."),
		subLatency:    latency("jetgres_subscriber_latency_seconds", "Subscriber latency: pull request received to its first message sent."),
		e2eLatency:    latency("jetgres_end_to_end_latency_seconds", "End-to-end latency: message stored to first delivered."),
		pushDelivered: counter("jetgres_push_delivered_total", "Messages push consumers delivered to their deliver subjects, redeliveries included (part of jetgres_consumer_delivered_total)."),
		fcRequests:    counter("jetgres_push_flow_control_requests_total", "Flow-control requests push consumers sent."),
		fcStalls:      counter("jetgres_push_flow_control_stalls_total", "Times a push consumer stopped delivering because its client owed the answer to a flow-control request."),
		heartbeats:    counter("jetgres_push_heartbeats_total", "Idle heartbeats push consumers sent to their deliver subjects."),
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
		reg.MustRegister(m.pulls, m.delivered, m.redeliveries, m.acks, m.acksDropped, m.tailHits, m.tailMisses,
			m.dbReads, m.readsShared, m.ticks, m.tickReads, m.cursorWrites, m.recounts, m.recountsLate, m.cursorLatency, m.subLatency, m.e2eLatency,
			m.pushDelivered, m.fcRequests, m.fcStalls, m.heartbeats, m)
	}
	return m
}

// Describe implements prometheus.Collector for the per-consumer gauges.
func (m *consumerMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.pendingDesc
	ch <- m.ackPendingDesc
	ch <- m.waitingDesc
	ch <- m.totalsDesc
}

// Collect implements prometheus.Collector: it reads every consumer's numbers at scrape time.
func (m *consumerMetrics) Collect(ch chan<- prometheus.Metric) {
	cs := m.side
	if cs == nil {
		return
	}
	type row struct {
		stream, name               string
		pending, ackPending, waits int
	}
	// The consumers are listed first and read after: a consumer's mu is held for whole
	// delivery batches, and waiting for it with cs.mu held would let a queued writer of
	// cs.mu (a consumer being created) block the readers behind it, among them the acks on
	// the link's read loop.
	type served struct {
		stream string
		c      *consumer
	}
	var all []served
	cs.mu.RLock()
	for s, sc := range cs.streams {
		for _, c := range sc.list() {
			all = append(all, served{s.Name(), c})
		}
	}
	cs.mu.RUnlock()
	rows := make([]row, 0, len(all))
	now := cs.clock.Now()
	for _, sv := range all {
		c := sv.c
		c.mu.Lock()
		rows = append(rows, row{sv.stream, c.name, int(max(c.npc+c.pend.Peek(), 0)), c.st.NumAckPending(), c.out.numWaiting(now)})
		c.mu.Unlock()
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].stream != rows[j].stream {
			return rows[i].stream < rows[j].stream
		}
		return rows[i].name < rows[j].name
	})
	var pending, ackPending, waits int
	for i, r := range rows {
		pending += r.pending
		ackPending += r.ackPending
		waits += r.waits
		if i >= consumerGaugesMax {
			continue
		}
		ch <- prometheus.MustNewConstMetric(m.pendingDesc, prometheus.GaugeValue, float64(r.pending), r.stream, r.name)
		ch <- prometheus.MustNewConstMetric(m.ackPendingDesc, prometheus.GaugeValue, float64(r.ackPending), r.stream, r.name)
		ch <- prometheus.MustNewConstMetric(m.waitingDesc, prometheus.GaugeValue, float64(r.waits), r.stream, r.name)
	}
	ch <- prometheus.MustNewConstMetric(m.totalsDesc, prometheus.GaugeValue, float64(pending), "pending")
	ch <- prometheus.MustNewConstMetric(m.totalsDesc, prometheus.GaugeValue, float64(ackPending), "ack_pending")
	ch <- prometheus.MustNewConstMetric(m.totalsDesc, prometheus.GaugeValue, float64(waits), "waiting")
}

// tally counts per message on the consumer's goroutine what it adds to the metrics once
// per queue of events and once per pump: an atomic add per message costs more than the
// counting.
type tally struct{ delivered, pushed, tailHits, acks int }

func (t *tally) flush(m *consumerMetrics) {
	if t.delivered > 0 {
		m.delivered.Add(float64(t.delivered))
	}
	if t.pushed > 0 {
		m.pushDelivered.Add(float64(t.pushed))
	}
	if t.acks > 0 {
		m.acks.Add(float64(t.acks))
	}
	if t.tailHits > 0 {
		m.tailHits.Add(float64(t.tailHits))
	}
	*t = tally{}
}
