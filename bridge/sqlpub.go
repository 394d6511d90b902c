package bridge

import (
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/internal/warnlog"
	"github.com/jetgres/jetgres/pg"
)

// The mover brings what applications published with jetgres.publish into their streams.
// A commit that published notifies pg.StagedChannel, which wakes it, unless a mover is
// awake (pg.MoverAwake): an awake mover looks every moverAwakePoll on its own, and lets go
// moverLinger after its last move, then keeps to the tick period until every transaction
// that may have committed without notifying has ended (pg.StagedSettled). Its timer is the
// fallback, at the tick period while there is work and backing off to TickIdleMaxDefault
// while there is none. Each move takes a push lane permit, like a flush, and appends one
// snapshot-bounded batch of committed staged messages through the same append path, so
// that sequences, de-duplication and limits apply as to a NATS publish.
//
// A move may append to a stream while that stream's own flush is in flight: the state
// row's lock orders the two in PostgreSQL as it orders the flushes of several replicas,
// and the tail takes their rows in whichever order they are reported.

const (
	// stagingRotatePeriod is how long a staging table takes calls before the mover switches
	// to the other one, which bounds how much staging holds: what a period brings, twice.
	stagingRotatePeriod = time.Second
	// stagingRotateEvery is how often the mover takes a step of the rotation at most: a
	// switch comes up to this late, and staging holds that much more.
	stagingRotateEvery = 100 * time.Millisecond
	// listenRetry is the pause before listening again after the connection failed.
	listenRetry = time.Second
	// moverAwakePoll is how often an awake mover looks for committed messages, and so the
	// longest a message waits to be moved while commits do not notify; moverLinger is how
	// long it stays awake after its last move. Awake, it costs one small query a poll; the
	// commits it spares a NOTIFY share their WAL flushes instead of taking turns.
	moverAwakePoll = 2 * time.Millisecond
	moverLinger    = 100 * time.Millisecond
)

// Refusal reasons at the move, the label values of jetgres_sql_publish_refused_total,
// besides the publish path's own (reasonSealed, reasonTooLarge, reasonUnstorable,
// reasonExpected, reasonLimit, reasonDuplicate). The publish path refuses with
// reasonNoStream too.
const (
	reasonNoStream   = "no_stream"   // the stream was deleted since the call
	reasonNotTaken   = "not_taken"   // the stream no longer takes the subject
	reasonFeatureOff = "unsupported" // a header asks for a feature jetgres refuses
)

var errStreamUnknown = errors.New("bridge: a staged message names a stream this process does not know yet")

type sqlMetrics struct {
	moved   prometheus.Counter
	refused *prometheus.CounterVec
	moves   prometheus.Counter
}

func newSQLMetrics(reg prometheus.Registerer) *sqlMetrics {
	m := &sqlMetrics{
		moved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_sql_publish_moved_total",
			Help: "Messages published with jetgres.publish and stored in their streams.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetgres_sql_publish_refused_total",
			Help: "Messages published with jetgres.publish that their stream refused when they were moved (duplicates included), by reason.",
		}, []string{"reason"}),
		moves: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_sql_publish_moves_total",
			Help: "Transactions that moved staged messages into their streams.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.moved, m.refused, m.moves)
	}
	return m
}

// sqlMover is the mover's state.
type sqlMover struct {
	m    *sqlMetrics
	wake chan struct{}

	warnMove, warnRefused, warnListen warnlog.Throttle
}

func newSQLMover(reg prometheus.Registerer) *sqlMover {
	return &sqlMover{m: newSQLMetrics(reg), wake: make(chan struct{}, 1)}
}

func (b *Bridge) startSQLMover() {
	b.bg.Go(b.listenStaged)
	b.bg.Go(b.moveLoop)
}

