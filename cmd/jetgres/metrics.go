package main

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/embedded/localpg"
	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/pg"
)

// Components keep plain Stats structs and no Prometheus import; the collectors here read
// those at scrape time, so a scrape costs the hot path nothing. Each component's collector is
// registered once it has started.

// newRegistry returns a registry with the metrics of the process itself.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfoCollector(readBuildInfo()),
	)
	return reg
}

func laneCollector(l *flow.Lane) prometheus.Collector {
	return newStatsCollector("jetgres_"+l.Name()+"_", l.Stats, laneMetrics(l.Name()))
}

func poolCollector(db *pg.DB) prometheus.Collector {
	return newStatsCollector("jetgres_pg_pool_", db.Stats, poolMetrics)
}

func leafCollector(c *leaf.Conn) prometheus.Collector {
	return newStatsCollector("jetgres_leaf_", c.Stats, leafMetrics)
}

func buildInfoCollector(b buildInfo) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "jetgres_build_info",
		Help: "Always 1; the labels say which build is running.",
		ConstLabels: prometheus.Labels{
			"version":   b.Version,
			"revision":  b.Revision,
			"goversion": b.GoVersion,
		},
	})
	g.Set(1)
	return g
}

// statMetric is one metric read from a Stats struct of type S.
type statMetric[S any] struct {
	name  string // after the collector's prefix
	help  string
	kind  prometheus.ValueType
	value func(S) float64
}

// statsCollector exports a component's Stats: one Stats call per scrape, however many
// metrics it feeds.
type statsCollector[S any] struct {
	stats   func() S
	metrics []statMetric[S]
	descs   []*prometheus.Desc
}

func newStatsCollector[S any](prefix string, stats func() S, metrics []statMetric[S]) *statsCollector[S] {
	c := &statsCollector[S]{stats: stats, metrics: metrics}
	for _, m := range metrics {
		c.descs = append(c.descs, prometheus.NewDesc(prefix+m.name, m.help, nil, nil))
	}
	return c
}

func (c *statsCollector[S]) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *statsCollector[S]) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	for i, m := range c.metrics {
		ch <- prometheus.MustNewConstMetric(c.descs[i], m.kind, m.value(s))
	}
}

func laneMetrics(lane string) []statMetric[flow.LaneStats] {
	return []statMetric[flow.LaneStats]{
		{"vegas_limit", "Current Vegas limit of the " + lane + " lane: permits that may be out at once.",
			prometheus.GaugeValue, func(s flow.LaneStats) float64 { return float64(s.Limit) }},
		{"vegas_in_flight", "Permits of the " + lane + " lane held right now.",
			prometheus.GaugeValue, func(s flow.LaneStats) float64 { return float64(s.InFlight) }},
		{"vegas_rtt_base_seconds", "Minimum database round trip of the " + lane + " lane over the last minute.",
			prometheus.GaugeValue, func(s flow.LaneStats) float64 { return s.RTTBase.Seconds() }},
		{"permit_waiting", "Callers of the " + lane + " lane waiting for a permit right now.",
			prometheus.GaugeValue, func(s flow.LaneStats) float64 { return float64(s.Waiting) }},
		{"permits_acquired_total", "Permits of the " + lane + " lane handed out.",
			prometheus.CounterValue, func(s flow.LaneStats) float64 { return float64(s.Acquired) }},
		{"permit_try_failed_total", "Non-blocking permit requests of the " + lane + " lane that found none free.",
			prometheus.CounterValue, func(s flow.LaneStats) float64 { return float64(s.TryFailed) }},
		{"permits_failed_total", "Operations of the " + lane + " lane the database did not answer at all (no connection, or a broken one); each may step the limit down.",
			prometheus.CounterValue, func(s flow.LaneStats) float64 { return float64(s.Failed) }},
		{"permit_wait_seconds_total", "Time callers spent waiting for a permit of the " + lane + " lane.",
			prometheus.CounterValue, func(s flow.LaneStats) float64 { return s.WaitTotal.Seconds() }},
	}
}

