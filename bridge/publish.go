package bridge

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg"
)

// intake is a stream's fusion buffer: publishes taken in and waiting for the stream's next
// push transaction. It is bounded in bytes. A stream has at most one flush in flight, which
// together with its row lock in PostgreSQL makes commit order equal sequence order.
type intake struct {
	mu       sync.Mutex
	buf      []publish
	bytes    int
	flushing bool // a transaction for this stream is in flight
	queued   bool // waiting in the ready queue for a push permit
	closed   bool // the stream is gone; nothing more is taken in
	// flushSince is when the stream's flush in flight started, in the bridge clock's Unix
	// nanoseconds, or 0 with none. It is an atomic apart from mu so that readiness can read
	// it while a hung commit's flush is in flight, without taking any intake's lock.
	flushSince atomic.Int64
}

// publish is one message waiting in an intake, with what is needed to answer it.
type publish struct {
	msg   pg.AppendMsg
	reply string
	recv  time.Time
	size  int
}

// onPublish runs on the link's read loop for every message on a stream subject. It never
// blocks: it validates, appends to the stream's intake, and starts a flush if the stream
// has none in flight and the push lane has a permit free (fire on idle).
func (b *Bridge) onPublish(s *stream, m *leaf.Msg) {
	cfg := s.cfgView()
	if cfg.Sealed {
		b.reject(s, m.Reply, reasonSealed, server.NewJSStreamSealedError())
		return
	}
	if b.overBound(cfg) {
		b.reject(s, m.Reply, reasonResources, server.NewJSInsufficientResourcesError())
		return
	}
	size := int(pg.MessageSize(cfg.Storage == server.MemoryStorage, m.Subject, m.Header, m.Data))
	if cfg.MaxMsgSize > 0 && len(m.Data)+len(m.Header) > int(cfg.MaxMsgSize) {
		b.reject(s, m.Reply, reasonTooLarge, server.NewJSStreamMessageExceedsMaximumError())
		return
	}
	if e := checkStorable("subject", m.Subject); e != nil {
		b.reject(s, m.Reply, reasonUnstorable, e)
		return
	}
	p := publish{reply: m.Reply, recv: b.clock.Now(), size: size,
		msg: pg.AppendMsg{Subject: m.Subject, Header: m.Header, Data: m.Data}}
	if len(m.Header) > 0 {
		if e := parseExpectations(cfg, m.Header, &p.msg); e != nil {
			reason := reasonExpected
			if e.ErrCode == badRequestCode {
				reason = reasonUnstorable
			}
			b.reject(s, m.Reply, reason, e)
			return
		}
	}
	in := &s.in
	in.mu.Lock()
	if in.closed {
		in.mu.Unlock()
		b.reject(s, m.Reply, reasonStopping, server.NewJSStreamNotFoundError())
		return
	}
	if in.bytes+size > b.cfg.IntakeBytes && in.bytes > 0 {
		in.mu.Unlock()
		b.reject(s, m.Reply, reasonIntakeFull, errIntakeFull)
		return
	}
	// As with one stream's bound, a stream with nothing buffered always takes one message, so
	// a single large publish cannot be refused for ever.
	if total := b.intakeTotal.Add(int64(size)); total > int64(b.cfg.IntakeTotalBytes) && in.bytes > 0 {
		b.intakeTotal.Add(-int64(size))
		in.mu.Unlock()
		b.reject(s, m.Reply, reasonIntakeAll, errIntakeFull)
		return
	}
	if len(in.buf) == cap(in.buf) {
		in.buf = publishBufs.grow(in.buf)
	}
	in.buf = append(in.buf, p)
	in.bytes += size
	b.kickLocked(s)
	in.mu.Unlock()
}

// errIntakeFull answers a publish that found its stream's fusion buffer full: load
// shedding, so a slow database shows as fast errors instead of unbounded memory. It uses
// JetStream's "insufficient resources" code (503, err_code 10023) so clients treat it as
// retryable.
var errIntakeFull = server.NewJSInsufficientResourcesError()

