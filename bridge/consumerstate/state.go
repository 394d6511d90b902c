// Package consumerstate is the in-memory delivery and acknowledgement state of one pull or
// push consumer: which stream sequences are delivered and waiting for an ack, when each of
// them is due for redelivery, how often each was delivered, and where the ack floor stands.
//
// It knows nothing about messages, subjects, NATS or PostgreSQL, and it never reads the
// clock: its owner passes the time to every call that needs it, so that one reading serves a
// delivery and its bookkeeping. The owner picks the next message to deliver (asking
// Redelivery first, then reading at Next), reports deliveries and acks, calls Expire when
// NextDeadline passes, and persists AckFloor when it moves. The rules
// follow nats-server's consumer (server/consumer.go) with one deliberate difference:
// redeliveries go out lowest stream sequence first, whatever order they expired or were
// nak'ed in.
//
// A State is not safe for concurrent use; the consumer that owns it serialises access.
package consumerstate

import (
	"container/heap"
	"time"
)

// AckPolicy says which acks a consumer expects.
type AckPolicy int

const (
	// AckExplicit: every message is acked on its own.
	AckExplicit AckPolicy = iota
	// AckAll: an ack covers every message delivered before it.
	AckAll
	// AckNone: delivery is the ack; nothing is pending.
	AckNone
)

// Config is the part of a consumer's configuration that governs acks and redelivery.
type Config struct {
	AckPolicy AckPolicy
	// AckWait is how long a delivery waits for its ack before it is redelivered; with no
	// BackOff, 0 is never (the flow_control ack policy's), as in nats-server.
	AckWait time.Duration
	// BackOff, when set, replaces AckWait: the n-th delivery of a message waits BackOff[n-1],
	// the last value repeating.
	BackOff []time.Duration
	// MaxDeliver caps how often one message is delivered; 0 or less is no cap.
	MaxDeliver int
	// MaxAckPending caps how many messages may wait for their ack; 0 or less is no cap.
	MaxAckPending int
	// FlowControl is a push consumer's flow control. nats-server lets such a consumer's
	// acks run ahead of what it delivered: an AckAll ack past it acks all that was.
	FlowControl bool
}

// Pair is a consumer sequence and the stream sequence it delivered.
type Pair struct {
	Consumer uint64
	Stream   uint64
}

type pending struct {
	dseq     uint64 // consumer sequence of the first delivery; acks refer to it
	deadline int64  // unix ns at which the delivery expires, 0 while queued for redelivery or never
}

// State is one consumer's delivery and ack state.
//
// Every delivery and every ack passes through it, so its common case costs no allocation
// and no heap operation: first deliveries go out in stream order with one ack wait, which
// makes both the pending sequences and their deadlines queues in arrival order. Heaps take
// only what arrives out of that order (naks with a delay, backoff, redeliveries).
type State struct {
	cfg Config

	sseq  uint64 // next stream sequence to consider for a first delivery
	dseq  uint64 // next consumer sequence
	floor Pair   // ack floor: everything at or below it is done

	pending map[uint64]pending  // by stream sequence
	order   seqQueue            // pending stream sequences, ascending, lazily cleaned
	rdc     map[uint64]uint64   // redeliveries so far, by stream sequence
	rdq     seqHeap             // queued for redelivery, lazily cleaned
	queued  map[uint64]struct{} // members of rdq
	// deadlines orders the pending deliveries' deadlines, lazily cleaned: an entry counts
	// only while its message is pending with that very deadline. A consumer asks for the
	// next deadline each time it wakes, and with many deliveries pending (max_ack_pending
	// in the tens of thousands) a scan of them all per wake would be its main work.
	deadlines deadlineQueue
	lastDlv   time.Time
	lastAck   time.Time
	// shown and shownFloor are what ConsumerInfo reports, kept as nats-server keeps its
	// positions: shown is the last stream sequence delivered for the first time (or passed
	// by a purge), and shownFloor follows the floor except where Skip moved it. The scan
	// position and the floor run ahead of them over the messages a filter leaves out, so
	// that a restart does not read those again; nats-server reports the last message the
	// consumer took instead.
	shown      uint64
	shownFloor Pair
	// held is the lowest stream sequence above the floor that was dropped for reaching
	// MaxDeliver, 0 if none. As in nats-server, the floor moves only along acks in
	// consumer-sequence order, which such a message breaks: the floor stays below it until
	// nothing is pending.
	held uint64
}

