package consumer

import (
	"context"

	"github.com/jetgres/jetgres/bridge/consumer/ticker"
	"github.com/jetgres/jetgres/bridge/tailcache"
	"github.com/jetgres/jetgres/internal/permit"
	"github.com/jetgres/jetgres/pg"
)

// ticked lists the streams that have consumers served, for the ticker.
func (cs *Engine) ticked() []ticker.TickedStream {
	cs.mu.RLock()
	defer cs.mu.RUnlock()
	var out []ticker.TickedStream
	for _, sc := range cs.streams {
		sc.mu.RLock()
		served := len(sc.cons) > 0
		sc.mu.RUnlock()
		if served {
			out = append(out, sc)
		}
	}
	return out
}

// ID, Name and Tail are the stream's: a stream's consumers are what the ticker polls for.
func (sc *streamConsumers) ID() int64             { return sc.s.ID() }
func (sc *streamConsumers) Name() string          { return sc.s.Name() }
func (sc *streamConsumers) Tail() *tailcache.Tail { return sc.s.Tail() }

// Committed counts rows a tick read into the tail in each consumer's pending count.
func (sc *streamConsumers) Committed(msgs []pg.Message, from uint64) {
	for _, c := range sc.list() {
		c.committed(msgs, from)
	}
}

// WakeParked wakes the consumers waiting for commits.
func (sc *streamConsumers) WakeParked() {
	for _, c := range sc.list() {
		if c.parked.Load() {
			c.signal()
		}
	}
}

// ReadPop is every read of messages behind the tail: a pop lane permit first, then a
// connection; both are given back before it returns.
func (cs *Engine) ReadPop(ctx context.Context, p pg.ReadParams, filters []string) ([]pg.Message, uint64, error) {
	held, err := cs.cfg.Pop.Acquire(ctx)
	if err != nil {
		return nil, 0, err
	}
	msgs, through, rtt, err := cs.db.ReadFiltered(ctx, p, filters)
	permit.Return(held, rtt, err)
	cs.m.DBReads.Inc()
	return msgs, through, err
}