// maxStoredText bounds a publish's subject and its Nats-Msg-Id: both are keys of B-tree
// indexes in PostgreSQL, whose entries must fit in a third of a page (about 2.7 KB).
const maxStoredText = 2048

var badRequestCode = server.ApiErrors[server.JSBadRequestErr].ErrCode

// checkStorable refuses a subject or header value that PostgreSQL cannot store or look up
// as text (a NUL byte, invalid UTF-8) or index (too long). Caught here it fails one publish;
// caught by PostgreSQL it would fail the whole transaction, and with it every publish fused
// into it. nats-server stores such values, but has no index or encoding to satisfy.
func checkStorable(what, v string) *server.ApiError {
	var why string
	switch {
	case len(v) > maxStoredText:
		why = fmt.Sprintf("is longer than %d bytes", maxStoredText)
	case !utf8.ValidString(v):
		why = "is not valid UTF-8"
	case strings.IndexByte(v, 0) >= 0:
		why = "contains a NUL byte"
	default:
		return nil
	}
	return &server.ApiError{Code: 400, ErrCode: badRequestCode, Description: "bad request: " + what + " " + why}
}

// parseExpectations reads the Nats-Msg-Id and Nats-Expected-* headers. The stream name is
// checked here; the rest need the stream's row lock and are decided in the transaction.
func parseExpectations(cfg *server.StreamConfig, hdr []byte, m *pg.AppendMsg) *server.ApiError {
	// Features jetgres does not implement are refused, never silently ignored.
	if jswire.HeaderValue(hdr, server.JSMessageTTL) != "" {
		return server.NewJSMessageTTLDisabledError()
	}
	if jswire.HeaderValue(hdr, server.JSBatchId) != "" {
		return server.NewJSAtomicPublishDisabledError()
	}
	m.MsgID = jswire.HeaderValue(hdr, server.JSMsgId)
	if e := checkStorable(server.JSMsgId, m.MsgID); e != nil {
		return e
	}
	if v := jswire.HeaderValue(hdr, server.JSExpectedStream); v != "" && v != cfg.Name {
		return server.NewJSStreamNotMatchError()
	}
	if v := jswire.HeaderValue(hdr, server.JSExpectedLastSeq); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return server.NewJSStreamWrongLastSequenceConstantError()
		}
		m.ExpectLastSeq = &n
	}
	if v := jswire.HeaderValue(hdr, server.JSExpectedLastSubjSeq); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return server.NewJSStreamWrongLastSequenceConstantError()
		}
		m.ExpectLastSubjSeq = &n
		if f := jswire.HeaderValue(hdr, server.JSExpectedLastSubjSeqSubj); f != "" {
			if !server.IsValidSubject(f) {
				return server.NewJSStreamExpectedLastSeqPerSubjectInvalidError()
			}
			if e := checkStorable(server.JSExpectedLastSubjSeqSubj, f); e != nil {
				return e
			}
			m.ExpectLastSubjFilter = f
		}
	}
	if v := jswire.HeaderValue(hdr, server.JSMsgRollup); v != "" {
		if !cfg.AllowRollup || cfg.DenyPurge {
			return server.NewJSStreamRollupFailedError(errors.New("rollup not permitted"))
		}
		switch v {
		case server.JSMsgRollupSubject:
			m.Rollup = pg.RollupSubject
		case server.JSMsgRollupAll:
			m.Rollup = pg.RollupAll
		default:
			return server.NewJSStreamRollupFailedError(fmt.Errorf("rollup value invalid: %q", v))
		}
	}
	m.ExpectLastMsgID = jswire.HeaderValue(hdr, server.JSExpectedLastMsgId)
	return checkStorable(server.JSExpectedLastMsgId, m.ExpectLastMsgID)
}