var poolMetrics = []statMetric[pg.Stats]{
	{"acquired_conns", "Connections in use now.",
		prometheus.GaugeValue, func(s pg.Stats) float64 { return float64(s.Acquired) }},
	{"idle_conns", "Connections idle in the pool.",
		prometheus.GaugeValue, func(s pg.Stats) float64 { return float64(s.Idle) }},
	{"total_conns", "Open connections, including those being established.",
		prometheus.GaugeValue, func(s pg.Stats) float64 { return float64(s.Total) }},
	{"max_conns", "Most connections the pool opens (--pool-size).",
		prometheus.GaugeValue, func(s pg.Stats) float64 { return float64(s.Max) }},
	{"acquires_total", "Connections handed out.",
		prometheus.CounterValue, func(s pg.Stats) float64 { return float64(s.AcquireCount) }},
	{"empty_acquires_total", "Connections handed out after a wait because none was idle.",
		prometheus.CounterValue, func(s pg.Stats) float64 { return float64(s.EmptyAcquireCount) }},
	{"acquire_wait_seconds_total", "Time spent waiting for a connection.",
		prometheus.CounterValue, func(s pg.Stats) float64 { return s.AcquireWait.Seconds() }},
	{"statement_timeouts_total", "Calls that ran past their statement timeout.",
		prometheus.CounterValue, func(s pg.Stats) float64 { return float64(s.Timeouts) }},
	{"acquire_timeouts_total", "Calls whose wait for a connection ran past the timeout.",
		prometheus.CounterValue, func(s pg.Stats) float64 { return float64(s.AcquireTimeouts) }},
	{"destroyed_conns_total", "Connections destroyed after a timeout, a cancellation or a broken state.",
		prometheus.CounterValue, func(s pg.Stats) float64 { return float64(s.Destroyed) }},
	{"stale_retries_total", "Calls retried on a fresh connection because the pooled one was dead before use.",
		prometheus.CounterValue, func(s pg.Stats) float64 { return float64(s.StaleRetries) }},
	{"prepares_total", "Statements prepared on pooled connections. Publishes, reads and gets use a fixed set whatever the number of streams and chunks; maintenance and administration name chunk tables and prepare per chunk.",
		prometheus.CounterValue, func(s pg.Stats) float64 { return float64(s.Prepares) }},
	{"subject_index_dropped_total", "Subject indexes of per-subject-limited streams dropped for going past their row bound.",
		prometheus.CounterValue, func(s pg.Stats) float64 { return float64(s.SubjectIndexDropped) }},
	{"subject_count_dropped_total", "Subject sets of stream infos not kept for going past their byte bound.",
		prometheus.CounterValue, func(s pg.Stats) float64 { return float64(s.SubjectCountDropped) }},
	{"derived_lasts_dropped_total", "Counter streams whose subjects' last values were not kept in memory for going past their bound; their increments then read them in PostgreSQL.",
		prometheus.CounterValue, func(s pg.Stats) float64 { return float64(s.DerivedLastsDropped) }},
}

var leafMetrics = []statMetric[leaf.LinkStats]{
	{"in_msgs_total", "Messages the bridge received over its leafnode link.",
		prometheus.CounterValue, func(s leaf.LinkStats) float64 { return float64(s.InMsgs) }},
	{"in_bytes_total", "Message bytes, headers included, the bridge received over its leafnode link.",
		prometheus.CounterValue, func(s leaf.LinkStats) float64 { return float64(s.InBytes) }},
	{"out_msgs_total", "Messages the bridge sent over its leafnode link.",
		prometheus.CounterValue, func(s leaf.LinkStats) float64 { return float64(s.OutMsgs) }},
	{"out_bytes_total", "Message bytes, headers included, the bridge sent over its leafnode link.",
		prometheus.CounterValue, func(s leaf.LinkStats) float64 { return float64(s.OutBytes) }},
	{"dropped_msgs_total", "Inbound messages no bridge subscription took.",
		prometheus.CounterValue, func(s leaf.LinkStats) float64 { return float64(s.Dropped) }},
	{"slow_consumer_total", "Publishes refused because the link's write buffer was full.",
		prometheus.CounterValue, func(s leaf.LinkStats) float64 { return float64(s.SlowConsumer) }},
}

// clusterCollectors report on the private PostgreSQL's supervision.
func clusterCollectors(c *localpg.Cluster) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "jetgres_private_postgres_up",
			Help: "1 while the private PostgreSQL runs and accepts connections, 0 while it is being restarted.",
		}, func() float64 {
			if c.Up() {
				return 1
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "jetgres_private_postgres_restarts_total",
			Help: "Restarts of the private PostgreSQL after it exited on its own.",
		}, func() float64 { return float64(c.Restarts()) }),
	}
}
