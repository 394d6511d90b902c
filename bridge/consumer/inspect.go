package consumer

import (
	"time"

	"github.com/jetgres/jetgres/bridge/consumer/nextsub"
	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/internal/jswire"
)

// Inspector looks inside a consumer this replica serves, for tests; serving needs none of
// it. It is exported rather than kept in an export_test.go because the tests that need it
// drive the whole bridge (the publish path, the JetStream API, clients over NATS and a
// real PostgreSQL) and so live in package bridge, which only an exported hook reaches: this
// file is the whole of it, and nothing else in the module calls it.
type Inspector struct{ c *consumer }

// Inspect returns an inspector of the consumer called name on the stream called
// streamName, nil when this replica does not serve it.
func (cs *Engine) Inspect(streamName, name string) *Inspector {
	c := cs.find(streamName, name)
	if c == nil {
		return nil
	}
	return &Inspector{c}
}

// Lock holds the consumer as its goroutine holds it while it works, until Unlock.
func (p *Inspector) Lock() { p.c.mu.Lock() }

// Unlock lets the consumer go again.
func (p *Inspector) Unlock() { p.c.mu.Unlock() }

// FillQueue queues acks that ask for nothing until the consumer's queue is full.
func (p *Inspector) FillQueue() {
	for p.c.post(event{kind: evAck, ack: jswire.AckUnknown}) {
	}
}

// ReplayAt is when a consumer with the original replay policy next lets a message go.
func (p *Inspector) ReplayAt() time.Time {
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	return p.c.replay.At()
}

// Stale reports whether the consumer's pending count waits for a recount.
func (p *Inspector) Stale() bool { return p.c.pend.Stale() }

// CursorWrite reports the stream sequence of the floor the cursor writer means to write
// and whether a write is in flight.
func (p *Inspector) CursorWrite() (want uint64, inflight bool) {
	return p.c.cw.Wanted()
}

// Holds reports whether this replica's own subscription to the consumer's pull requests
// receives them: whether it serves the consumer.
func (cs *Engine) Holds(streamName, name string) bool {
	return cs.held.Holds(nextsub.Ref{Stream: streamName, Consumer: name})
}

// OwnershipConfirmed is when the ownership session was last confirmed.
func (cs *Engine) OwnershipConfirmed() time.Time { return cs.keeper.Confirmed() }

// RegistryBusy reports whether the map from streams to their consumers is locked.
func (cs *Engine) RegistryBusy() bool {
	if !cs.mu.TryLock() {
		return true
	}
	cs.mu.Unlock()
	return false
}

// Served counts the consumers of s this replica serves.
func (cs *Engine) Served(s *stream.Stream) int {
	sc := cs.registry(s)
	if sc == nil {
		return 0
	}
	sc.mu.RLock()
	defer sc.mu.RUnlock()
	return len(sc.cons)
}

// PushWatched counts the push consumers whose deliver subjects' interest is watched.
func (cs *Engine) PushWatched() int {
	cs.pushMu.Lock()
	defer cs.pushMu.Unlock()
	return len(cs.pushers)
}
