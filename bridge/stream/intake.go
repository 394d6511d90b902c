package stream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/jserr"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/internal/permit"
	"github.com/jetgres/jetgres/internal/wake"
	"github.com/jetgres/jetgres/pg"
)

// intake is a stream's fusion buffer: publishes taken in and waiting for the stream's next
// append transaction. It is bounded in bytes. A stream has at most one flush in flight, which
// together with its row lock in PostgreSQL makes commit order equal sequence order.
type intake struct {
	mu       sync.Mutex
	buf      []publish
	bytes    int
	flushing bool // a transaction for this stream is in flight
	queued   bool // waiting in the ready queue for an append permit
	closed   bool // the stream is gone; nothing more is taken in
	// flushSince is when the stream's flush in flight started, in the registry clock's Unix
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
	// batch is set for a committed atomic batch, whose messages go into a transaction on
	// their own; msg is then unused.
	batch *atomicCommit
}

// onPublish runs on the link's read loop for every message on a stream subject. It never
// blocks: it maps the subject by the stream's subject_transform, validates, appends to the stream's intake, and starts a flush if the stream
// has none in flight and the append lane has a permit free (fire on idle).
func (r *Registry) onPublish(s *Stream, m *leaf.Msg) {
	cfg := s.ConfigView()
	m = s.stored(m)
	if cfg.Sealed {
		r.reject(s, m.Reply, ReasonSealed, server.NewJSStreamSealedError())
		return
	}
	if r.overBound(cfg) {
		r.reject(s, m.Reply, ReasonResources, server.NewJSInsufficientResourcesError())
		return
	}
	size := int(pg.MessageSize(cfg.Storage == server.MemoryStorage, m.Subject, m.Header, m.Data))
	if cfg.MaxMsgSize > 0 && len(m.Data)+len(m.Header) > int(cfg.MaxMsgSize) {
		r.reject(s, m.Reply, ReasonTooLarge, server.NewJSStreamMessageExceedsMaximumError())
		return
	}
	// nats-server takes a reply subject ending in .$FI as a fast batch's, which jetgres does
	// not implement; it refuses one on a stream without allow_batched so.
	if len(m.Reply) > len(server.FastBatchSuffix) && strings.HasSuffix(m.Reply, server.FastBatchSuffix) {
		r.reject(s, m.Reply, ReasonUnstorable, server.NewJSBatchPublishDisabledError())
		return
	}
	if e := checkStorable("subject", m.Subject); e != nil {
		r.reject(s, m.Reply, ReasonUnstorable, e)
		return
	}
	if id := jswire.HeaderValue(m.Header, server.JSBatchId); id != "" {
		r.onBatchPublish(s, cfg, m, id, size)
		return
	}
	p := publish{reply: m.Reply, recv: r.cfg.Clock.Now(), size: size,
		msg: pg.AppendMsg{Subject: m.Subject, Header: m.Header, Data: m.Data}}
	if len(m.Header) > 0 || cfg.AllowMsgCounter {
		if e := ParseExpectations(cfg, m.Header, &p.msg); e != nil {
			reason := ReasonExpected
			if e.ErrCode == badRequestCode {
				reason = ReasonUnstorable
			}
			r.reject(s, m.Reply, reason, e)
			return
		}
	}
	r.enqueue(s, p)
}

// enqueue puts a checked publish into its stream's intake, within the intakes' bounds.
func (r *Registry) enqueue(s *Stream, p publish) {
	size := p.size
	in := &s.in
	in.mu.Lock()
	if in.closed {
		in.mu.Unlock()
		r.reject(s, p.reply, ReasonStopping, server.NewJSStreamNotFoundError())
		return
	}
	if in.bytes+size > r.cfg.IntakeBytes && in.bytes > 0 {
		in.mu.Unlock()
		r.reject(s, p.reply, ReasonIntakeFull, errIntakeFull)
		return
	}
	// As with one stream's bound, a stream with nothing buffered always takes one message, so
	// a single large publish cannot be refused for ever.
	if total := r.intakeTotal.Add(int64(size)); total > int64(r.cfg.IntakeTotalBytes) && in.bytes > 0 {
		r.intakeTotal.Add(-int64(size))
		in.mu.Unlock()
		r.reject(s, p.reply, ReasonIntakeAll, errIntakeFull)
		return
	}
	if len(in.buf) == cap(in.buf) {
		in.buf = publishBufs.grow(in.buf)
	}
	in.buf = append(in.buf, p)
	in.bytes += size
	r.kickLocked(s)
	in.mu.Unlock()
}

