package consumer

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jetgres/jetgres/bridge/consumerstate"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/internal/permit"
	"github.com/jetgres/jetgres/internal/wake"
	"github.com/jetgres/jetgres/pg"
)

const (
	// CursorIntervalDefault is the least time between two writes of one consumer's ack
	// floor that no double ack waits for. A floor that moves with every ack would otherwise
	// cost PostgreSQL a commit per round trip: 1,300 commits and a third of its CPU while one
	// consumer drains 200,000 messages. JetStream's file store paces consumer state the same
	// way (100 ms). After a crash the acks since the last write are delivered again, which
	// at-least-once allows: those of about one interval and the write in flight, more while
	// the database fails. A double ack is written at once.
	CursorIntervalDefault = 50 * time.Millisecond

	// cursorRetry is how long a failed cursor write waits before it is tried again.
	cursorRetry = 250 * time.Millisecond
)

// onAck runs on the link's read loop: it routes an ack to its consumer's queue, behind that
// consumer's earlier pull requests and acks. Acks for consumers another replica serves are
// that replica's; it received them too.
//
// m is borrowed from the link's read buffer (acks come by the hundred thousand a second,
// and most are a subject and nothing else), so whatever outlives the call is copied: the
// reply of a double ack and the body of an ack that carries arguments.
func (cs *Engine) onAck(m *leaf.Msg) {
	a, ok := jswire.ParseAckSubject(m.Subject)
	if !ok {
		return
	}
	s := cs.cfg.Streams.Lookup(a.Stream)
	if s == nil {
		return
	}
	c := cs.served(s, a.Consumer)
	name := a.Consumer
	if c != nil {
		name = c.name
	} else {
		name = strings.Clone(name)
	}
	cs.cfg.Retention.NoteAck(s, name, a.StreamSeq, m.Data)
	if c == nil {
		return
	}
	ev := event{kind: evAck, ack: jswire.ClassifyAck(m.Data), sseq: a.StreamSeq, dseq: a.ConsumerSeq}
	switch ev.ack {
	case jswire.AckUnknown:
		return
	case jswire.AckNextKind, jswire.AckNakKind:
		ev.data = bytes.Clone(m.Data)
	}
	if m.Reply != "" {
		ev.reply = strings.Clone(m.Reply)
	}
	if !c.post(ev) {
		cs.m.acksDropped.Inc()
	}
}

// handleAck applies one ack to the state. Called on the consumer's goroutine with mu held.
func (c *consumer) handleAck(ctx context.Context, ev *event, now time.Time) {
	body := ev.data
	switch ev.ack {
	case jswire.AckPositive, jswire.AckTermKind:
		c.ack(ev.sseq, ev.dseq, ev.reply, now)
	case jswire.AckNextKind:
		c.ack(ev.sseq, ev.dseq, "", now)
		if ev.reply != "" {
			c.out.request(c, ev.reply, body[len(jswire.AckNext):], now)
		}
	case jswire.AckNakKind:
		c.st.Nak(ev.sseq, ev.dseq, jswire.NakDelay(body[len(jswire.AckNak):]), now)
		c.replyAck(ev.reply)
	case jswire.AckWPIKind:
		c.st.Progress(ev.sseq, now)
		c.replyAck(ev.reply)
	}
}

// ack acknowledges a delivery. With a reply (a double ack) the answer waits until the ack
// floor that covers it is written to PostgreSQL: that is the durable ack. An ack above a
// floor that did not move is kept in memory only and answered at once; one that moved the
// floor without reaching it (a filtered consumer's floor passes over other subjects' messages
// below a delivery still pending) waits for that floor only, which is all that will be
// written until the pending delivery is acked.
func (c *consumer) ack(sseq, dseq uint64, reply string, now time.Time) {
	if !c.st.Ack(sseq, dseq, now) {
		c.replyAck(reply)
		return
	}
	c.tally.acks++
	// The cursor writer hears of the new floor once the whole queue is handled: acks
	// arrive by the hundred per wake.
	c.ackedFloor = true
	if reply != "" {
		c.cw.await(c, min(sseq, c.st.AckFloor().Stream), reply)
	}
}

func (c *consumer) replyAck(reply string) {
	if reply != "" {
		_ = c.cs.link.Publish(reply, "", nil, nil)
	}
}

