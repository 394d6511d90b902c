package schedule

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/bridge/schedule/pattern"
	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/internal/clock"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/internal/startstop"
	"github.com/jetgres/jetgres/internal/warnlog"
	"github.com/jetgres/jetgres/pg"
)

// PeriodDefault is how often the scheduler looks for schedules due: nats-server's
// scheduler never fires sooner than 250 ms after its last run either.
const PeriodDefault = 250 * time.Millisecond

// scanBatch bounds the messages one read of a stream brings.
const scanBatch = 1000

// Stream is what the scheduler needs of a stream.
type Stream interface {
	ID() int64
	Name() string
	ConfigView() *server.StreamConfig
}

// Store is what the scheduler reads; *pg.DB satisfies it.
type Store interface {
	HighWater(ctx context.Context, ids []int64) (map[int64]uint64, error)
	ReadFiltered(ctx context.Context, p pg.ReadParams, filters []string) ([]pg.Message, uint64, time.Duration, error)
	LastBySubject(ctx context.Context, streamID int64, filter string) (*pg.Message, error)
	// ClockOffset is how far PostgreSQL's clock, which stamps messages, is ahead of the
	// replica's.
	ClockOffset() (time.Duration, bool)
}

// Host is what the scheduler asks of the bridge.
type Host[S Stream] interface {
	// Streams are the streams this process serves.
	Streams() []S
	// Hold reports whether this replica fires the schedules of the stream streamID,
	// taking that role if no replica has it.
	Hold(ctx context.Context, streamID int64) (bool, error)
	// Append stores a produced message in s as the stream stores a publish, with its
	// Nats-TTL and Nats-Rollup, announces it, and returns its sequence.
	Append(ctx context.Context, s S, subject string, hdr, data []byte) (uint64, error)
	// Purge removes the messages of subject in s below sequence upTo, announces it when it
	// removed any, and reports whether it did.
	Purge(ctx context.Context, s S, subject string, upTo uint64) (bool, error)
}

// Config configures a Scheduler. Store, Host and Clock are required.
type Config[S Stream] struct {
	Store Store
	Host  Host[S]
	Clock clock.Clock
	// Logger receives the scheduler's records. Defaults to discarding them.
	Logger *slog.Logger
	// Period is how often it looks for schedules due. Defaults to PeriodDefault.
	Period time.Duration
	// Registerer receives the scheduler's metrics. Nil registers nothing.
	Registerer prometheus.Registerer
}

// Scheduler fires the message schedules of the streams whose scheduler lock this replica
// holds.
type Scheduler[S Stream] struct {
	cfg     Config[S]
	g       startstop.Group
	streams map[int64]*streamState
	m       metrics
	// warn thins the warnings that would repeat every pass while the database is away.
	warn warnlog.Throttle
}

// streamState is what the scheduler read of one stream it holds.
type streamState struct {
	scanned uint64            // the sequence through which its messages were read
	sched   map[string]*entry // by the schedule's subject
	purges  []purge
}

// entry is one schedule: the message that holds it and when it fires next.
type entry struct {
	seq uint64
	due time.Time
}

// purge is a message's "Nats-Schedule-Next: purge": the messages of subject below upTo go.
type purge struct {
	subject string
	upTo    uint64
}

// New builds a Scheduler; Start runs it.
func New[S Stream](cfg Config[S]) (*Scheduler[S], error) {
	if cfg.Store == nil || cfg.Host == nil || cfg.Clock == nil {
		return nil, errors.New("schedule: Config.Store, Host and Clock are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Period <= 0 {
		cfg.Period = PeriodDefault
	}
	return &Scheduler[S]{cfg: cfg, streams: map[int64]*streamState{}, m: newMetrics(cfg.Registerer)}, nil
}

// Start runs the scheduler's goroutine under ctx until Stop.
func (sc *Scheduler[S]) Start(ctx context.Context) error {
	ctx, err := sc.g.Start(ctx)
	if err != nil {
		return err
	}
	sc.g.Go(func() { sc.run(ctx) })
	return nil
}

// Stop stops the goroutine and waits for it.
func (sc *Scheduler[S]) Stop() { sc.g.Stop() }

func (sc *Scheduler[S]) run(ctx context.Context) {
	t := sc.cfg.Clock.NewTicker(sc.cfg.Period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			sc.pass(ctx)
		}
	}
}