// New returns the state of a consumer whose ack floor is floor and whose first delivery
// considers stream sequence next. A consumer resuming after a restart passes its persisted
// floor and floor.Stream+1: what was delivered but not acked goes out again.
func New(cfg Config, floor Pair, next uint64) *State {
	if next <= floor.Stream {
		next = floor.Stream + 1
	}
	return &State{
		cfg:        cfg,
		sseq:       next,
		dseq:       floor.Consumer + 1,
		floor:      floor,
		shown:      next - 1,
		shownFloor: floor,
		pending:    make(map[uint64]pending),
		rdc:        make(map[uint64]uint64),
		queued:     make(map[uint64]struct{}),
	}
}

// SetConfig applies an updated configuration. Deadlines already set keep their values.
func (s *State) SetConfig(cfg Config) { s.cfg = cfg }

// Next is the lowest stream sequence not yet considered for a first delivery.
func (s *State) Next() uint64 { return s.sseq }

// Skip records that every stream sequence below next was considered and is not for this
// consumer (filtered out or gone). With nothing pending the ack floor follows, so that a
// restart does not scan the skipped range again; what Shown reports does not.
func (s *State) Skip(next uint64) bool {
	if next <= s.sseq {
		return false
	}
	s.sseq = next
	return s.settleFloor()
}

// ShowFrom makes Shown report stream sequence seq as delivered and acknowledged, for a
// consumer resumed from a stored floor that Skip had moved past the last message it took.
// It never reports past the floor.
func (s *State) ShowFrom(seq uint64) {
	seq = min(seq, s.floor.Stream)
	s.shown, s.shownFloor = seq, Pair{Consumer: s.floor.Consumer, Stream: seq}
}

// Shown is what ConsumerInfo reports as delivered and as the ack floor: nats-server's
// positions, which stop at the last message the consumer took where Delivered and AckFloor
// run on over the messages its filter leaves out.
func (s *State) Shown() (delivered, floor Pair) {
	return Pair{Consumer: s.dseq - 1, Stream: s.shown}, s.shownFloor
}

// show moves the shown floor after the floor moved for any reason but Skip.
func (s *State) show() {
	f := Pair{Consumer: s.floor.Consumer, Stream: min(s.floor.Stream, s.shown)}
	if f.Stream > s.shownFloor.Stream || f.Stream == s.shownFloor.Stream && f.Consumer > s.shownFloor.Consumer {
		s.shownFloor = f
	}
}

// Delivered is the last consumer sequence handed out and the highest stream sequence
// considered, as ConsumerInfo reports them.
func (s *State) Delivered() Pair { return Pair{Consumer: s.dseq - 1, Stream: s.sseq - 1} }

// AckFloor is the pair at or below which everything is acknowledged.
func (s *State) AckFloor() Pair { return s.floor }

// NumAckPending is how many delivered messages wait for an ack.
func (s *State) NumAckPending() int { return len(s.pending) }

// NumRedelivered is how many messages were delivered more than once and are still tracked.
// As in nats-server, a consumer with MaxDeliver 1 reports none.
func (s *State) NumRedelivered() int {
	if s.cfg.MaxDeliver == 1 {
		return 0
	}
	return len(s.rdc)
}

// LastDelivered and LastAcked are the times of the last delivery and the last ack that moved
// the state, zero if none.
func (s *State) LastDelivered() time.Time { return s.lastDlv }
func (s *State) LastAcked() time.Time     { return s.lastAck }

// AtMaxAckPending reports whether no new message may go out until an ack arrives.
// Redeliveries are not held back by it.
func (s *State) AtMaxAckPending() bool {
	return s.cfg.AckPolicy != AckNone && s.cfg.MaxAckPending > 0 && len(s.pending) >= s.cfg.MaxAckPending
}

// HasRedeliveries reports whether a message is queued for redelivery.
func (s *State) HasRedeliveries() bool { return len(s.queued) > 0 }

// NumQueued is how many messages are queued for redelivery, some of which Redelivery may
// still drop for having reached MaxDeliver.
func (s *State) NumQueued() int { return len(s.queued) }

