package sqlmove

import (
	"context"
	"errors"
	"slices"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/internal/permit"
	"github.com/jetgres/jetgres/pg"
)

// Refusal reasons at the move, the label values of jetgres_sql_publish_refused_total,
// besides the publish path's own (stream.ReasonSealed, ReasonTooLarge, ReasonUnstorable,
// ReasonExpected, ReasonLimit, ReasonDuplicate, and ReasonNoStream for a stream deleted
// since the call), which read the same in both.
const (
	reasonNotTaken   = "not_taken"   // the stream no longer takes the subject
	reasonFeatureOff = "unsupported" // a header asks for a feature jetgres refuses
)

// The JetStream error codes that Host.Expectations answers with and that refuse a message
// for a reason of their own.
var (
	badRequestCode     = server.ApiErrors[server.JSBadRequestErr].ErrCode
	ttlDisabledCode    = server.ApiErrors[server.JSMessageTTLDisabledErr].ErrCode
	atomicDisabledCode = server.ApiErrors[server.JSAtomicPublishDisabledErr].ErrCode
)

var errStreamUnknown = errors.New("sqlmove: a staged message names a stream this process does not know yet")

type moverMetrics struct {
	moved   prometheus.Counter
	refused *prometheus.CounterVec
	moves   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *moverMetrics {
	m := &moverMetrics{
		moved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_sql_publish_moved_total",
			Help: "Messages published in SQL (jetgres.publish, jetgres.outbox) and stored in their streams.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetgres_sql_publish_refused_total",
			Help: "Messages published in SQL (jetgres.publish, jetgres.outbox) that were not stored when they were moved, by reason: each is in jetgres.outbox_rejected, but for duplicates.",
		}, []string{"reason"}),
		moves: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_sql_publish_moves_total",
			Help: "Transactions that moved messages published in SQL into their streams.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.moved, m.refused, m.moves)
	}
	return m
}

// moveOnce moves one batch and reports how many staged messages it took.
func (m *Mover[S]) moveOnce(ctx context.Context) (int, error) {
	n, err := m.move(ctx, false)
	if errors.Is(err, errStreamUnknown) {
		// Created on another replica a moment ago, or deleted: read the streams again, and
		// refuse what still names none.
		if err := m.host.Sync(ctx); err != nil {
			return 0, err
		}
		n, err = m.move(ctx, true)
	}
	if err != nil && ctx.Err() == nil {
		m.warnMove.Warn(m.log, m.clock.Now(), "moving SQL publishes failed", "err", err)
	}
	return n, err
}

// refusal is a staged message that is not stored, for the metrics and the log.
type refusal struct {
	stream, subject, reason string
}

// planner is one move's pg.MovePlanner: it checks each staged message against its stream
// as the publish path checks a NATS publish, and rejects what the append refused.
type planner[S Destination] struct {
	m             *Mover[S]
	byID          map[int64]S
	refuseUnknown bool
	staged        []pg.StagedMsg
	batches       []pg.AppendBatch
	origin        [][]int // by batch and message, the index among staged
	refused       []refusal
}

func (p *planner[S]) Plan(staged []pg.StagedMsg) ([]pg.AppendBatch, []pg.Rejection, error) {
	p.staged, p.batches, p.origin, p.refused = staged, p.batches[:0], p.origin[:0], p.refused[:0]
	var rejected []pg.Rejection
	reject := func(k int, stream, reason, detail string) {
		rejected = append(rejected, pg.Rejection{Staged: k, Stream: stream, Reason: reason, Detail: detail})
		p.refused = append(p.refused, refusal{stream, staged[k].Subject, reason})
	}
	at := make(map[int64]int)
	for k, sm := range staged {
		if sm.Problem != "" {
			reject(k, "", sm.Problem, sm.Detail)
			continue
		}
		s, ok := p.byID[sm.StreamID]
		if !ok {
			if !p.refuseUnknown && sm.StreamID != 0 {
				return nil, nil, errStreamUnknown
			}
			reject(k, "", stream.ReasonNoStream, "")
			continue
		}
		msg, reason := p.m.stagedMsg(s, sm)
		if reason != "" {
			reject(k, s.Name(), reason, "")
			continue
		}
		i, ok := at[s.ID()]
		if !ok {
			i = len(p.batches)
			at[s.ID()] = i
			p.batches = append(p.batches, p.m.host.Batch(s))
			p.origin = append(p.origin, nil)
		}
		p.batches[i].Msgs = append(p.batches[i].Msgs, msg)
		p.origin[i] = append(p.origin[i], k)
	}
	for i := range p.batches {
		s := p.byID[p.batches[i].StreamID]
		if s.ConfigView().Retention != server.InterestPolicy {
			continue
		}
		msgs := p.batches[i].Msgs
		subjects := make([]string, len(msgs))
		for j := range msgs {
			subjects[j] = msgs[j].Subject
		}
		for j, none := range p.m.host.NoInterest(s, subjects) {
			msgs[j].NoInterest = none
		}
	}
	return p.batches, rejected, nil
}

