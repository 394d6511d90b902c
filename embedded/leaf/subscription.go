package leaf

import (
	"fmt"
	"strconv"
	"sync/atomic"
	"unsafe"
)

// Msg is a message the server delivered to the link.
type Msg struct {
	Subject string
	Reply   string
	// Header is the raw header block ("NATS/1.0...\r\n\r\n"), nil if the
	// message has none. Inline status lines (e.g. "NATS/1.0 503") are kept.
	Header []byte
	Data   []byte
}

// Handler receives messages for a subscription. It runs on the link's read
// goroutine, so it must not block: while it runs nothing else is read, and
// a server whose writes to the link stall will eventually cut it. Unless
// the subscription is borrowed (SubscribeBorrowed), the Msg and its slices
// are copies owned by the handler, which may keep them or pass them to
// another goroutine. A handler may call any method of the
// Conn except Close.
type Handler func(m *Msg)

// Subscription is the link's interest in a subject, announced to the
// server with LS+.
type Subscription struct {
	conn     *Conn
	subject  string
	queue    string
	handler  Handler
	borrowed bool // the handler gets a view of the read buffer, not a copy
	closed   atomic.Bool
}

// Subject returns the subscribed subject pattern.
func (s *Subscription) Subject() string { return s.subject }

// Queue returns the queue group, "" for a plain subscription.
func (s *Subscription) Queue() string { return s.queue }

// subSet holds the local subscriptions of one subject pattern.
type subSet struct {
	plain  []*Subscription
	queues []*Subscription
}

func localKey(subject, queue string) string {
	if queue == "" {
		return subject
	}
	return subject + " " + queue
}

// Subscribe registers h for messages on subject, which may contain the
// wildcards `*` and `>`, and announces the interest to the server with
// LS+. With a queue group, each message for the group goes to one of the
// link's members of that group, and the server sees the group with a weight
// equal to the number of local members. The server may still route a few
// messages elsewhere until it has processed the LS+; Flush waits for that.
func (c *Conn) Subscribe(subject, queue string, h Handler) (*Subscription, error) {
	return c.subscribe(subject, queue, h, false)
}

// SubscribeBorrowed is Subscribe for a handler that is done with each
// message when it returns. The Msg and everything in it, strings included,
// are a view of the link's read buffer that changes after the call: the
// handler must neither keep nor modify any of it, and copies what it needs.
// It saves a copy of every message where a handler takes little from each,
// as an ack handler does.
func (c *Conn) SubscribeBorrowed(subject, queue string, h Handler) (*Subscription, error) {
	return c.subscribe(subject, queue, h, true)
}

func (c *Conn) subscribe(subject, queue string, h Handler, borrowed bool) (*Subscription, error) {
	if !validPattern(subject) {
		return nil, fmt.Errorf("leaf: subscribe %q: %w", subject, ErrBadSubject)
	}
	if queue != "" && !validLiteral(queue) {
		return nil, fmt.Errorf("leaf: subscribe %q queue %q: %w", subject, queue, ErrBadSubject)
	}
	if h == nil {
		return nil, fmt.Errorf("leaf: subscribe %q: nil handler", subject)
	}
	s := &Subscription{conn: c, subject: subject, queue: queue, handler: h, borrowed: borrowed}

	c.subMu.Lock()
	defer c.subMu.Unlock()
	c.mu.Lock()
	down := c.closing || c.closed
	c.mu.Unlock()
	if down {
		return nil, ErrClosed
	}

	set := c.local.put(subject)
	if queue == "" {
		set.plain = append(set.plain, s)
	} else {
		set.queues = append(set.queues, s)
	}
	key := localKey(subject, queue)
	n := c.localKeys[key] + 1
	c.localKeys[key] = n
	if queue == "" && n > 1 {
		// The server already knows; a second LS+ would change nothing.
		return s, nil
	}
	if err := c.enqueueControl(subFrame(subject, queue, n)); err != nil {
		return nil, err
	}
	return s, nil
}

// Unsubscribe stops delivery to the subscription and, when it was the
// link's last one for its subject (and queue group), withdraws the interest
// with LS-. A message already being dispatched may still reach the handler
// if it runs concurrently. Calling it again, or after the link ended, is a
// no-op returning nil.
func (s *Subscription) Unsubscribe() error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	c := s.conn
	c.subMu.Lock()
	defer c.subMu.Unlock()

	if set := c.local.get(s.subject); set != nil {
		if s.queue == "" {
			set.plain = removeSub(set.plain, s)
		} else {
			set.queues = removeSub(set.queues, s)
		}
		if len(set.plain) == 0 && len(set.queues) == 0 {
			c.local.delete(s.subject)
		}
	}

	key := localKey(s.subject, s.queue)
	n := c.localKeys[key] - 1
	var frame []byte
	switch {
	case n <= 0:
		delete(c.localKeys, key)
		frame = unsubFrame(s.subject, s.queue)
	case s.queue != "":
		c.localKeys[key] = n
		frame = subFrame(s.subject, s.queue, n)
	default:
		c.localKeys[key] = n
		return nil
	}
	// A link that is gone has no interest to withdraw.
	_ = c.enqueueControl(frame)
	return nil
}

