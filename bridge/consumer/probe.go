package consumer

import (
	"time"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/internal/jswire"
)

// Probe looks inside a consumer this replica serves. It is for tests that drive the whole
// bridge through NATS and PostgreSQL and so cannot reach inside this package; serving
// needs none of it.
type Probe struct{ c *consumer }

// Probe returns a probe of the consumer called name on the stream called streamName, nil
// when this replica does not serve it.
func (cs *Engine) Probe(streamName, name string) *Probe {
	c := cs.find(streamName, name)
	if c == nil {
		return nil
	}
	return &Probe{c}
}

// Lock holds the consumer as its goroutine holds it while it works, until Unlock.
func (p *Probe) Lock() { p.c.mu.Lock() }

// Unlock lets the consumer go again.
func (p *Probe) Unlock() { p.c.mu.Unlock() }

// FillQueue queues acks that ask for nothing until the consumer's queue is full.
func (p *Probe) FillQueue() {
	for p.c.post(event{kind: evAck, ack: jswire.AckUnknown}) {
	}
}

// ReplayAt is when a consumer with the original replay policy next lets a message go.
func (p *Probe) ReplayAt() time.Time {
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	return p.c.replay.at
}

// Stale reports whether the consumer's pending count waits for a recount.
func (p *Probe) Stale() bool { return p.c.stale.Load() }

// CursorWrite reports the stream sequence of the floor the cursor writer means to write
// and whether a write is in flight.
func (p *Probe) CursorWrite() (want uint64, inflight bool) {
	p.c.cw.mu.Lock()
	defer p.c.cw.mu.Unlock()
	return p.c.cw.want.Stream, p.c.cw.inflight
}

// Holds reports whether this replica's own subscription to the consumer's pull requests
// receives them: whether it serves the consumer.
func (cs *Engine) Holds(streamName, name string) bool { return cs.held.holds(streamName, name) }

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