// Refused rejects what the append refused; the append reports the batches in the order of
// their streams, which Plan's need not be.
func (p *planner[S]) Refused(results []pg.AppendResult) []pg.Rejection {
	var rejected []pg.Rejection
	for _, r := range results {
		i := slices.IndexFunc(p.batches, func(bt pg.AppendBatch) bool { return bt.StreamID == r.StreamID })
		if i < 0 {
			continue
		}
		name := p.byID[r.StreamID].Name()
		for j, o := range r.Outcomes {
			if o.Err == nil || o.Duplicate || j >= len(p.origin[i]) {
				continue
			}
			k := p.origin[i][j]
			reason := stream.RefusedReason(o.Err)
			rejected = append(rejected, pg.Rejection{Staged: k, Stream: name, Reason: reason, Detail: o.Err.Error()})
			p.refused = append(p.refused, refusal{name, p.staged[k].Subject, reason})
		}
	}
	return rejected
}

func (m *Mover[S]) move(ctx context.Context, refuseUnknown bool) (int, error) {
	p, err := m.appends.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	pl := &planner[S]{m: m, byID: make(map[int64]S), refuseUnknown: refuseUnknown}
	for _, s := range m.host.Streams() {
		pl.byID[s.ID()] = s
	}
	taken, results, rtt, err := m.db.MoveStaged(ctx, m.max, pl, m.clock.Now().UnixNano())
	permit.Return(p, rtt, err)
	if ue, ok := errors.AsType[*pg.OutcomeUnknownError](err); ok {
		if stored, ok := m.resolve(ctx, ue, pl.byID); ok {
			taken, results, err = len(pl.staged), stored, nil
		}
	}
	if err != nil || taken == 0 {
		return 0, err
	}
	m.m.moves.Inc()
	for _, r := range pl.refused {
		m.refuse(r)
	}
	for _, r := range results {
		if !r.Gone {
			m.host.Commit(ctx, pl.byID[r.StreamID], r)
		}
		for _, o := range r.Outcomes {
			switch {
			case o.Duplicate:
				m.m.refused.WithLabelValues(stream.ReasonDuplicate).Inc()
			case o.Err == nil:
				m.m.moved.Inc()
			}
		}
	}
	return taken, nil
}

// resolve finds out whether a move whose commit got no answer committed, and returns its
// results when it did. A move is one transaction, progress included: when it did not
// commit, the next move takes the same staged messages again. When that cannot be told, the
// streams' readers forget what they hold of them, since the move may have stored messages
// that nobody was told of.
func (m *Mover[S]) resolve(ctx context.Context, ue *pg.OutcomeUnknownError, byID map[int64]S) ([]pg.AppendResult, bool) {
	r, err := m.db.Resolve(ctx, ue)
	switch {
	case err == nil && len(r.NotStored) > 0:
		return nil, false
	case err == nil && len(r.Stored) == len(ue.Streams()):
		return r.Stored, true
	}
	for _, id := range ue.Streams() {
		if s, ok := byID[id]; ok {
			m.host.Forget(ctx, s)
		}
	}
	return nil, false
}

func (m *Mover[S]) refuse(r refusal) {
	m.m.refused.WithLabelValues(r.reason).Inc()
	if r.reason == stream.ReasonDuplicate {
		return
	}
	m.warnRefused.Warn(m.log, m.clock.Now(), "a message published in SQL was refused and recorded in jetgres.outbox_rejected",
		"stream", r.stream, "subject", r.subject, "reason", r.reason)
}

// stagedMsg checks a staged message as the publish path checks a NATS publish, against the
// stream's configuration now, and returns it as an append, or the reason it is refused.
func (m *Mover[S]) stagedMsg(s S, sm pg.StagedMsg) (pg.AppendMsg, string) {
	cfg := s.ConfigView()
	msg := pg.AppendMsg{Subject: s.StoredSubject(sm.Subject), Header: sm.Header, Data: sm.Data}
	switch {
	case cfg.Sealed:
		return msg, stream.ReasonSealed
	case !slices.ContainsFunc(cfg.Subjects, func(f string) bool { return pg.SubjectMatches(f, sm.Subject) }):
		return msg, reasonNotTaken
	case cfg.MaxMsgSize > 0 && len(sm.Data)+len(sm.Header) > int(cfg.MaxMsgSize):
		return msg, stream.ReasonTooLarge
	}
	if len(sm.Header) > 0 || cfg.AllowMsgCounter {
		if e := m.host.Expectations(cfg, sm.Header, &msg); e != nil {
			switch e.ErrCode {
			case badRequestCode:
				return msg, stream.ReasonUnstorable
			case ttlDisabledCode, atomicDisabledCode:
				return msg, reasonFeatureOff
			}
			return msg, stream.ReasonExpected
		}
	}
	return msg, ""
}
