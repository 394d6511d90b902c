package consumer

import (
	"github.com/jetgres/jetgres/bridge/consumer/metrics"
)

// gauges reads the numbers of every consumer this replica serves, for a scrape. The
// consumers are listed first and read after: a consumer's mu is held for whole delivery
// batches, and waiting for it with cs.mu held would let a queued writer of cs.mu (a
// consumer being created) block the readers behind it, among them the acks on the link's
// read loop.
func (cs *Engine) gauges() []metrics.ConsumerGauges {
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
	rows := make([]metrics.ConsumerGauges, 0, len(all))
	now := cs.clock.Now()
	for _, sv := range all {
		c := sv.c
		c.mu.Lock()
		rows = append(rows, metrics.ConsumerGauges{Stream: sv.stream, Consumer: c.name, Pending: int(max(c.npc+c.pend.Peek(), 0)),
			AckPending: c.st.NumAckPending(), Waiting: c.out.numWaiting(now)})
		c.mu.Unlock()
	}
	return rows
}