// reject answers a publish with a JetStream error, or counts it as dropped when it has no
// reply subject to answer on.
func (b *Bridge) reject(s *stream, reply, reason string, e *server.ApiError) {
	if reply == "" {
		b.pm.dropped.WithLabelValues(reason).Inc()
		return
	}
	b.pm.rejected.WithLabelValues(reason).Inc()
	_ = b.link.Publish(reply, "", nil, jswire.PubError(s.name, e))
}

// kickLocked starts a flush of s at once when no push transaction is in flight and the lane
// has a permit (fire on idle: a lone publish commits in one round trip). Otherwise s waits
// in the ready queue, and the transaction in flight takes it into the next bundle as it
// ends. It must be called with s.in.mu held.
func (b *Bridge) kickLocked(s *stream) {
	in := &s.in
	if in.flushing || in.queued || len(in.buf) == 0 {
		return
	}
	if b.inFlight.CompareAndSwap(0, 1) {
		if p, ok := b.cfg.Push.TryAcquire(); ok {
			in.flushing = true
			b.youngest.Store(b.clock.Now().UnixNano())
			if !b.flushes.Go(func() { b.flushChain(p, []*stream{s}) }) {
				// The bridge stopped: what is left goes unanswered, like any publish it
				// never acknowledged, and the publisher retries elsewhere.
				in.flushing = false
				p.Abandon()
				b.flushEnded()
			}
			return
		}
		b.flushEnded()
	}
	in.queued = true
	b.ready.push(s)
}

// flushEnded counts a push transaction out and wakes the dispatcher, which may be waiting
// for the lane to go idle.
func (b *Bridge) flushEnded() {
	b.inFlight.Add(-1)
	poke(b.flushDone)
}

// flushChain flushes group, then, while streams are ready and the lane has a permit, the
// next bundle of them, on the same goroutine: the hand-off from one transaction to the next
// leaves no moment in which the lane looks idle, which would let a lone publish take it
// first and split the bundle.
func (b *Bridge) flushChain(p *flow.Permit, group []*stream) {
	for {
		b.flush(p, group)
		if b.ready.empty() {
			break
		}
		next, ok := b.cfg.Push.TryAcquire()
		if !ok {
			// The limit shrank under what is in flight: the dispatcher waits for a permit.
			break
		}
		if group = b.takeReady(); len(group) == 0 {
			next.Abandon()
			break
		}
		p = next
		b.youngest.Store(b.clock.Now().UnixNano())
	}
	b.flushEnded()
}

// takeReady pops up to FlushMaxStreams ready streams and marks them flushing.
func (b *Bridge) takeReady() []*stream {
	var group []*stream
	for len(group) < b.cfg.FlushMaxStreams {
		s, ok := b.ready.pop()
		if !ok {
			break
		}
		group = append(group, s)
	}
	for _, g := range group {
		g.in.mu.Lock()
		g.in.queued = false
		g.in.flushing = true
		g.in.mu.Unlock()
	}
	return group
}

// dispatchFlushes starts a bundle of the ready streams when no transaction in flight will
// take them: the lane went idle while they waited, or the youngest transaction in flight has
// run for longer than FlushOverlapAfter (hung on a lock, or carrying a bundle big enough that
// overlapping the next pays). It waits for a permit within the lane's limit.
func (b *Bridge) dispatchFlushes() {
	for {
		if !b.ready.waitReady(b.ctx) || !b.waitOverlap() {
			return
		}
		busy := b.inFlight.Load() > 0
		p, err := b.cfg.Push.Acquire(b.ctx)
		if err != nil {
			return
		}
		group := b.takeReady()
		if len(group) == 0 {
			p.Abandon()
			continue
		}
		if busy {
			b.pm.overlaps.Inc()
		}
		b.inFlight.Add(1)
		b.youngest.Store(b.clock.Now().UnixNano())
		if !b.flushes.Go(func() { b.flushChain(p, group) }) {
			p.Abandon() // the bridge stopped, see kickLocked
			b.flushEnded()
			return
		}
	}
}

