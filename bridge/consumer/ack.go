package consumer

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/consumer/cursor"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg"
)

// CursorIntervalDefault is the least time between two writes of one consumer's ack floor
// that no double ack waits for; see cursor.IntervalDefault.
const CursorIntervalDefault = cursor.IntervalDefault

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
		cs.m.AcksDropped.Inc()
	}
}

// handleAck applies one ack to the state. Called on the consumer's goroutine with mu held.
func (c *consumer) handleAck(ctx context.Context, ev *event, now time.Time) {
	// The flow_control ack policy's acks are flow-control answers: nats-server does not
	// listen on its ack subjects at all.
	if c.cfg.AckPolicy == server.AckFlowControl {
		return
	}
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
	c.tally.Acks++
	// The cursor writer hears of the new floor once the whole queue is handled: acks
	// arrive by the hundred per wake.
	c.ackedFloor = true
	if reply != "" {
		c.cw.Await(min(sseq, c.st.AckFloor().Stream), reply)
	}
}

func (c *consumer) replyAck(reply string) {
	if reply != "" {
		_ = c.cs.link.Publish(reply, "", nil, nil)
	}
}

// floorMoved tells the cursor writer where the floor is now. Called with mu held.
func (c *consumer) floorMoved() {
	_, shown := c.st.Shown()
	c.cw.Move(c.st.AckFloor(), shown.Stream)
}

// AnswerAck answers a double ack; the cursor writer calls it once the floor is durable.
func (c *consumer) AnswerAck(reply string) { c.replyAck(reply) }

// Stopping reports whether the consumer was asked to stop, for the cursor writer.
func (c *consumer) Stopping() bool { return stopReason(c.stopR.Load()) != stopNone }

// Gone reports whether the consumer was deleted or taken over: its cursor is not ours to write.
func (c *consumer) Gone() bool {
	r := stopReason(c.stopR.Load())
	return r == stopDeleted || r == stopLost
}

// Lost stops a consumer whose cursor write found another replica owning it.
func (c *consumer) Lost() { c.stop(stopLost) }

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
