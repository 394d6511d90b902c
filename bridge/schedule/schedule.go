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
	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/internal/clock"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/internal/permit"
	"github.com/jetgres/jetgres/internal/startstop"
	"github.com/jetgres/jetgres/internal/warnlog"
	"github.com/jetgres/jetgres/pg"
)

// PeriodDefault is how often the scheduler looks for schedules due: nats-server's
// scheduler never fires sooner than 250 ms after its last run either.
const PeriodDefault = 250 * time.Millisecond

// scanBatch bounds the sequences one read of a stream looks through.
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
	// ReadHeaders reads messages without their data: the scan decides from subjects and
	// headers alone, and only a schedule that fires needs its data.
	ReadHeaders(ctx context.Context, p pg.ReadParams) ([]pg.Message, uint64, error)
	GetMessage(ctx context.Context, streamID int64, seq uint64) (*pg.Message, error)
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
	// Release gives the role up for a stream this process no longer serves: deleted, its
	// lock would stay taken until the session ends.
	Release(ctx context.Context, streamID int64) error
	// Append stores m, a produced message (stream.Produced), in s in one transaction of its
	// own as the stream stores a publish, and announces it: the outcome is m's, and err and
	// rtt the transaction's, for the append lane's limiter.
	Append(ctx context.Context, s S, m pg.AppendMsg) (o pg.Outcome, rtt time.Duration, err error)
}

// Config configures a Scheduler. Store, Host, Append and Clock are required.
type Config[S Stream] struct {
	Store Store
	Host  Host[S]
	// Append is the lane whose permits the appends of produced messages take, as the
	// flushes of publishes do: they load the same database.
	Append *flow.Lane
	Clock  clock.Clock
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
}

// entry is one schedule: the message that holds it and when it fires next.
type entry struct {
	seq uint64
	due time.Time
}

// New builds a Scheduler; Start runs it.
func New[S Stream](cfg Config[S]) (*Scheduler[S], error) {
	if cfg.Store == nil || cfg.Host == nil || cfg.Append == nil || cfg.Clock == nil {
		return nil, errors.New("schedule: Config.Store, Host, Append and Clock are required")
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
// in one statement), and fires what is due. It gives up the locks of the streams that are
// gone.
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
		if seen[id] {
			continue
		}
		if err := sc.cfg.Host.Release(ctx, id); err != nil && ctx.Err() == nil {
			// Its session is broken, and the lock went with it.
			sc.warn.Warn(sc.cfg.Logger, sc.cfg.Clock.Now(), "giving up the scheduler lock of a deleted stream failed", "stream", id, "err", err)
		}
		delete(sc.streams, id)
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
	}
}

// scan reads what s committed since the last pass, through its high-water mark hw.
func (sc *Scheduler[S]) scan(ctx context.Context, s S, st *streamState, hw uint64) error {
	for st.scanned < hw {
		msgs, through, err := sc.cfg.Store.ReadHeaders(ctx, pg.ReadParams{StreamID: s.ID(), From: st.scanned + 1, UpTo: hw, MaxMsgs: scanBatch})
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
		// The message's append purged the schedule (stream.Produced, and a client's purge).
		if e != nil && e.seq < m.Seq {
			delete(st.sched, scheduler)
			sc.m.purged.Inc()
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
		m, err := sc.cfg.Store.GetMessage(ctx, s.ID(), e.seq)
		if errors.Is(err, pg.ErrNotFound) {
			// Deleted or purged since it was read.
			delete(st.sched, subj)
			continue
		}
		if err != nil {
			sc.failed(ctx, s, subj, err)
			return
		}
		target, hdr, data, ok, err := sc.produce(ctx, s, m, e.due, now)
		if err != nil {
			sc.failed(ctx, s, subj, err)
			return
		}
		if !ok {
			delete(st.sched, subj)
			continue
		}
		o, err := sc.append(ctx, s, stream.Produced(s.ConfigView(), subj, e.seq, target, hdr, data))
		if err != nil {
			sc.failed(ctx, s, subj, err)
			return
		}
		var gone *pg.ExpectError
		if errors.As(o.Err, &gone) {
			// Its schedule is no longer the last message of its subject: replaced, ended or
			// purged since it was read, or fired by a replica that held the stream before.
			delete(st.sched, subj)
			continue
		}
		if o.Err != nil {
			sc.failed(ctx, s, subj, o.Err)
			return
		}
		sc.m.fired.Inc()
		// Taken in at once, as the scan will take it again: a produced message that limits
		// remove before the scan reads it must not leave its schedule due.
		sc.apply(st, &pg.Message{Seq: o.Seq, Subject: target, Header: hdr}, 0)
	}
}

// append stores a produced message under a permit of the append lane.
func (sc *Scheduler[S]) append(ctx context.Context, s S, m pg.AppendMsg) (pg.Outcome, error) {
	p, err := sc.cfg.Append.Acquire(ctx)
	if err != nil {
		return pg.Outcome{}, err
	}
	o, rtt, err := sc.cfg.Host.Append(ctx, s, m)
	permit.Return(p, rtt, err)
	return o, err
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