// waitOverlap returns once the lane is idle or its youngest transaction has run for
// FlushOverlapAfter, or false when the bridge stops.
func (b *Bridge) waitOverlap() bool {
	for {
		if b.inFlight.Load() == 0 {
			return true
		}
		age := time.Duration(b.clock.Now().UnixNano() - b.youngest.Load())
		if age >= b.cfg.FlushOverlapAfter {
			return true
		}
		t := b.clock.NewTimer(b.cfg.FlushOverlapAfter - age)
		select {
		case <-b.ctx.Done():
			t.Stop()
			return false
		case <-b.flushDone:
		case <-t.C():
		}
		t.Stop()
	}
}

// flush commits what the given streams have accumulated in one transaction, answers every
// publisher after the commit, and hands the committed rows to the consumers.
func (b *Bridge) flush(p *flow.Permit, group []*stream) {
	started := b.clock.Now().UnixNano()
	for _, s := range group {
		s.in.flushSince.Store(started)
	}
	batches := make([]pg.AppendBatch, 0, len(group))
	taken := make(map[int64][]publish, len(group))
	total := 0
	for _, s := range group {
		in := &s.in
		in.mu.Lock()
		n := min(len(in.buf), b.cfg.FlushMaxMsgs)
		pubs := in.buf[:n:n]
		in.buf = in.buf[n:]
		took := 0
		for _, pb := range pubs {
			took += pb.size
		}
		in.bytes -= took
		b.intakeTotal.Add(-int64(took))
		if len(in.buf) == 0 {
			in.buf = nil
		}
		in.mu.Unlock()
		if n == 0 {
			continue
		}
		cfg := s.cfgView()
		msgs := msgBufs.get(n)
		for i := range pubs {
			msgs[i] = pubs[i].msg
		}
		if cfg.Retention == server.InterestPolicy {
			subjects := make([]string, n)
			for i := range msgs {
				subjects[i] = msgs[i].Subject
			}
			for i, none := range b.noInterest(s, subjects) {
				msgs[i].NoInterest = none
			}
		}
		taken[s.id] = pubs
		batches = append(batches, pg.AppendBatch{StreamID: s.id, DupWindow: cfg.Duplicates, ChunkRows: s.chunkRows.Load(),
			Limits: streamLimits(cfg), Msgs: msgs})
		b.pm.batchMsgs.Observe(float64(n))
		total += n
	}
	if len(batches) == 0 {
		p.Abandon()
	} else {
		b.pm.batchTx.Observe(float64(len(batches)))
		b.pm.txMsgs.Observe(float64(total))
		// The flush is not tied to a request: it must finish and answer even while the
		// bridge stops, so only the statement timeout and Stop's deadline bound it.
		results, rtt, err := b.db.Append(b.flushCtx, batches, b.clock.Now().UnixNano())
		giveBack(p, rtt, err)
		b.pm.commit.Observe(rtt.Seconds())
		byID := make(map[int64]*stream, len(group))
		for _, s := range group {
			byID[s.id] = s
		}
		if err != nil {
			b.warnPush.Warn(b.log, b.clock.Now(), "push transaction failed", "streams", len(batches), "err", err)
			for _, bt := range batches {
				s := byID[bt.StreamID]
				for _, pb := range taken[bt.StreamID] {
					b.reject(s, pb.reply, reasonDatabase, storeFailed(err))
				}
			}
		} else {
			for _, r := range results {
				s := byID[r.StreamID]
				// Consumers hear of what the commit removed and added before any publisher
				// hears of the commit, so a fetch sent on a PubAck sees both.
				if !r.Gone {
					s.commit(b.flushCtx, r)
					b.stored(s, r.Stored)
				}
				b.answer(s, taken[r.StreamID], r)
			}
		}
	}
	for _, s := range group {
		s.in.flushSince.Store(0)
		s.in.mu.Lock()
		s.in.flushing = false
		b.kickLocked(s)
		s.in.mu.Unlock()
	}
	for _, bt := range batches {
		msgBufs.put(bt.Msgs)
		publishBufs.put(taken[bt.StreamID])
	}
}