// Redelivery returns the lowest stream sequence queued for redelivery and the delivery
// count it would go out with, without taking it off the queue; Deliver does that. Messages
// that would exceed MaxDeliver are dropped from the queue and from pending on the way.
func (s *State) Redelivery() (seq, dc uint64, ok bool) {
	for s.rdq.Len() > 0 {
		seq = s.rdq[0]
		if _, in := s.queued[seq]; !in {
			heap.Pop(&s.rdq)
			continue
		}
		dc = s.rdc[seq] + 2
		if s.cfg.MaxDeliver > 0 && dc > uint64(s.cfg.MaxDeliver) {
			s.unqueue(seq)
			s.dropPending(seq)
			continue
		}
		return seq, dc, true
	}
	return 0, 0, false
}

// Deliver records that stream sequence seq went out with delivery count dc (1 for a first
// delivery, as Redelivery returned it otherwise) and returns its consumer sequence. A first
// delivery moves Next past seq. It reports whether the ack floor moved, which only AckNone
// does on delivery. now is the time of the delivery.
func (s *State) Deliver(seq, dc uint64, now time.Time) (dseq uint64, floorMoved bool) {
	dseq = s.dseq
	s.dseq++
	s.lastDlv = now
	if dc > 1 {
		s.rdc[seq] = dc - 1
		s.unqueue(seq)
	} else if seq >= s.sseq {
		s.sseq = seq + 1
	}
	if dc <= 1 {
		s.shown = max(s.shown, seq)
	}
	if s.cfg.AckPolicy == AckNone {
		if seq > s.floor.Stream {
			s.floor = Pair{Consumer: dseq, Stream: seq}
			s.show()
			return dseq, true
		}
		return dseq, false
	}
	p, ok := s.pending[seq]
	if !ok {
		p = pending{dseq: dseq}
		s.order.insert(seq)
	}
	if w := s.wait(dc); w > 0 {
		s.setDeadline(seq, p, now.Add(w).UnixNano())
	} else {
		s.pending[seq] = p
	}
	return dseq, false
}

// wait is how long the dc-th delivery of a message waits for its ack.
func (s *State) wait(dc uint64) time.Duration {
	if n := len(s.cfg.BackOff); n > 0 {
		i := int(min(dc, uint64(n))) - 1
		return s.cfg.BackOff[max(i, 0)]
	}
	return s.cfg.AckWait
}

// Ack processes +ACK (and TERM, which acks without redelivery) for the delivery of stream
// sequence seq with consumer sequence dseq, at time now. It reports whether the ack floor
// moved.
func (s *State) Ack(seq, dseq uint64, now time.Time) bool {
	if seq >= s.sseq {
		if !s.cfg.FlowControl || s.cfg.AckPolicy != AckAll {
			// Never delivered from here: a stale or forged ack must not move the floor.
			return false
		}
		seq = s.sseq - 1
	}
	switch s.cfg.AckPolicy {
	case AckExplicit:
		if _, ok := s.pending[seq]; !ok {
			return false
		}
		s.lastAck = now
		delete(s.rdc, seq)
		s.unqueue(seq)
		delete(s.pending, seq)
		s.compact()
		return s.settled()
	case AckAll:
		if dseq <= s.floor.Consumer || seq <= s.floor.Stream {
			return false
		}
		s.lastAck = now
		p, wasPending := s.pending[seq]
		if wasPending {
			dseq = p.dseq
		}
		for q, ok := s.order.front(); ok && q <= seq; q, ok = s.order.front() {
			s.order.pop()
			delete(s.pending, q)
			delete(s.rdc, q)
			s.unqueue(q)
		}
		if !wasPending {
			// The consumer sequence came from the ack subject. A forged one at or past a
			// delivery still pending would put the floor above it, and its own ack would
			// then be ignored as stale; nats-server takes it as it comes.
			dseq = min(dseq, s.lowestPendingDseq()-1)
		}
		s.floor = Pair{Consumer: dseq, Stream: seq}
		s.settleFloor()
		s.show()
		return true
	}
	return false
}

// lowestPendingDseq is the consumer sequence of the lowest pending delivery, or the next
// consumer sequence when nothing is pending.
func (s *State) lowestPendingDseq() uint64 {
	if low, ok := s.lowestPending(); ok {
		return s.pending[low].dseq
	}
	return s.dseq
}