// cursorWriter persists a consumer's ack floor. Writes are fused: while one is in flight the
// floor keeps moving in memory, and the next write takes the latest floor. At most one is in
// flight per consumer, and one per Config.CursorInterval unless a double ack waits.
//
// A write no double ack waits for is lazy (pg.CursorParams.Lazy): it does not wait for the
// WAL flush, which cost PostgreSQL nearly as much CPU as all of its reads while a consumer
// acked every message. Losing it in a crash of PostgreSQL only redelivers, and the next
// write that a double ack waits for flushes it with its own commit.
type cursorWriter struct {
	mu      sync.Mutex
	want    consumerstate.Pair
	written consumerstate.Pair
	// wantShown is the stream sequence consumer info reports for want (see
	// consumerstate.State.Shown); it moves only with the floor, so want decides a write.
	wantShown uint64
	// lazy says the last write was lazy, and durable is then the stream sequence of the
	// last floor known flushed: only that answers a double ack.
	lazy     bool
	durable  uint64
	inflight bool
	waiters  []cursorWaiter
	wg       sync.WaitGroup
	// hurry wakes a writer waiting out the pace: a double ack arrived.
	hurry chan struct{}
	// lastWrite is when the last write started; only the writer in flight touches it.
	lastWrite time.Time
}

type cursorWaiter struct {
	seq   uint64
	reply string
}

// floorMoved schedules a cursor write of the current floor.
func (c *consumer) floorMoved() {
	f := c.st.AckFloor()
	_, shown := c.st.Shown()
	w := &c.cw
	w.mu.Lock()
	w.want, w.wantShown = f, shown.Stream
	c.startWriter()
}

// startWriter starts the writer unless it runs or has nothing to do. Called with cw.mu
// held; it releases it.
func (c *consumer) startWriter() {
	w := &c.cw
	start := !w.inflight && (w.want != w.written || w.owed())
	if start {
		w.inflight = true
		w.wg.Add(1)
	}
	w.mu.Unlock()
	if start && !c.cs.g.Go(c.writeCursors) {
		// Stopping: the final write is flushCursor's.
		w.mu.Lock()
		w.inflight = false
		w.mu.Unlock()
		w.wg.Done()
	}
}

// await answers reply once a flushed floor covers stream sequence seq.
func (w *cursorWriter) await(c *consumer, seq uint64, reply string) {
	w.mu.Lock()
	if w.flushed() >= seq {
		w.mu.Unlock()
		c.replyAck(reply)
		return
	}
	w.waiters = append(w.waiters, cursorWaiter{seq: seq, reply: reply})
	if w.written.Stream >= seq {
		// A floor written lazily covers seq: the writer writes it again, flushed. Otherwise
		// the ack moved the floor past what is written, and floorMoved starts the write.
		c.startWriter()
	} else {
		w.mu.Unlock()
	}
	wake.Poke(w.hurry)
}

// flushed is the stream sequence of the last floor written and flushed. Called with mu held.
func (w *cursorWriter) flushed() uint64 {
	if w.lazy {
		return w.durable
	}
	return w.written.Stream
}

// owed reports whether a double ack waits for a floor that is written but not flushed.
// Called with mu held.
func (w *cursorWriter) owed() bool {
	return w.lazy && slices.ContainsFunc(w.waiters, func(x cursorWaiter) bool { return x.seq <= w.written.Stream })
}

// writeCursors writes the latest floor until what is written is what is wanted. It takes
// an ack lane permit per write: cursor writes commit like publishes, but their short round
// trips would set the append lane's rtt_base, and they are not reads for the pop lane.
func (c *consumer) writeCursors() {
	w := &c.cw
	defer w.wg.Done()
	ctx := c.cs.ctx
	for {
		w.mu.Lock()
		f, shown := w.want, w.wantShown
		if (f == w.written && !w.owed()) || ctx.Err() != nil || c.gone() {
			w.inflight = false
			w.mu.Unlock()
			return
		}
		// A stopping consumer writes at once: shutdown waits for it.
		hurried := len(w.waiters) > 0 || stopReason(c.stopR.Load()) != stopNone
		w.mu.Unlock()
		if !hurried && c.pace(ctx) {
			continue
		}
		w.lastWrite = c.cs.clock.Now()
		err := c.writeCursor(ctx, f, shown, !hurried)
		if lost := errors.Is(err, pg.ErrNotOwner); lost || (err != nil && ctx.Err() != nil) {
			if lost {
				c.stop(stopLost)
			}
			w.mu.Lock()
			w.inflight = false
			w.mu.Unlock()
			return
		}
		if err != nil {
			c.cs.log.Warn("cursor write failed", "stream", c.sc.s.Name(), "consumer", c.name, "err", err)
			t := c.cs.clock.NewTimer(cursorRetry)
			select {
			case <-ctx.Done():
			case <-t.C():
			}
			t.Stop()
			continue
		}
		w.mu.Lock()
		if hurried {
			w.lazy = false
		} else if !w.lazy {
			w.lazy, w.durable = true, w.written.Stream
		}
		w.written = f
		var due []cursorWaiter
		kept := w.waiters[:0]
		for _, x := range w.waiters {
			if x.seq <= w.flushed() {
				due = append(due, x)
			} else {
				kept = append(kept, x)
			}
		}
		w.waiters = kept
		w.mu.Unlock()
		for _, x := range due {
			c.replyAck(x.reply)
		}
	}
}