// Under load every flush would regrow its stream's intake from nothing and copy its
// messages into a new slice: half of the bridge's allocations per publish. Flushes give
// both back once answered. Pools, not a spare per stream, so that idle streams keep
// nothing (a pool empties itself at garbage collections); one pool per power-of-two
// capacity, so that a slice is never more than four times the size asked for: a stream
// with a few messages waiting, say while the database is down, holds a small slice, not
// one that a busy stream grew.
var (
	publishBufs slicePool[publish]
	msgBufs     slicePool[pg.AppendMsg]
)

const (
	minPooledShift = 3  // 8 elements
	maxPooledShift = 13 // 8,192 elements: FlushMaxMsgsDefault
)

// slicePool keeps slices by capacity: class i holds capacities from 1<<(i+minPooledShift)
// up to twice that.
type slicePool[T any] struct {
	classes [maxPooledShift - minPooledShift + 1]sync.Pool
}

// get returns a slice of length n, reused if one is pooled.
func (sp *slicePool[T]) get(n int) []T {
	i := max(bits.Len(uint(max(n, 1)-1))-minPooledShift, 0) // the smallest class that fits n
	if i >= len(sp.classes) {
		return make([]T, n)
	}
	if b, ok := sp.classes[i].Get().(*[]T); ok {
		return (*b)[:n]
	}
	return make([]T, n, 1<<(i+minPooledShift))
}

// grow returns a slice holding b's elements with room for as many again, and pools b.
func (sp *slicePool[T]) grow(b []T) []T {
	nb := sp.get(max(2*len(b), 1<<minPooledShift))[:len(b)]
	copy(nb, b)
	sp.put(b)
	return nb
}

// put pools b, emptied so that it keeps nothing alive, in the largest class its capacity
// fills.
func (sp *slicePool[T]) put(b []T) {
	if cap(b) < 1<<minPooledShift || cap(b) >= 2<<maxPooledShift {
		return
	}
	i := bits.Len(uint(cap(b))) - 1 - minPooledShift
	clear(b[:cap(b)])
	b = b[:0]
	sp.classes[i].Put(&b)
}

// giveBack returns a lane permit after a database call and tells the limiter what the call
// showed. A call the database answered, with a result, an error of its own or a statement
// timeout, is a round trip. A call that got no answer at all (no connection, one that broke,
// or no connection free within the timeout) measured nothing: recording its near-zero time
// would drag rtt_base down to a round trip no statement achieves, leaving every real one to
// read as congestion for a minute after the database is back; it steps the limit down
// instead. A call its caller gave up on says nothing about the database.
func giveBack(p *flow.Permit, rtt time.Duration, err error) {
	switch {
	case err == nil:
		p.Release(rtt)
	case errors.Is(err, pg.ErrTimeout):
		if rtt > 0 {
			p.Release(rtt)
		} else {
			p.Fail()
		}
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		p.Abandon()
	case errors.Is(err, pg.ErrUnavailable) || rtt == 0:
		p.Fail()
	default:
		p.Release(rtt)
	}
}

func storeFailed(err error) *server.ApiError {
	if errors.Is(err, pg.ErrTimeout) {
		return server.NewJSStreamStoreFailedError(errors.New("database timeout"))
	}
	return server.NewJSStreamStoreFailedError(errors.New("database unavailable"))
}