// listenStaged wakes the mover on every commit that published, for as long as the bridge runs.
func (b *Bridge) listenStaged() {
	for {
		err := b.db.Listen(b.ctx, pg.StagedChannel, func() { poke(b.sql.wake) })
		if b.ctx.Err() != nil {
			return
		}
		b.sql.warnListen.Warn(b.log, b.clock.Now(), "listening for SQL publishes failed; moving on the timer", "err", err)
		t := b.clock.NewTimer(listenRetry)
		select {
		case <-b.ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

func (b *Bridge) moveLoop() {
	base := b.cfg.TickPeriod
	period := base
	t := b.clock.NewTimer(period)
	defer t.Stop()
	awake := b.db.MoverAwake()
	defer awake.Close()
	held := false // awake's lock: commits that publish do not notify
	var lastWork, lastRotate time.Time
	settle := "" // the horizon of the last release, until every transaction below it ended
	for {
		woken := false
		select {
		case <-b.ctx.Done():
			return
		case <-b.sql.wake:
			woken = true
			if !t.Stop() {
				select {
				case <-t.C():
				default:
				}
			}
		case <-t.C():
		}
		moved := false
		if settle != "" {
			// Asked before looking for work, so that what those transactions committed is
			// seen by the look that follows.
			if ok, err := b.db.StagedSettled(b.ctx, settle); err == nil && ok {
				settle = ""
			}
		}
		// Ask first, without a permit: a wake-up may find nothing ready (the one at start,
		// or a commit that an older open transaction holds back), and a mover that took a
		// push permit only to find that would hold back the publishes that need it.
		work, err := b.db.StagedWaiting(b.ctx)
		if err != nil && b.ctx.Err() == nil {
			b.sql.warnMove.Warn(b.log, b.clock.Now(), "looking for SQL publishes failed", "err", err)
		}
		if work && !held {
			// Held from now on, commits stop notifying; one that read the lock free a
			// moment ago notifies all the same, which costs a wake-up and no more.
			if ok, err := awake.Hold(b.ctx); err == nil {
				held = ok
			} else if b.ctx.Err() == nil {
				b.sql.warnMove.Warn(b.log, b.clock.Now(), "taking the SQL mover's awake lock failed", "err", err)
			}
		}
		for work && b.ctx.Err() == nil {
			n, err := b.moveOnce()
			moved = moved || n > 0
			if err != nil || n < b.cfg.FlushMaxMsgs {
				break
			}
		}
		now := b.clock.Now()
		// Not every poll: a rotation step locks the progress row, which makes it a commit
		// with a WAL flush of its own, on the path of every message an awake mover moves.
		if now.Sub(lastRotate) >= stagingRotateEvery && b.ctx.Err() == nil {
			lastRotate = now
			if _, err := b.db.RotateStaging(b.ctx, stagingRotatePeriod); err != nil && b.ctx.Err() == nil {
				b.sql.warnMove.Warn(b.log, b.clock.Now(), "rotating the staging tables failed", "err", err)
			}
		}
		if moved {
			lastWork = now
		}
		if held && now.Sub(lastWork) >= moverLinger && b.ctx.Err() == nil {
			h, err := awake.Release(b.ctx)
			held = false
			if err != nil {
				b.sql.warnMove.Warn(b.log, b.clock.Now(), "letting the SQL mover's awake lock go failed", "err", err)
			}
			// Without a horizon, the idle back-off bounds how late an unnotified commit moves.
			settle = h
		}
		// Awake, nobody notifies: look often. A commit still running elsewhere may hold
		// staged rows back, and one that began before the release may commit unnotified:
		// keep looking at the base period while either may be about.
		switch {
		case held:
			period = min(moverAwakePoll, base)
		case moved || woken || settle != "":
			period = base
		default:
			period = min(period*2, max(TickIdleMaxDefault, base))
		}
		t.Reset(period)
	}
}

// moveOnce moves one batch and reports how many staged messages it took.
func (b *Bridge) moveOnce() (int, error) {
	n, err := b.move(false)
	if errors.Is(err, errStreamUnknown) {
		// Created on another replica a moment ago, or deleted: read the streams again, and
		// refuse what still names none.
		if err := b.syncStreams(b.ctx); err != nil {
			return 0, err
		}
		n, err = b.move(true)
	}
	if err != nil && b.ctx.Err() == nil {
		b.sql.warnMove.Warn(b.log, b.clock.Now(), "moving SQL publishes failed", "err", err)
	}
	return n, err
}

// refusal is a staged message refused before the append.
type refusal struct {
	stream, subject, reason string
}

func (b *Bridge) move(refuseUnknown bool) (int, error) {
	p, err := b.cfg.Push.Acquire(b.ctx)
	if err != nil {
		return 0, err
	}
	byID := make(map[int64]*stream)
	for _, s := range b.streamList() {
		byID[s.id] = s
	}
	var refused []refusal
	var batches []pg.AppendBatch
	plan := func(staged []pg.StagedMsg) ([]pg.AppendBatch, error) {
		refused, batches = refused[:0], batches[:0]
		at := make(map[int64]int)
		for _, sm := range staged {
			s := byID[sm.StreamID]
			if s == nil {
				if !refuseUnknown {
					return nil, errStreamUnknown
				}
				refused = append(refused, refusal{"", sm.Subject, reasonNoStream})
				continue
			}
			m, reason := b.stagedMsg(s, sm)
			if reason != "" {
				refused = append(refused, refusal{s.name, sm.Subject, reason})
				continue
			}
			i, ok := at[s.id]
			if !ok {
				cfg := s.cfgView()
				i = len(batches)
				at[s.id] = i
				batches = append(batches, pg.AppendBatch{StreamID: s.id, DupWindow: cfg.Duplicates,
					ChunkRows: s.chunkRows.Load(), Limits: streamLimits(cfg)})
			}
			batches[i].Msgs = append(batches[i].Msgs, m)
		}
		for i := range batches {
			s := byID[batches[i].StreamID]
			if s.cfgView().Retention != server.InterestPolicy {
				continue
			}
			msgs := batches[i].Msgs
			subjects := make([]string, len(msgs))
			for j := range msgs {
				subjects[j] = msgs[j].Subject
			}
			for j, none := range b.noInterest(s, subjects) {
				msgs[j].NoInterest = none
			}
		}
		return batches, nil
	}
	taken, results, rtt, err := b.db.MoveStaged(b.ctx, b.cfg.FlushMaxMsgs, plan, b.clock.Now().UnixNano())
	giveBack(p, rtt, err)
	if err != nil || taken == 0 {
		return 0, err
	}
	b.sql.m.moves.Inc()
	for _, r := range refused {
		b.refuseStaged(r)
	}
	for _, r := range results {
		s := byID[r.StreamID]
		if !r.Gone {
			s.commit(b.ctx, r)
		}
		for j, o := range r.Outcomes {
			reason := ""
			var le *pg.LimitError
			switch {
			case o.Duplicate:
				reason = reasonDuplicate
			case o.Err == nil:
				b.sql.m.moved.Inc()
			case errors.As(o.Err, &le), errors.Is(o.Err, pg.ErrSeqExhausted):
				reason = reasonLimit
			case errors.Is(o.Err, pg.ErrNotFound):
				reason = reasonNoStream
			default:
				reason = reasonExpected
			}
			if reason != "" {
				b.refuseStaged(refusal{s.name, batchMsg(batches, r.StreamID, j), reason})
			}
		}
	}
	return taken, nil
}

// batchMsg is the subject of message j of stream id's batch.
func batchMsg(batches []pg.AppendBatch, id int64, j int) string {
	i := slices.IndexFunc(batches, func(bt pg.AppendBatch) bool { return bt.StreamID == id })
	if i < 0 || j >= len(batches[i].Msgs) {
		return ""
	}
	return batches[i].Msgs[j].Subject
}

func (b *Bridge) refuseStaged(r refusal) {
	b.sql.m.refused.WithLabelValues(r.reason).Inc()
	if r.reason == reasonDuplicate {
		return
	}
	b.sql.warnRefused.Warn(b.log, b.clock.Now(), "a stream refused a message published with jetgres.publish",
		"stream", r.stream, "subject", r.subject, "reason", r.reason)
}

// stagedMsg checks a staged message as onPublish checks a NATS publish, against the
// stream's configuration now, and returns it as an append, or the reason it is refused.
func (b *Bridge) stagedMsg(s *stream, sm pg.StagedMsg) (pg.AppendMsg, string) {
	cfg := s.cfgView()
	m := pg.AppendMsg{Subject: sm.Subject, Header: sm.Header, Data: sm.Data}
	switch {
	case cfg.Sealed:
		return m, reasonSealed
	case !slices.ContainsFunc(cfg.Subjects, func(f string) bool { return pg.SubjectMatches(f, sm.Subject) }):
		return m, reasonNotTaken
	case cfg.MaxMsgSize > 0 && len(sm.Data)+len(sm.Header) > int(cfg.MaxMsgSize):
		return m, reasonTooLarge
	}
	if len(sm.Header) > 0 {
		if e := parseExpectations(cfg, sm.Header, &m); e != nil {
			if e.ErrCode == badRequestCode {
				return m, reasonUnstorable
			}
			if e.ErrCode == server.ApiErrors[server.JSMessageTTLDisabledErr].ErrCode ||
				e.ErrCode == server.ApiErrors[server.JSAtomicPublishDisabledErr].ErrCode {
				return m, reasonFeatureOff
			}
			return m, reasonExpected
		}
	}
	return m, ""
}
