package schedule

import "github.com/prometheus/client_golang/prometheus"

// metrics count what the scheduler does.
type metrics struct {
	fired    prometheus.Counter
	purged   prometheus.Counter
	failures prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		fired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_schedule_fired_total",
			Help: "Messages that message schedules produced on this replica.",
		}),
		purged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_schedule_purges_total",
			Help: "Schedules removed by a Nats-Schedule-Next: purge message, after a one-shot fired or at a client's request.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_schedule_failures_total",
			Help: "Scheduler passes over a stream that failed to read it or fire (tried again the next pass).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.fired, m.purged, m.failures)
	}
	return m
}