// errIntakeFull answers a publish that found its stream's fusion buffer full: load
// shedding, so a slow database shows as fast errors instead of unbounded memory. It uses
// JetStream's "insufficient resources" code (503, err_code 10023) so clients treat it as
// retryable.
var errIntakeFull = server.NewJSInsufficientResourcesError()

// MaxStoredText bounds a publish's subject and its Nats-Msg-Id: both are keys of B-tree
// indexes in PostgreSQL, whose entries must fit in a third of a page (about 2.7 KB).
const MaxStoredText = 2048

var badRequestCode = server.ApiErrors[server.JSBadRequestErr].ErrCode

// checkStorable refuses a subject or header value that PostgreSQL cannot store or look up
// as text (a NUL byte, invalid UTF-8) or index (too long). Caught here it fails one publish;
// caught by PostgreSQL it would fail the whole transaction, and with it every publish fused
// into it. nats-server stores such values, but has no index or encoding to satisfy.
func checkStorable(what, v string) *server.ApiError {
	var why string
	switch {
	case len(v) > MaxStoredText:
		why = fmt.Sprintf("is longer than %d bytes", MaxStoredText)
	case !utf8.ValidString(v):
		why = "is not valid UTF-8"
	case strings.IndexByte(v, 0) >= 0:
		why = "contains a NUL byte"
	default:
		return nil
	}
	return &server.ApiError{Code: 400, ErrCode: badRequestCode, Description: "bad request: " + what + " " + why}
}

// ParseExpectations reads the Nats-Msg-Id and Nats-Expected-* headers, after refusing
// what nats-server refuses of a publish's headers before it decides anything. The stream
// name is checked here; the rest need the stream's row lock and are decided in the
// transaction. A publish that is part of an atomic batch is refused: the intake stages
// those (batch.go), and only the SQL path, which has no batches, brings one here.
func ParseExpectations(cfg *server.StreamConfig, hdr []byte, m *pg.AppendMsg) *server.ApiError {
	if jswire.HeaderValue(hdr, server.JSBatchId) != "" {
		return server.NewJSAtomicPublishDisabledError()
	}
	return parseMsg(cfg, hdr, m)
}