// answer sends each publisher its PubAck (or the error its expectation produced).
func (b *Bridge) answer(s *stream, pubs []publish, r pg.AppendResult) {
	now := b.clock.Now()
	for i, pb := range pubs {
		o := r.Outcomes[i]
		if o.Err != nil {
			var ee *pg.ExpectError
			var le *pg.LimitError
			e, reason := server.NewJSStreamStoreFailedError(o.Err), reasonExpected
			switch {
			case errors.As(o.Err, &le):
				e, reason = limitRejected(le), reasonLimit
			case errors.Is(o.Err, pg.ErrSeqExhausted):
				reason = reasonLimit
			case errors.Is(o.Err, pg.ErrNotFound):
				// Deleted, by another replica, while the publish waited for its transaction.
				e, reason = server.NewJSStreamNotFoundError(), reasonNoStream
			case errors.As(o.Err, &ee) && ee.Kind == pg.ExpectLastMsgIDKind:
				e = server.NewJSStreamWrongLastMsgIDError(ee.LastID)
			case errors.As(o.Err, &ee):
				e = server.NewJSStreamWrongLastSequenceError(ee.LastSeq)
			}
			b.reject(s, pb.reply, reason, e)
			continue
		}
		b.pm.accepted.Inc()
		if o.Duplicate {
			b.pm.rejected.WithLabelValues(reasonDuplicate).Inc()
		}
		if pb.reply == "" {
			continue
		}
		_ = b.link.Publish(pb.reply, "", nil, jswire.PubAck(s.ackPfx, o.Seq, o.Duplicate))
		b.pm.pubAck.Observe(now.Sub(pb.recv).Seconds())
	}
}

// drainIntake flushes whatever is still buffered, for Stop: nothing taken in is lost. It
// returns once every flush committed and answered, or with ctx's error.
func (b *Bridge) drainIntake(ctx context.Context) error {
	for _, s := range b.streamList() {
		s.in.mu.Lock()
		b.kickLocked(s)
		s.in.mu.Unlock()
	}
	// Streams parked in the ready queue still need a permit; the dispatcher is running
	// until the background work stops, which happens only after this drain. The wait is for
	// the dispatcher, not for time, so it polls on the system clock: on the bridge's, a fake
	// clock that no test moves while it stops the bridge would never end it.
	for !b.ready.empty() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return b.flushes.Wait(ctx)
}

// closeIntake answers everything still buffered in s with e and takes no more: the stream
// is gone.
func (b *Bridge) closeIntake(s *stream, e *server.ApiError) {
	in := &s.in
	in.mu.Lock()
	pubs := in.buf
	b.intakeTotal.Add(-int64(in.bytes))
	in.buf, in.bytes, in.closed = nil, 0, true
	in.mu.Unlock()
	for _, pb := range pubs {
		b.reject(s, pb.reply, reasonStopping, e)
	}
}

// readyQueue is the FIFO of streams waiting for a push permit. A stream is in it at most
// once (intake.queued), so its length is bounded by the number of streams.
type readyQueue struct {
	mu     sync.Mutex
	items  []*stream
	signal chan struct{}
}

func newReadyQueue() *readyQueue { return &readyQueue{signal: make(chan struct{}, 1)} }

func (q *readyQueue) push(s *stream) {
	q.mu.Lock()
	q.items = append(q.items, s)
	q.mu.Unlock()
	poke(q.signal)
}

// poke wakes whoever waits on ch, a channel of capacity one, without waiting itself: a
// wake-up already pending covers this one.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (q *readyQueue) pop() (*stream, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return nil, false
	}
	s := q.items[0]
	q.items[0] = nil
	q.items = q.items[1:]
	return s, true
}

func (q *readyQueue) empty() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) == 0
}

// waitReady returns once a stream is ready, without taking it, or false when ctx ends.
func (q *readyQueue) waitReady(ctx context.Context) bool {
	for q.empty() {
		select {
		case <-ctx.Done():
			return false
		case <-q.signal:
		}
	}
	return true
}