// gone reports whether the consumer was deleted or taken over: its cursor is not ours to write.
func (c *consumer) gone() bool {
	r := stopReason(c.stopR.Load())
	return r == stopDeleted || r == stopLost
}

// pace waits until the cursor interval has passed since the last write, a double ack
// arrives, the consumer stops or ctx ends. It reports whether it waited: the floor may have
// moved since, and the consumer may be gone.
func (c *consumer) pace(ctx context.Context) bool {
	d := c.cw.lastWrite.Add(c.cs.cfg.CursorInterval).Sub(c.cs.clock.Now())
	if d <= 0 {
		return false
	}
	t := c.cs.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
	case <-c.cw.hurry:
	case <-c.done:
	case <-ctx.Done():
	}
	return true
}

func (c *consumer) writeCursor(ctx context.Context, f consumerstate.Pair, shown uint64, lazy bool) error {
	p, err := c.cs.cfg.Ack.Acquire(ctx)
	if err != nil {
		return err
	}
	start := c.cs.clock.Now()
	cp := c.cursorParams(f, shown)
	cp.Lazy = lazy
	rtt, err := c.cs.db.WriteCursor(ctx, cp)
	permit.Return(p, rtt, err)
	c.cs.m.cursorWrites.Inc()
	c.cs.m.cursorLatency.Observe(c.cs.clock.Now().Sub(start).Seconds())
	return err
}

// cursorParams is the cursor write that records floor f, shown as stream sequence shown,
// under this process's lease.
func (c *consumer) cursorParams(f consumerstate.Pair, shown uint64) pg.CursorParams {
	return pg.CursorParams{StreamID: c.sc.s.ID(), Name: c.name, Created: c.created, Owner: c.cs.owner, AckStreamSeq: f.Stream, AckConsumerSeq: f.Consumer,
		ShownStreamSeq: shown}
}

// flushCursor waits for the write in flight and writes a floor still unwritten, so that a
// graceful stop loses no ack. ctx bounds it.
func (c *consumer) flushCursor(ctx context.Context) {
	done := make(chan struct{})
	// On the engine's group, so that when ctx gives up first the group's Stop still
	// waits for this goroutine. The group stops after flushCursor; stopped, it has no writer.
	if !c.cs.g.Go(func() {
		c.cw.wg.Wait()
		close(done)
	}) {
		close(done)
	}
	select {
	case <-done:
	case <-ctx.Done():
		return
	}
	c.cw.mu.Lock()
	f, shown, written := c.cw.want, c.cw.wantShown, c.cw.written
	c.cw.mu.Unlock()
	if f == written {
		return
	}
	if _, err := c.cs.db.WriteCursor(ctx, c.cursorParams(f, shown)); err != nil {
		c.cs.log.Warn("final cursor write failed", "stream", c.sc.s.Name(), "consumer", c.name, "err", err)
	}
}

// deleteInactive removes a consumer that passed its inactive threshold.
func (cs *Engine) deleteInactive(c *consumer) {
	err := cs.db.DeleteConsumer(cs.ctx, c.sc.s.ID(), c.name)
	if err != nil && !errors.Is(err, pg.ErrNotFound) {
		cs.log.Warn("deleting inactive consumer failed", "stream", c.sc.s.Name(), "consumer", c.name, "err", err)
		c.mu.Lock()
		c.lastActive = cs.clock.Now()
		c.mu.Unlock()
		return
	}
	cs.remove(c)
	c.stop(stopDeleted)
	cs.cfg.Retention.ConsumerDeleted(cs.ctx, c.sc.s)
}