// parseMsg is ParseExpectations for a message whose batch, if any, is already decided.
func parseMsg(cfg *server.StreamConfig, hdr []byte, m *pg.AppendMsg) *server.ApiError {
	if e := checkHeaders(cfg, m.Subject, hdr, len(m.Data)); e != nil {
		return e
	}
	schedulePurge(hdr, m)
	if cfg.AllowMsgSchedules && jswire.HeaderValue(hdr, server.JSSchedulePattern) != "" && jswire.HeaderValue(hdr, server.JSMsgRollup) == "" {
		// A schedule replaces the subject's one before, as nats-server stores it.
		hdr = jswire.AppendHeaders(hdr, server.JSMsgRollup, server.JSMsgRollupSubject)
		m.Header = hdr
	}
	m.MsgID = jswire.HeaderValue(hdr, server.JSMsgId)
	if e := checkStorable(server.JSMsgId, m.MsgID); e != nil {
		return e
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
	if e := checkStorable(server.JSExpectedLastMsgId, m.ExpectLastMsgID); e != nil {
		return e
	}
	// nats-server finds an invalid TTL only as it stores the message, after everything else.
	ttl, ok := parseTTL(jswire.HeaderValue(hdr, server.JSMessageTTL))
	if !ok {
		return server.NewJSMessageTTLInvalidError()
	}
	setTTL(cfg, m, ttl)
	if cfg.AllowMsgCounter {
		m.Derive = counterDerive(cfg, hdr)
	}
	return nil
}

// reject answers a publish with a JetStream error, or counts it as dropped when it has no
// reply subject to answer on.
func (r *Registry) reject(s *Stream, reply, reason string, e *server.ApiError) {
	if reply == "" {
		r.m.dropped.WithLabelValues(reason).Inc()
		return
	}
	r.m.rejected.WithLabelValues(reason).Inc()
	_ = r.cfg.Link.Publish(reply, "", nil, jswire.PubError(s.name, e))
}

// kickLocked starts a flush of s at once when no append transaction is in flight and the lane
// has a permit (fire on idle: a lone publish commits in one round trip). Otherwise s waits
// in the ready queue, and the transaction in flight takes it into the next bundle as it
// ends. It must be called with s.in.mu held.
func (r *Registry) kickLocked(s *Stream) {
	in := &s.in
	if in.flushing || in.queued || len(in.buf) == 0 {
		return
	}
	if r.inFlight.CompareAndSwap(0, 1) {
		if p, ok := r.cfg.Append.TryAcquire(); ok {
			in.flushing = true
			r.youngest.Store(r.cfg.Clock.Now().UnixNano())
			if !r.flushes.Go(func() { r.flushChain(p, []*Stream{s}) }) {
				// The registry stopped: what is left goes unanswered, like any publish it
				// never acknowledged, and the publisher retries elsewhere.
				in.flushing = false
				p.Abandon()
				r.flushEnded()
			}
			return
		}
		r.flushEnded()
	}
	in.queued = true
	r.ready.push(s)
}

// flushEnded counts an append transaction out and wakes the dispatcher, which may be waiting
// for the lane to go idle.
func (r *Registry) flushEnded() {
	r.inFlight.Add(-1)
	wake.Poke(r.flushDone)
}

// flushChain flushes group, then, while streams are ready and the lane has a permit, the
// next bundle of them, on the same goroutine: the hand-off from one transaction to the next
// leaves no moment in which the lane looks idle, which would let a lone publish take it
// first and split the bundle.
func (r *Registry) flushChain(p *flow.Permit, group []*Stream) {
	for {
		r.flush(p, group)
		if r.ready.empty() {
			break
		}
		next, ok := r.cfg.Append.TryAcquire()
		if !ok {
			// The limit shrank under what is in flight: the dispatcher waits for a permit.
			break
		}
		if group = r.takeReady(); len(group) == 0 {
			next.Abandon()
			break
		}
		p = next
		r.youngest.Store(r.cfg.Clock.Now().UnixNano())
	}
	r.flushEnded()
}

// takeReady pops up to FlushMaxStreams ready streams and marks them flushing.
func (r *Registry) takeReady() []*Stream {
	var group []*Stream
	for len(group) < r.cfg.FlushMaxStreams {
		s, ok := r.ready.pop()
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
func (r *Registry) dispatchFlushes() {
	for {
		if !r.ready.waitReady(r.ctx) || !r.waitOverlap() {
			return
		}
		busy := r.inFlight.Load() > 0
		p, err := r.cfg.Append.Acquire(r.ctx)
		if err != nil {
			return
		}
		group := r.takeReady()
		if len(group) == 0 {
			p.Abandon()
			continue
		}
		if busy {
			r.m.overlaps.Inc()
		}
		r.inFlight.Add(1)
		r.youngest.Store(r.cfg.Clock.Now().UnixNano())
		if !r.flushes.Go(func() { r.flushChain(p, group) }) {
			p.Abandon() // the registry stopped, see kickLocked
			r.flushEnded()
			return
		}
	}
}

// waitOverlap returns once the lane is idle or its youngest transaction has run for
// FlushOverlapAfter, or false when the registry stops.
func (r *Registry) waitOverlap() bool {
	for {
		if r.inFlight.Load() == 0 {
			return true
		}
		age := time.Duration(r.cfg.Clock.Now().UnixNano() - r.youngest.Load())
		if age >= r.cfg.FlushOverlapAfter {
			return true
		}
		t := r.cfg.Clock.NewTimer(r.cfg.FlushOverlapAfter - age)
		select {
		case <-r.ctx.Done():
			t.Stop()
			return false
		case <-r.flushDone:
		case <-t.C():
		}
		t.Stop()
	}
}

// flush commits what the given streams have accumulated in one transaction, answers every
// publisher after the commit, and hands the committed rows to the consumers.
func (r *Registry) flush(p *flow.Permit, group []*Stream) {
	started := r.cfg.Clock.Now().UnixNano()
	for _, s := range group {
		s.in.flushSince.Store(started)
	}
	batches := make([]pg.AppendBatch, 0, len(group))
	taken := make(map[int64][]publish, len(group))
	total := 0
	for _, s := range group {
		in := &s.in
		in.mu.Lock()
		n := min(len(in.buf), r.cfg.FlushMaxMsgs)
		// An atomic batch goes into a transaction alone: what it refuses, it refuses whole.
		for k := range n {
			if in.buf[k].batch != nil {
				n = max(k, 1)
				break
			}
		}
		pubs := in.buf[:n:n]
		in.buf = in.buf[n:]
		took := 0
		for _, pb := range pubs {
			took += pb.size
		}
		in.bytes -= took
		r.intakeTotal.Add(-int64(took))
		if len(in.buf) == 0 {
			in.buf = nil
		}
		in.mu.Unlock()
		if n == 0 {
			continue
		}
		cfg := s.ConfigView()
		whole := pubs[0].batch != nil
		var msgs []pg.AppendMsg
		if whole {
			n = len(pubs[0].batch.msgs)
			msgs = msgBufs.get(n)
			copy(msgs, pubs[0].batch.msgs)
		} else {
			msgs = msgBufs.get(n)
			for i := range pubs {
				msgs[i] = pubs[i].msg
			}
		}
		if cfg.Retention == server.InterestPolicy {
			subjects := make([]string, n)
			for i := range msgs {
				subjects[i] = msgs[i].Subject
			}
			for i, none := range r.cfg.NoInterest(s, subjects) {
				msgs[i].NoInterest = none
			}
		}
		taken[s.id] = pubs
		batches = append(batches, pg.AppendBatch{StreamID: s.id, DupWindow: cfg.Duplicates, ChunkRows: s.ChunkRows(),
			Limits: Limits(cfg), Msgs: msgs, Atomic: whole})
		r.m.batchMsgs.Observe(float64(n))
		total += n
	}
	if len(batches) == 0 {
		p.Abandon()
	} else {
		r.m.batchTx.Observe(float64(len(batches)))
		r.m.txMsgs.Observe(float64(total))
		// The flush is not tied to a request: it must finish and answer even while the
		// registry stops, so only the statement timeout and Stop's deadline bound it.
		results, rtt, err := r.cfg.DB.Append(r.flushCtx, batches, r.cfg.Clock.Now().UnixNano())
		permit.Return(p, rtt, err)
		r.m.commit.Observe(rtt.Seconds())
		byID := make(map[int64]*Stream, len(group))
		for _, s := range group {
			byID[s.id] = s
		}
		// The results hold what was stored even when err says that other batches were not.
		for _, res := range results {
			r.committed(byID[res.StreamID], taken[res.StreamID], res)
		}
		if err != nil {
			settled := make(map[int64]bool, len(batches))
			for _, res := range results {
				settled[res.StreamID] = true
			}
			if ue, ok := errors.AsType[*pg.OutcomeUnknownError](err); ok {
				r.settleUnknown(ue, byID, taken, settled)
			}
			failed := 0
			for _, bt := range batches {
				if settled[bt.StreamID] {
					continue
				}
				failed++
				s := byID[bt.StreamID]
				for _, pb := range taken[bt.StreamID] {
					r.reject(s, pb.reply, ReasonDatabase, jserr.PublishFailed(err))
				}
			}
			if failed > 0 {
				r.warnAppend.Warn(r.log, r.cfg.Clock.Now(), "append transaction failed", "streams", failed, "err", err)
			}
		}
	}
	for _, s := range group {
		s.in.flushSince.Store(0)
		s.in.mu.Lock()
		s.in.flushing = false
		r.kickLocked(s)
		s.in.mu.Unlock()
	}
	for _, bt := range batches {
		msgBufs.put(bt.Msgs)
		publishBufs.put(taken[bt.StreamID])
	}
}

// committed announces what an append stored in s and answers its publishers.
func (r *Registry) committed(s *Stream, pubs []publish, res pg.AppendResult) {
	// Consumers hear of what the commit removed and added before any publisher hears of
	// the commit, so a fetch sent on a PubAck sees both.
	if !res.Gone {
		s.Commit(r.flushCtx, res)
		r.stored(s, res.Stored)
	}
	r.answer(s, pubs, res)
}

// settleUnknown answers the publishes of an append transaction whose commit got no answer with
// what reading it back finds: a PubAck for a batch found stored, after its commit is
// announced as any other; nothing yet for one found not stored, which the caller answers
// as failed; and no answer at all while it cannot tell, since a failure could be a lie:
// the client's timeout and its retry decide, and a retry with the same Nats-Msg-Id is
// answered as a duplicate if the first was stored. Such a commit may have stored messages
// that nothing in memory knows of, so the stream's tail, get index and consumers forget
// what they hold of it. It marks in settled the streams it answered or left unanswered.
func (r *Registry) settleUnknown(ue *pg.OutcomeUnknownError, byID map[int64]*Stream, taken map[int64][]publish, settled map[int64]bool) {
	res, err := r.cfg.DB.Resolve(r.flushCtx, ue)
	for _, stored := range res.Stored {
		r.committed(byID[stored.StreamID], taken[stored.StreamID], stored)
		r.m.outcomeUnknown.WithLabelValues(foundStored).Add(float64(len(taken[stored.StreamID])))
		settled[stored.StreamID] = true
	}
	for _, id := range res.NotStored {
		r.m.outcomeUnknown.WithLabelValues(foundNotStored).Add(float64(len(taken[id])))
	}
	unanswered := 0
	for _, id := range ue.Streams() {
		if settled[id] || slices.Contains(res.NotStored, id) {
			continue
		}
		settled[id] = true
		unanswered += len(taken[id])
		byID[id].Purge(r.flushCtx, Purged{})
	}
	if unanswered > 0 {
		r.m.outcomeUnknown.WithLabelValues(foundUnknown).Add(float64(unanswered))
		r.log.Warn("an append transaction's commit got no answer and could not be read back: its publishes are left unanswered",
			"publishes", unanswered, "err", err)
	}
}

// Limits is what the append transaction enforces of a stream's configuration.
func Limits(cfg *server.StreamConfig) pg.Limits {
	return pg.Limits{
		MaxMsgs:       cfg.MaxMsgs,
		MaxBytes:      cfg.MaxBytes,
		MaxMsgsPer:    cfg.MaxMsgsPer,
		DiscardNew:    cfg.Discard == server.DiscardNew,
		DiscardNewPer: cfg.DiscardNewPer,
	}
}

// answer sends each publisher its PubAck (or the error its expectation produced).
func (r *Registry) answer(s *Stream, pubs []publish, res pg.AppendResult) {
	now := r.cfg.Clock.Now()
	if len(pubs) == 1 && pubs[0].batch != nil {
		r.answerBatch(s, pubs[0], res, now)
		return
	}
	for i, pb := range pubs {
		o := res.Outcomes[i]
		if o.Err != nil {
			r.reject(s, pb.reply, RefusedReason(o.Err), jserr.PublishRefused(o.Err))
			continue
		}
		r.m.accepted.Inc()
		if o.Duplicate {
			r.m.rejected.WithLabelValues(ReasonDuplicate).Inc()
		}
		if pb.reply == "" {
			continue
		}
		if o.Data != "" {
			_ = r.cfg.Link.Publish(pb.reply, "", nil, jswire.PubAckCounter(s.ackPfx, o.Seq, counterVal(o.Data)))
		} else {
			_ = r.cfg.Link.Publish(pb.reply, "", nil, jswire.PubAck(s.ackPfx, o.Seq, o.Duplicate))
		}
		r.m.pubAck.Observe(now.Sub(pb.recv).Seconds())
	}
}

// drain flushes whatever is still buffered, for Stop: nothing taken in is lost. It
// returns once every flush committed and answered, or with ctx's error.
func (r *Registry) drain(ctx context.Context) error {
	for _, s := range r.List() {
		s.in.mu.Lock()
		r.kickLocked(s)
		s.in.mu.Unlock()
	}
	// Streams parked in the ready queue still need a permit; the dispatcher runs until Stop
	// stops it, which it does only after this drain. The wait is for
	// the dispatcher, not for time, so it polls on the system clock: on the registry's, a fake
	// clock that no test moves while it stops the registry would never end it.
	for !r.ready.empty() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return r.flushes.Wait(ctx)
}

// closeIntake answers everything still buffered in s with e and takes no more: the stream
// is gone.
func (r *Registry) closeIntake(s *Stream, e *server.ApiError) {
	in := &s.in
	in.mu.Lock()
	pubs := in.buf
	r.intakeTotal.Add(-int64(in.bytes))
	in.buf, in.bytes, in.closed = nil, 0, true
	in.mu.Unlock()
	r.dropBatches(s)
	for _, pb := range pubs {
		r.reject(s, pb.reply, ReasonStopping, e)
	}
}

// readyQueue is the FIFO of streams waiting for an append permit. A stream is in it at most
// once (intake.queued), so its length is bounded by the number of streams.
type readyQueue struct {
	mu     sync.Mutex
	items  []*Stream
	signal chan struct{}
}

func newReadyQueue() *readyQueue { return &readyQueue{signal: make(chan struct{}, 1)} }

func (q *readyQueue) push(s *Stream) {
	q.mu.Lock()
	q.items = append(q.items, s)
	q.mu.Unlock()
	wake.Poke(q.signal)
}

func (q *readyQueue) pop() (*Stream, bool) {
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

func (q *readyQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
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
