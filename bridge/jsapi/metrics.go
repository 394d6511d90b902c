package jsapi

import (
	"github.com/prometheus/client_golang/prometheus"
)

// apiMetrics are the JetStream API's instruments.
type apiMetrics struct {
	reqs *prometheus.CounterVec
	// unsupported counts requests jetgres does not serve, by request; the labels are those
	// of unsupportedRequests, all present from the start.
	unsupported *prometheus.CounterVec
}

func newAPIMetrics(reg prometheus.Registerer) *apiMetrics {
	m := &apiMetrics{
		reqs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetgres_api_requests_total",
			Help: "JetStream API requests, by outcome (ok, error, unavailable: the database could not be reached, overloaded).",
		}, []string{"outcome"}),
		unsupported: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetgres_api_unsupported_total",
			Help: "JetStream API requests jetgres does not serve (answered with err_code 10036), by request.",
		}, []string{"request"}),
	}
	for _, u := range unsupportedRequests {
		m.unsupported.WithLabelValues(u.name)
	}
	if reg != nil {
		reg.MustRegister(m.reqs, m.unsupported)
	}
	return m
}