// pass looks at every stream that allows schedules: it takes or confirms the stream's
// lock, reads what was committed since the last pass (the high-water marks of all of them
// in one statement), fires what is due, and purges what asks to be.
func (sc *Scheduler[S]) pass(ctx context.Context) {
	var held []S
	var ids []int64
	seen := make(map[int64]bool)
	for _, s := range sc.cfg.Host.Streams() {
		if !s.ConfigView().AllowMsgSchedules {
			continue
		}
		id := s.ID()
		seen[id] = true
		ok, err := sc.cfg.Host.Hold(ctx, id)
		if err != nil || !ok {
			if err != nil && ctx.Err() == nil {
				sc.warn.Warn(sc.cfg.Logger, sc.cfg.Clock.Now(), "taking the scheduler lock failed", "stream", s.Name(), "err", err)
			}
			// Another replica fires, or may: whoever holds it next reads it afresh.
			delete(sc.streams, id)
			continue
		}
		held, ids = append(held, s), append(ids, id)
	}
	for id := range sc.streams {
		if !seen[id] {
			delete(sc.streams, id)
		}
	}
	if len(held) == 0 {
		return
	}
	hws, err := sc.cfg.Store.HighWater(ctx, ids)
	if err != nil {
		if ctx.Err() == nil {
			sc.warn.Warn(sc.cfg.Logger, sc.cfg.Clock.Now(), "reading the streams' high-water marks failed", "err", err)
		}
		return
	}
	for _, s := range held {
		st := sc.streams[s.ID()]
		if st == nil {
			st = &streamState{sched: map[string]*entry{}}
			sc.streams[s.ID()] = st
		}
		if err := sc.scan(ctx, s, st, hws[s.ID()]); err != nil {
			sc.m.failures.Inc()
			if ctx.Err() == nil {
				sc.warn.Warn(sc.cfg.Logger, sc.cfg.Clock.Now(), "reading message schedules failed", "stream", s.Name(), "err", err)
			}
			continue
		}
		sc.fire(ctx, s, st)
		sc.purge(ctx, s, st)
	}
}

// scan reads what s committed since the last pass, through its high-water mark hw.
func (sc *Scheduler[S]) scan(ctx context.Context, s S, st *streamState, hw uint64) error {
	for st.scanned < hw {
		msgs, through, _, err := sc.cfg.Store.ReadFiltered(ctx, pg.ReadParams{StreamID: s.ID(), From: st.scanned + 1, UpTo: hw, MaxMsgs: scanBatch}, nil)
		if err != nil {
			return err
		}
		off, _ := sc.cfg.Store.ClockOffset()
		for i := range msgs {
			sc.apply(st, &msgs[i], off)
		}
		if through <= st.scanned {
			break
		}
		st.scanned = through
	}
	return nil
}

// apply takes one stored message into the schedules, as nats-server's store does; off is
// PostgreSQL's clock offset, by which its time stamp is read on the replica's clock.
func (sc *Scheduler[S]) apply(st *streamState, m *pg.Message, off time.Duration) {
	if p := jswire.HeaderValue(m.Header, server.JSSchedulePattern); p != "" {
		if due, ok := sc.next(p, m.Header, m.TS-int64(off)); ok {
			st.sched[m.Subject] = &entry{seq: m.Seq, due: due}
			return
		}
		delete(st.sched, m.Subject)
		return
	}
	scheduler := jswire.HeaderValue(m.Header, server.JSScheduler)
	if scheduler == "" {
		// Any other message on a schedule's subject ends it.
		delete(st.sched, m.Subject)
		return
	}
	next := jswire.HeaderValue(m.Header, server.JSScheduleNext)
	e := st.sched[scheduler]
	if next == server.JSScheduleNextPurge {
		st.purges = append(st.purges, purge{subject: scheduler, upTo: m.Seq})
		if e != nil && e.seq < m.Seq {
			delete(st.sched, scheduler)
		}
		return
	}
	if t, err := time.Parse(time.RFC3339Nano, next); err == nil && e != nil {
		e.due = t
	}
}

// next is when a schedule stored at ts (unix ns) fires next.
func (sc *Scheduler[S]) next(p string, hdr []byte, ts int64) (time.Time, bool) {
	tz := jswire.HeaderValue(hdr, server.JSScheduleTimeZone)
	loc, ok := pattern.Location(tz, tz != "")
	if !ok {
		return time.Time{}, false
	}
	due, _, ok := pattern.Next(p, loc, ts, sc.cfg.Clock.Now())
	return due, ok
}

// purge carries out the purges read.
func (sc *Scheduler[S]) purge(ctx context.Context, s S, st *streamState) {
	for len(st.purges) > 0 {
		p := st.purges[0]
		removed, err := sc.cfg.Host.Purge(ctx, s, p.subject, p.upTo)
		if err != nil {
			sc.m.failures.Inc()
			if ctx.Err() == nil {
				sc.warn.Warn(sc.cfg.Logger, sc.cfg.Clock.Now(), "purging a message schedule failed", "stream", s.Name(), "subject", p.subject, "err", err)
			}
			return
		}
		st.purges = st.purges[1:]
		if removed {
			sc.m.purged.Inc()
		}
	}
}