func removeSub(list []*Subscription, s *Subscription) []*Subscription {
	for i, x := range list {
		if x == s {
			last := len(list) - 1
			list[i] = list[last]
			list[last] = nil
			return list[:last]
		}
	}
	return list
}

func subFrame(subject, queue string, weight int) []byte {
	b := make([]byte, 0, len(subject)+len(queue)+24)
	b = append(b, "LS+ "...)
	b = append(b, subject...)
	if queue != "" {
		b = append(b, ' ')
		b = append(b, queue...)
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(weight), 10)
	}
	return append(b, "\r\n"...)
}

func unsubFrame(subject, queue string) []byte {
	b := make([]byte, 0, len(subject)+len(queue)+8)
	b = append(b, "LS- "...)
	b = append(b, subject...)
	if queue != "" {
		b = append(b, ' ')
		b = append(b, queue...)
	}
	return append(b, "\r\n"...)
}

// validPattern accepts what the server accepts as a subscription subject:
// non-empty tokens, no whitespace, `>` only as the last token.
func validPattern(s string) bool {
	if !validLiteral(s) {
		return false
	}
	for {
		tok, rest, last := nextToken(s)
		if tok == "" || (tok == ">" && !last) {
			return false
		}
		if last {
			return true
		}
		s = rest
	}
}

// deliver dispatches an LMSG/HMSG to the matching local subscriptions: all
// plain ones, plus one member of each queue group the server named. It runs
// on the read goroutine, which owns the scratch slices.
func (c *Conn) deliver(op *Op) {
	size := len(op.Header) + len(op.Data)
	c.inMsgs.Add(1)
	c.inBytes.Add(uint64(size))

	targets, queued := c.targets[:0], c.queued[:0]
	wantQueues := len(op.Queues) > 0
	c.subMu.RLock()
	c.local.match(bytesToString(op.Subject), func(set *subSet) bool {
		targets = append(targets, set.plain...)
		if wantQueues {
			queued = append(queued, set.queues...)
		}
		return true
	})
	c.subMu.RUnlock()

	for _, name := range op.Queues {
		if s := c.pickMember(queued, name); s != nil {
			targets = append(targets, s)
		}
	}

	delivered := false
	for _, s := range targets {
		if s.closed.Load() {
			continue
		}
		delivered = true
		if s.borrowed {
			viewMsg(&c.view, op)
			s.handler(&c.view)
			c.view = Msg{}
		} else {
			s.handler(copyMsg(op))
		}
	}
	if !delivered {
		c.dropped.Add(1)
	}
	clear(targets)
	clear(queued)
	c.targets, c.queued = targets[:0], queued[:0]
}

// pickMember chooses one member of the named queue group, rotating so that
// members share the load.
func (c *Conn) pickMember(queued []*Subscription, name []byte) *Subscription {
	n := 0
	for _, s := range queued {
		if s.queue == string(name) && !s.closed.Load() {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	c.rr++
	k := int(c.rr % uint32(n))
	for _, s := range queued {
		if s.queue == string(name) && !s.closed.Load() {
			if k == 0 {
				return s
			}
			k--
		}
	}
	return nil
}

// viewMsg points m at op's bytes, which stay the read buffer's.
func viewMsg(m *Msg, op *Op) {
	*m = Msg{Subject: bytesToString(op.Subject), Reply: bytesToString(op.Reply), Data: op.Data}
	if len(op.Header) > 0 {
		m.Header = op.Header
	}
}

// copyMsg gives the handler its own copy of the message in one allocation
// (plus the Msg). Subject and Reply are string views of the front of that
// allocation; nothing else refers to those bytes, so they never change.
func copyMsg(op *Op) *Msg {
	ls, lr, lh := len(op.Subject), len(op.Reply), len(op.Header)
	buf := make([]byte, ls+lr+lh+len(op.Data))
	copy(buf, op.Subject)
	copy(buf[ls:], op.Reply)
	copy(buf[ls+lr:], op.Header)
	copy(buf[ls+lr+lh:], op.Data)

	m := &Msg{}
	if ls > 0 {
		m.Subject = unsafe.String(&buf[0], ls)
	}
	if lr > 0 {
		m.Reply = unsafe.String(&buf[ls], lr)
	}
	body := buf[ls+lr:]
	if lh > 0 {
		// Capped so that appending to Header cannot overwrite Data.
		m.Header = body[:lh:lh]
	}
	m.Data = body[lh:]
	return m
}
