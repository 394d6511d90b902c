// Package nextsub keeps the MSG.NEXT subscriptions of the consumers this replica serves:
// a replica that serves a consumer subscribes its own pull-request subject, so that its
// pull requests reach it wherever the client is connected, as they reach a JetStream
// consumer's leader. It records which consumer holds which subscription, and counts the
// consumers served and those taken over from another replica. The consumer engine
// (bridge/consumer) subscribes and unsubscribes; this package only keeps the record.
//
// # Locks
//
// Held.mu is the only lock, a leaf: nothing is taken while it is held, and subscriptions
// are made and dropped with it released.
package nextsub

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/embedded/leaf"
)

// subjectPrefix begins the subject of a consumer's pull requests, followed by its stream
// and its name.
const subjectPrefix = "$JS.API.CONSUMER.MSG.NEXT."

// Ref names a consumer by its stream's name, as requests do.
type Ref struct{ Stream, Consumer string }

// Subject is the subject of the consumer's pull requests.
func (r Ref) Subject() string { return subjectPrefix + r.Stream + "." + r.Consumer }

// Held is the MSG.NEXT subscriptions of the consumers this replica serves, each recorded
// with the consumer C that holds it.
type Held[C comparable] struct {
	mu   sync.Mutex
	next map[Ref]holding[C]

	served    prometheus.GaugeFunc
	takeovers prometheus.Counter
}

type holding[C comparable] struct {
	c   C
	sub *leaf.Subscription
}

// New builds an empty record and registers its metrics with reg, unless it is nil.
func New[C comparable](reg prometheus.Registerer) *Held[C] {
	h := &Held[C]{
		next: make(map[Ref]holding[C]),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{Name: "jetgres_consumer_takeovers_total",
			Help: "Consumers this replica took over from another replica that had served them."}),
	}
	h.served = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "jetgres_consumers_served",
		Help: "Consumers this replica serves."}, func() float64 { return float64(h.count()) })
	if reg != nil {
		reg.MustRegister(h.served, h.takeovers)
	}
	return h
}

func (h *Held[C]) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.next)
}

// Holds reports whether this replica's own subscription to the consumer's MSG.NEXT subject
// receives its pull requests.
func (h *Held[C]) Holds(r Ref) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.next[r]
	return ok
}

// Put records c's subscription sub and returns the one it replaces, nil if none, for the
// caller to drop.
func (h *Held[C]) Put(r Ref, c C, sub *leaf.Subscription) *leaf.Subscription {
	h.mu.Lock()
	defer h.mu.Unlock()
	old, had := h.next[r]
	h.next[r] = holding[C]{c, sub}
	if !had {
		return nil
	}
	return old.sub
}

// Drop forgets c's subscription and returns it for the caller to drop; nil when c holds
// none (another consumer of the same name may).
func (h *Held[C]) Drop(r Ref, c C) *leaf.Subscription {
	h.mu.Lock()
	defer h.mu.Unlock()
	got, ok := h.next[r]
	if !ok || got.c != c {
		return nil
	}
	delete(h.next, r)
	return got.sub
}

// TookOver counts a consumer taken over from another replica.
func (h *Held[C]) TookOver() { h.takeovers.Inc() }
