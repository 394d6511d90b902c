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

// refusal is a staged message refused before the append.
type refusal struct {
	stream, subject, reason string
}

func (m *Mover[S]) move(ctx context.Context, refuseUnknown bool) (int, error) {
	p, err := m.appends.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	byID := make(map[int64]S)
	for _, s := range m.host.Streams() {
		byID[s.ID()] = s
	}
	var refused []refusal
	var batches []pg.AppendBatch
	planned := 0
	plan := func(staged []pg.StagedMsg) ([]pg.AppendBatch, error) {
		refused, batches, planned = refused[:0], batches[:0], len(staged)
		at := make(map[int64]int)
		for _, sm := range staged {
			s, ok := byID[sm.StreamID]
			if !ok {
				if !refuseUnknown {
					return nil, errStreamUnknown
				}
				refused = append(refused, refusal{"", sm.Subject, stream.ReasonNoStream})
				continue
			}
			msg, reason := m.stagedMsg(s, sm)
			if reason != "" {
				refused = append(refused, refusal{s.Name(), sm.Subject, reason})
				continue
			}
			i, ok := at[s.ID()]
			if !ok {
				i = len(batches)
				at[s.ID()] = i
				batches = append(batches, m.host.Batch(s))
			}
			batches[i].Msgs = append(batches[i].Msgs, msg)
		}
		for i := range batches {
			s := byID[batches[i].StreamID]
			if s.ConfigView().Retention != server.InterestPolicy {
				continue
			}
			msgs := batches[i].Msgs
			subjects := make([]string, len(msgs))
			for j := range msgs {
				subjects[j] = msgs[j].Subject
			}
			for j, none := range m.host.NoInterest(s, subjects) {
				msgs[j].NoInterest = none
			}
		}
		return batches, nil
	}
	taken, results, rtt, err := m.db.MoveStaged(ctx, m.max, plan, m.clock.Now().UnixNano())
	permit.Return(p, rtt, err)
	if ue, ok := errors.AsType[*pg.OutcomeUnknownError](err); ok {
		if stored, ok := m.resolve(ctx, ue, byID); ok {
			taken, results, err = planned, stored, nil
		}
	}
	if err != nil || taken == 0 {
		return 0, err
	}
	m.m.moves.Inc()
	for _, r := range refused {
		m.refuse(r)
	}
	for _, r := range results {
		s := byID[r.StreamID]
		if !r.Gone {
			m.host.Commit(ctx, s, r)
		}
		for j, o := range r.Outcomes {
			reason := ""
			switch {
			case o.Duplicate:
				reason = stream.ReasonDuplicate
			case o.Err == nil:
				m.m.moved.Inc()
			default:
				reason = stream.RefusedReason(o.Err)
			}
			if reason != "" {
				m.refuse(refusal{s.Name(), batchMsg(batches, r.StreamID, j), reason})
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

// batchMsg is the subject of message j of stream id's batch.
func batchMsg(batches []pg.AppendBatch, id int64, j int) string {
	i := slices.IndexFunc(batches, func(bt pg.AppendBatch) bool { return bt.StreamID == id })
	if i < 0 || j >= len(batches[i].Msgs) {
		return ""
	}
	return batches[i].Msgs[j].Subject
}

func (m *Mover[S]) refuse(r refusal) {
	m.m.refused.WithLabelValues(r.reason).Inc()
	if r.reason == stream.ReasonDuplicate {
		return
	}
	m.warnRefused.Warn(m.log, m.clock.Now(), "a stream refused a message published with jetgres.publish",
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
	if len(sm.Header) > 0 {
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