// fire produces the message of every schedule due, in the order of the schedules'
// sequences, as nats-server does.
func (sc *Scheduler[S]) fire(ctx context.Context, s S, st *streamState) {
	now := sc.cfg.Clock.Now()
	subjects := slices.SortedFunc(maps.Keys(st.sched), func(a, b string) int { return cmp.Compare(st.sched[a].seq, st.sched[b].seq) })
	for _, subj := range subjects {
		e := st.sched[subj]
		if now.Before(e.due) {
			continue
		}
		msgs, _, _, err := sc.cfg.Store.ReadFiltered(ctx, pg.ReadParams{StreamID: s.ID(), From: e.seq, UpTo: e.seq, MaxMsgs: 1}, nil)
		if err != nil {
			sc.failed(ctx, s, subj, err)
			return
		}
		if len(msgs) == 0 || msgs[0].Seq != e.seq {
			// Deleted or purged since it was read.
			delete(st.sched, subj)
			continue
		}
		target, hdr, data, ok, err := sc.produce(ctx, s, &msgs[0], e.due, now)
		if err != nil {
			sc.failed(ctx, s, subj, err)
			return
		}
		if !ok {
			delete(st.sched, subj)
			continue
		}
		seq, err := sc.cfg.Host.Append(ctx, s, target, hdr, data)
		if err != nil {
			sc.failed(ctx, s, subj, err)
			return
		}
		sc.m.fired.Inc()
		// Taken in at once, as the scan will take it again: a produced message that limits
		// remove before the scan reads it must not leave its schedule due.
		sc.apply(st, &pg.Message{Seq: seq, Subject: target, Header: hdr}, 0)
	}
}

func (sc *Scheduler[S]) failed(ctx context.Context, s S, subject string, err error) {
	sc.m.failures.Inc()
	if ctx.Err() == nil {
		sc.warn.Warn(sc.cfg.Logger, sc.cfg.Clock.Now(), "firing a message schedule failed", "stream", s.Name(), "subject", subject, "err", err)
	}
}

// produce builds the message schedule m produces when it fires, due at due; ok is false
// for a schedule nats-server drops rather than fires (one whose headers no longer read).
func (sc *Scheduler[S]) produce(ctx context.Context, s S, m *pg.Message, due, now time.Time) (target string, hdr, data []byte, ok bool, err error) {
	p := jswire.HeaderValue(m.Header, server.JSSchedulePattern)
	tz := jswire.HeaderValue(m.Header, server.JSScheduleTimeZone)
	loc, ok := pattern.Location(tz, tz != "")
	if !ok || p == "" {
		return "", nil, nil, false, nil
	}
	next, repeat, ok := pattern.Next(p, loc, due.UnixNano(), now)
	if !ok {
		return "", nil, nil, false, nil
	}
	ttl := jswire.HeaderValue(m.Header, server.JSScheduleTTL)
	target = jswire.HeaderValue(m.Header, server.JSScheduleTarget)
	if target == "" || !stream.ValidTTL(ttl) {
		return "", nil, nil, false, nil
	}
	rollup := jswire.HeaderValue(m.Header, server.JSScheduleRollup)
	hdr, data = m.Header, m.Data
	if source := jswire.HeaderValue(m.Header, server.JSScheduleSource); source != "" {
		src, err := sc.cfg.Store.LastBySubject(ctx, s.ID(), source)
		switch {
		case err == nil:
			hdr, data = src.Header, src.Data
		case !errors.Is(err, pg.ErrNotFound):
			return "", nil, nil, false, err
		}
	}
	hdr = withoutHeaders(hdr, func(key string) bool {
		return strings.HasPrefix(key, "Nats-Schedule") || strings.HasPrefix(key, "Nats-Expected-") ||
			key == server.JSMsgId || key == server.JSMessageTTL || key == server.JSMsgRollup
	})
	nextValue := server.JSScheduleNextPurge
	if repeat {
		nextValue = next.Format(time.RFC3339Nano)
	}
	kv := []string{server.JSScheduler, m.Subject, server.JSScheduleNext, nextValue}
	if ttl != "" {
		kv = append(kv, server.JSMessageTTL, ttl)
	}
	if rollup != "" {
		kv = append(kv, server.JSMsgRollup, rollup)
	}
	return target, jswire.AppendHeaders(hdr, kv...), data, true, nil
}