// lowestPending drops what is no longer pending off the front of order and returns the
// lowest pending stream sequence, if any.
func (s *State) lowestPending() (uint64, bool) {
	for q, ok := s.order.front(); ok; q, ok = s.order.front() {
		if _, in := s.pending[q]; in {
			return q, true
		}
		s.order.pop()
	}
	return 0, false
}

// Nak processes -NAK, received at time now: redeliver now, or after delay when it is
// positive.
func (s *State) Nak(seq, dseq uint64, delay time.Duration, now time.Time) {
	if dseq <= s.floor.Consumer || dseq >= s.dseq {
		return
	}
	p, ok := s.pending[seq]
	if !ok {
		return
	}
	if delay > 0 {
		s.unqueue(seq)
		s.setDeadline(seq, p, now.Add(delay).UnixNano())
		return
	}
	s.enqueue(seq)
}

// Progress processes +WPI, received at time now: the delivery of seq gets a fresh ack wait.
func (s *State) Progress(seq uint64, now time.Time) {
	p, ok := s.pending[seq]
	if !ok {
		return
	}
	if _, q := s.queued[seq]; q {
		return
	}
	if w := s.wait(s.rdc[seq] + 1); w > 0 {
		s.setDeadline(seq, p, now.Add(w).UnixNano())
	}
}

// setDeadline stores p, pending for seq, with the deadline at.
func (s *State) setDeadline(seq uint64, p pending, at int64) {
	p.deadline = at
	s.pending[seq] = p
	s.deadlines.push(deadline{at: at, seq: seq})
	s.compactDeadlines()
}

// live reports whether d is the current deadline of a pending delivery.
func (s *State) live(d deadline) bool {
	p, ok := s.pending[d.seq]
	return ok && p.deadline == d.at
}

// nextDeadline drops stale entries off the front of the deadlines and returns the earliest
// live one, if any.
func (s *State) nextDeadline() (deadline, bool) {
	for {
		d, _, ok := s.deadlines.first()
		if !ok || s.live(d) {
			return d, ok
		}
		s.deadlines.popFirst()
	}
}

// Purged applies a purge as nats-server's consumer does. start is the first sequence the
// purge leaves for this consumer: below it every delivery is settled and nothing is
// delivered; 0 with wider false means nothing is left, so the consumer moves past last, the
// stream's last sequence. wider is for a consumer whose filters reach beyond the purged
// subject: its pending deliveries above start stay unless gone reports them removed. It
// reports whether the ack floor moved.
func (s *State) Purged(start, last uint64, wider bool, gone func(seq uint64) bool, now time.Time) bool {
	if start == 0 && !wider {
		start = last + 1
	}
	s.sseq = max(s.sseq, start)
	if start > 0 {
		s.shown = max(s.shown, start-1)
	}
	if start == 0 || s.floor.Stream >= start {
		return false
	}
	s.floor.Stream = start - 1
	for seq, p := range s.pending {
		if seq <= s.floor.Stream || wider && gone(seq) {
			s.floor.Consumer = max(s.floor.Consumer, p.dseq)
			delete(s.pending, seq)
			delete(s.rdc, seq)
			s.unqueue(seq)
			s.lastAck = now
		}
	}
	if len(s.pending) == 0 {
		s.floor = Pair{Consumer: s.dseq - 1, Stream: s.sseq - 1}
	}
	if s.held <= s.floor.Stream {
		s.held = 0
	}
	s.show()
	s.compact()
	return true
}

// Gone removes a pending or queued message that no longer exists in the stream, as if it
// had been terminated. It reports whether the ack floor moved.
func (s *State) Gone(seq uint64) bool {
	s.unqueue(seq)
	delete(s.rdc, seq)
	if _, ok := s.pending[seq]; !ok {
		return false
	}
	delete(s.pending, seq)
	return s.settled()
}

// Expire queues every delivery whose ack wait has passed by now for redelivery, and drops
// those that reached MaxDeliver. It reports whether anything was queued and whether the ack
// floor moved.
func (s *State) Expire(now time.Time) (queued, floorMoved bool) {
	at := now.UnixNano()
	dropped := false
	for {
		d, ok := s.nextDeadline()
		if !ok || d.at > at {
			break
		}
		s.deadlines.popFirst()
		if s.cfg.MaxDeliver > 0 && s.rdc[d.seq]+1 >= uint64(s.cfg.MaxDeliver) {
			delete(s.pending, d.seq)
			s.hold(d.seq)
			dropped = true
			continue
		}
		s.enqueue(d.seq)
		queued = true
	}
	if dropped {
		floorMoved = s.settled()
	}
	return queued, floorMoved
}

// NextDeadline is the earliest time at which Expire has work, zero if none.
func (s *State) NextDeadline() time.Time {
	d, ok := s.nextDeadline()
	if !ok {
		return time.Time{}
	}
	return time.Unix(0, d.at)
}

// PendingSeqs returns the stream sequences waiting for an ack, lowest first.
func (s *State) PendingSeqs() []uint64 {
	out := make([]uint64, 0, len(s.pending))
	for _, q := range s.order.all() {
		if _, ok := s.pending[q]; ok {
			out = append(out, q)
		}
	}
	return out
}

func (s *State) enqueue(seq uint64) {
	if _, ok := s.queued[seq]; ok {
		return
	}
	s.queued[seq] = struct{}{}
	heap.Push(&s.rdq, seq)
	if p, ok := s.pending[seq]; ok {
		p.deadline = 0
		s.pending[seq] = p
	}
}

func (s *State) unqueue(seq uint64) {
	delete(s.queued, seq)
	if s.rdq.Len() > 0 && s.rdq[0] == seq {
		heap.Pop(&s.rdq)
	}
}

// dropPending forgets a delivery that exhausted MaxDeliver; its redelivery count stays, so
// that NumRedelivered still reports it. The floor stays below it (see held).
func (s *State) dropPending(seq uint64) {
	if _, ok := s.pending[seq]; ok {
		delete(s.pending, seq)
		s.hold(seq)
	}
}

// hold notes that seq, above the floor, was dropped for reaching MaxDeliver.
func (s *State) hold(seq uint64) {
	if seq > s.floor.Stream && (s.held == 0 || seq < s.held) {
		s.held = seq
	}
}

// settled is settleFloor after an ack, an expiry or a removal: when the floor moves, the
// shown floor follows. An ack that moves nothing (out of order) leaves it, as nats-server
// leaves its floor.
func (s *State) settled() bool {
	moved := s.settleFloor()
	if moved {
		s.show()
	}
	return moved
}

// settleFloor moves the ack floor up to just below the lowest pending delivery, or to what
// was delivered when nothing is pending. It never moves the floor down.
func (s *State) settleFloor() bool {
	next := Pair{Consumer: s.dseq - 1, Stream: s.sseq - 1}
	if low, ok := s.lowestPending(); ok {
		if s.held > s.floor.Stream && s.held < low {
			return false
		}
		next = Pair{Consumer: s.pending[low].dseq - 1, Stream: low - 1}
	}
	if s.held <= next.Stream {
		s.held = 0
	}
	if next.Stream <= s.floor.Stream {
		return false
	}
	s.floor.Stream = next.Stream
	s.floor.Consumer = max(s.floor.Consumer, next.Consumer)
	return true
}

// compact rebuilds the lazily cleaned queues and heaps once stale entries dominate them: a
// message that stays pending for long would otherwise pin every later ack's entry behind it.
func (s *State) compact() {
	if s.order.len() > 2*len(s.pending)+1024 {
		s.order.keep(func(q uint64) bool { _, ok := s.pending[q]; return ok })
	}
	if len(s.rdq) > 2*len(s.queued)+1024 {
		s.rdq = s.rdq[:0]
		for q := range s.queued {
			s.rdq = append(s.rdq, q)
		}
		heap.Init(&s.rdq)
	}
	s.compactDeadlines()
}

func (s *State) compactDeadlines() {
	if s.deadlines.len() > 2*len(s.pending)+1024 {
		ds := make([]deadline, 0, len(s.pending))
		for q, p := range s.pending {
			if p.deadline != 0 {
				ds = append(ds, deadline{at: p.deadline, seq: q})
			}
		}
		s.deadlines.reset(ds)
	}
}
