package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/internal/warnlog"
	"github.com/jetgres/jetgres/pg"
)

const (
	// maintainPeriod is how often the maintainer expires messages past max_age, drops chunk
	// tables the first sequence has passed, and re-reads the ack floors of interest and
	// workqueue streams. JetStream expires on a timer of about the same grain.
	maintainPeriod = time.Second
	// pruneIDsPeriod is the longest a stream goes between looks at its de-duplication id
	// buckets, to drop those past the window; a stream whose window is shorter is looked at once a
	// window (but not more often than maintainPeriod), so that it keeps the ids of about three
	// windows. A late prune costs nothing but space: expired ids no longer match.
	pruneIDsPeriod = time.Minute
	// chunkIdleRetire is how long an emptied stream must go without appends before its last
	// chunk is retired so that it can be dropped too.
	chunkIdleRetire = 2 * time.Second
	// retainRetry is how soon a pass looks again at acks the consumer had not yet applied.
	retainRetry = 20 * time.Millisecond
	// reapPeriod is how often the maintainer looks for chunk tables no stream lists: a
	// deleted stream's tables go at its deletion, and only those a long transaction kept
	// are left for this look, which reads the catalog of every chunk table.
	reapPeriod = time.Minute
)

// maintainer is the bridge's background retention work: interest and workqueue retention
// passes, max_age, chunk drops and de-duplication id pruning. It runs on one goroutine and
// through db.Background, so it never takes a flow-limiter permit, and every transaction it
// opens is short.
type maintainer struct {
	b    *Bridge
	kick chan struct{}

	pruned map[*stream.Stream]time.Time // when each stream's ids were last pruned
	reaped time.Time                    // when orphaned chunk tables were last looked for
	// warn thins the jobs' failure warnings: while the database is away every job fails for
	// every stream on every pass.
	warn warnlog.Throttle
}

func (b *Bridge) maint() *maintainer { return b.maintainer.Load() }

// startRetention starts the maintainer. From then on the consumers' ack handler also hands
// it every ack, for the next retention pass; before, retention still follows the consumers'
// ack floors, and only acks above a floor wait for it.
func (b *Bridge) startRetention() {
	m := &maintainer{b: b, kick: make(chan struct{}, 1), pruned: make(map[*stream.Stream]time.Time)}
	if err := b.streams.RefreshUsage(b.ctx); err != nil {
		b.log.Warn("reading what the streams hold failed; the storage bounds apply from the next pass", "err", err)
	}
	b.maintainer.Store(m)
	b.bg.Go(m.run)
}

// stopRetention forgets the maintainer, for Stop once the background work it runs in has
// stopped.
func (b *Bridge) stopRetention() { b.maintainer.Store(nil) }

// retOf is the stream's retention state, made on first use and kept until the stream goes.
func (b *Bridge) retOf(s *stream.Stream) *retentionState {
	v, _ := b.rets.LoadOrStore(s, new(retentionState))
	return v.(*retentionState)
}

// retentionState is a stream's interest and workqueue retention state.
type retentionState struct {
	mu    sync.Mutex
	acked map[string][]uint64 // acks seen on the link, by consumer, not yet settled
	// dirty says a pass is due: acks were seen, or consumers came, went or changed, since the
	// last one began; waiting, that the last pass left acks for their consumer to apply.
	dirty   bool
	waiting bool
	remote  [][]string // filters of the consumers other replicas serve, as of the last pass

	run     sync.Mutex        // serialises passes
	applied map[string]uint64 // the floors the last pass applied, by consumer
	sig     string            // the consumers and filters the last pass saw
}

// noteAck runs on the link's read loop, from the consumers' ack handler, for every ack
// whether or not this process serves the consumer: it notes which messages were
// acknowledged, for the next retention pass. The consumer decides whether the ack counts;
// the pass asks it.
func (m *maintainer) noteAck(s *stream.Stream, consumer string, sseq uint64, body []byte) {
	if !jswire.AckSettles(body) || s.ConfigView().Retention == server.LimitsPolicy {
		return
	}
	rs := m.b.retOf(s)
	rs.mu.Lock()
	if rs.acked == nil {
		rs.acked = make(map[string][]uint64)
	}
	rs.acked[consumer] = append(rs.acked[consumer], sseq)
	rs.dirty = true
	rs.mu.Unlock()
	m.wake()
}

func (m *maintainer) wake() { poke(m.kick) }

func (m *maintainer) run() {
	ctx := m.b.ctx
	clock := m.b.clock
	tick := clock.NewTicker(maintainPeriod)
	defer tick.Stop()
	retry := clock.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.kick:
			if m.retainAll(ctx, true) {
				retry.Reset(retainRetry)
			}
		case <-retry.C():
			if m.retainAll(ctx, false) {
				retry.Reset(retainRetry)
			}
		case <-tick.C():
			if err := m.b.streams.RefreshUsage(ctx); err != nil && ctx.Err() == nil {
				m.warn.Warn(m.b.log, m.b.clock.Now(), "reading what the streams hold failed", "err", err)
			}
			m.retainAll(ctx, false)
			m.expire(ctx)
			m.dropChunks(ctx)
			m.pruneIDs(ctx)
		}
	}
}

// retainAll runs a retention pass on every interest and workqueue stream (only those with
// acks seen since the last pass when dirtyOnly). It reports whether acks were left for the
// consumer to apply.
func (m *maintainer) retainAll(ctx context.Context, dirtyOnly bool) (again bool) {
	for _, s := range m.b.streams.List() {
		if s.Config().Retention == server.LimitsPolicy {
			continue
		}
		if dirtyOnly {
			m.b.retOf(s).mu.Lock()
			dirty := m.b.retOf(s).dirty
			m.b.retOf(s).mu.Unlock()
			if !dirty {
				continue
			}
		}
		waiting, err := m.b.retain(ctx, s)
		if err != nil && !errors.Is(err, pg.ErrNotFound) && ctx.Err() == nil {
			m.warn.Warn(m.b.log, m.b.clock.Now(), "retention pass failed", "stream", s.Name(), "err", err)
		}
		again = again || waiting
	}
	return again
}

// consumerDeleted marks an interest stream that lost its last consumer as JetStream does,
// which purges it then: one that never held a message reports first_seq 1 from there on.
func (b *Bridge) consumerDeleted(ctx context.Context, s *stream.Stream) {
	b.retentionStale(s)
	if s.Config().Retention != server.InterestPolicy {
		return
	}
	if err := b.db.InterestGone(ctx, s.ID()); err != nil && ctx.Err() == nil {
		b.log.Warn("marking an interest stream without consumers failed", "stream", s.Name(), "err", err)
	}
}

// settleRetention runs a retention pass on s now if one is due, so that what a client reads
// next reflects every ack the consumers have applied. A stream with nothing due costs
// nothing: a stream info on a quiet interest or work-queue stream reads no consumer.
func (b *Bridge) settleRetention(ctx context.Context, s *stream.Stream) error {
	if s.Config().Retention == server.LimitsPolicy || b.maint() == nil {
		return nil
	}
	// A pass in flight may have taken the acks before their messages are gone: wait it out.
	b.retOf(s).run.Lock()
	b.retOf(s).mu.Lock()
	due := b.retOf(s).dirty || b.retOf(s).waiting
	b.retOf(s).mu.Unlock()
	b.retOf(s).run.Unlock()
	if !due {
		return nil
	}
	_, err := b.retain(ctx, s)
	return err
}

// retentionStale makes a retention pass over s due soon: its consumers came, went or
// changed what they want.
func (b *Bridge) retentionStale(s *stream.Stream) {
	if s.Config().Retention == server.LimitsPolicy {
		return
	}
	b.retOf(s).mu.Lock()
	b.retOf(s).dirty = true
	b.retOf(s).mu.Unlock()
	if m := b.maint(); m != nil {
		m.wake()
	}
}

// retain is one retention pass over s: it gathers each consumer's ack floor and the acks it
// applied above it (from the consumer itself when this process serves it, from PostgreSQL
// otherwise) and removes what no consumer needs any more. It reports whether acks seen on
// the link were not yet applied by their consumer.
func (b *Bridge) retain(ctx context.Context, s *stream.Stream) (waiting bool, err error) {
	cfg := s.Config()
	rs := b.retOf(s)
	rs.run.Lock()
	defer rs.run.Unlock()
	b.am.retentionPasses.Inc()
	rows, err := b.db.Consumers(ctx, s.ID())
	if err != nil {
		return false, err
	}
	rs.mu.Lock()
	seen := make(map[string][]uint64, len(rs.acked))
	for name, seqs := range rs.acked {
		seen[name] = slices.Clone(seqs)
	}
	rs.dirty = false
	rs.mu.Unlock()

	p := pg.RetainParams{StreamID: s.ID(), WorkQueue: cfg.Retention == server.WorkQueuePolicy}
	floors := make(map[string]uint64, len(rows))
	// open says which acks seen on the link may still matter after this pass: those the
	// consumer has yet to apply, and those it applied that some other consumer still needs.
	open := make(map[string]func(seq uint64) bool, len(rows))
	var remote [][]string
	var sig strings.Builder
	fmt.Fprintf(&sig, "%s;", cfg.Retention)
	for _, row := range rows {
		var cc server.ConsumerConfig
		if err := json.Unmarshal(row.Config, &cc); err != nil {
			return false, fmt.Errorf("consumer %q: stored config does not decode: %w", row.Name, err)
		}
		rc := pg.RetainConsumer{Floor: row.AckStreamSeq, Filters: jswire.ConsumerFilters(&cc)}
		fmt.Fprintf(&sig, "%s/%d/%s;", row.Name, row.Created.UnixNano(), strings.Join(rc.Filters, ","))
		c := b.servedConsumer(s, row)
		if c == nil {
			remote = append(remote, rc.Filters)
			p.Consumers = append(p.Consumers, rc)
			floors[row.Name] = rc.Floor
			continue
		}
		floor, next, pending := c.retentionView()
		rc.Floor = max(rc.Floor, floor)
		for _, seq := range seen[row.Name] {
			_, held := slices.BinarySearch(pending, seq)
			switch {
			case seq <= rc.Floor || seq >= next:
			case held:
				waiting = true
			default:
				rc.Acked = append(rc.Acked, seq)
			}
		}
		slices.Sort(rc.Acked)
		rc.Acked = slices.Compact(rc.Acked)
		open[row.Name] = func(seq uint64) bool { return seq > rc.Floor && seq < next }
		floors[row.Name] = rc.Floor
		p.Consumers = append(p.Consumers, rc)
	}
	if sig.String() != rs.sig {
		// Consumers came, went or changed filters (or this is the first pass): any message
		// may have lost the last consumer that needed it.
		p.Recheck = []pg.SeqRange{{From: 0, To: math.MaxInt64}}
	} else {
		for name, f := range floors {
			if old, ok := rs.applied[name]; ok && f > old {
				p.Recheck = append(p.Recheck, pg.SeqRange{From: old + 1, To: f})
			}
		}
	}
	rs.mu.Lock()
	rs.remote = remote
	rs.mu.Unlock()

	act := len(p.Recheck) > 0
	for _, c := range p.Consumers {
		act = act || len(c.Acked) > 0
	}
	var gone map[uint64]bool
	if act {
		res, err := b.db.Retain(ctx, p)
		if err != nil {
			return waiting, err
		}
		gone = make(map[uint64]bool, len(res.Gone))
		for _, seq := range res.Gone {
			gone[seq] = true
		}
		switch {
		case res.Tombstoned > 0:
			// A work queue's consumers never share a message, so none can want one that
			// retention tombstoned; under interest a consumer created since might.
			s.Purge(ctx, stream.Purged{First: res.FirstSeq, Consumed: p.WorkQueue})
		case res.Removed > 0:
			s.Remove(stream.Removed{First: res.FirstSeq})
		}
	}
	rs.applied, rs.sig = floors, sig.String()

	rs.mu.Lock()
	rs.waiting = waiting
	for name, seqs := range rs.acked {
		keep := open[name]
		if keep == nil {
			delete(rs.acked, name)
			continue
		}
		if seqs = slices.DeleteFunc(seqs, func(seq uint64) bool { return !keep(seq) || gone[seq] }); len(seqs) > 0 {
			rs.acked[name] = seqs
		} else {
			delete(rs.acked, name)
		}
	}
	rs.mu.Unlock()
	return waiting, nil
}

// retentionChanged makes the next pass over s look at every message again: under the
// policy it had, messages were kept for reasons the new one does not know.
func (b *Bridge) retentionChanged(s *stream.Stream) {
	b.retOf(s).run.Lock()
	b.retOf(s).sig = ""
	b.retOf(s).run.Unlock()
}

// servedConsumer is the consumer a stored row describes, if this process serves it.
func (b *Bridge) servedConsumer(s *stream.Stream, row pg.Consumer) *consumer {
	cs := b.cs()
	if cs == nil {
		return nil
	}
	c := cs.find(s.Name(), row.Name)
	if c == nil || c.sc.s != s || !c.created.Equal(row.Created) {
		return nil
	}
	return c
}

// retentionView is what retention needs of a consumer's state: its ack floor, the next
// sequence it would consider, and the deliveries still waiting for an ack.
func (c *consumer) retentionView() (floor, next uint64, pending []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st.AckFloor().Stream, c.st.Next(), c.st.PendingSeqs()
}

// noInterest reports, for an interest stream, which of the given subjects no consumer's
// filter matches: JetStream gives such a publish a sequence and stores nothing. Consumers
// this process serves are known at once; those other replicas serve, as of the last
// retention pass.
func (b *Bridge) noInterest(s *stream.Stream, subjects []string) []bool {
	var local []*consumer
	if sc := b.consumersOf(s); sc != nil {
		local = sc.list()
	}
	b.retOf(s).mu.Lock()
	remote := b.retOf(s).remote
	b.retOf(s).mu.Unlock()
	out := make([]bool, len(subjects))
	for i, subj := range subjects {
		wanted := false
		for _, c := range local {
			if wanted = c.matchFilters(subj); wanted {
				break
			}
		}
		for _, f := range remote {
			if wanted = wanted || jswire.FiltersMatch(f, subj); wanted {
				break
			}
		}
		out[i] = !wanted
	}
	return out
}

// expire applies max_age.
func (m *maintainer) expire(ctx context.Context) {
	now := m.b.clock.Now()
	for _, s := range m.b.streams.List() {
		cfg := s.Config()
		if cfg.MaxAge <= 0 {
			continue
		}
		n, err := m.b.db.ExpireOlder(ctx, s.ID(), now.Add(-cfg.MaxAge).UnixNano())
		switch {
		case err != nil && !errors.Is(err, pg.ErrNotFound) && ctx.Err() == nil:
			m.warn.Warn(m.b.log, m.b.clock.Now(), "expiring messages failed", "stream", s.Name(), "err", err)
		case n > 0:
			s.Purge(ctx, stream.Purged{})
		}
	}
}

// dropChunks gives back the space of chunks that no stream can read any more, and, once a
// reapPeriod, of chunk tables that no stream lists.
func (m *maintainer) dropChunks(ctx context.Context) {
	ids, err := m.b.db.ChunkDropCandidates(ctx, chunkIdleRetire)
	if err != nil && ctx.Err() == nil {
		m.warn.Warn(m.b.log, m.b.clock.Now(), "finding chunks to drop failed", "err", err)
	}
	for _, id := range ids {
		if _, err := m.b.db.DropChunks(ctx, id, chunkIdleRetire); err != nil && !errors.Is(err, pg.ErrNotFound) && ctx.Err() == nil {
			m.warn.Warn(m.b.log, m.b.clock.Now(), "dropping chunks failed", "stream_id", id, "err", err)
		}
	}
	if now := m.b.clock.Now(); now.Sub(m.reaped) >= reapPeriod {
		m.reaped = now
		if _, err := m.b.db.ReapChunks(ctx); err != nil && ctx.Err() == nil {
			m.warn.Warn(m.b.log, now, "dropping the chunk tables no stream lists failed", "err", err)
		}
	}
}

// pruneIDs forgets de-duplication ids that their window has passed, in each stream that
// has gone a window (at most pruneIDsPeriod) without a prune. A stream seen for the first
// time waits a period too.
//
// A flush looks ids up as of the time it started, which may be well before it gets to the
// stream's row (a slow connection, a busy database): the window is measured back from the
// start of the stream's flush in flight, if that is older than now. A flush that starts
// after now was read measures from later still.
func (m *maintainer) pruneIDs(ctx context.Context) {
	now := m.b.clock.Now()
	streams := m.b.streams.List()
	pruned := make(map[*stream.Stream]time.Time, len(streams))
	for _, s := range streams {
		cfg := s.Config()
		last, ok := m.pruned[s]
		if !ok || now.Sub(last) < min(max(cfg.Duplicates, maintainPeriod), pruneIDsPeriod) {
			if !ok {
				last = now
			}
			pruned[s] = last
			continue
		}
		pruned[s] = now
		from := now.UnixNano()
		if f := s.FlushSince(); f != 0 {
			from = min(from, f)
		}
		if _, err := m.b.db.PruneMsgIDs(ctx, s.ID(), from-cfg.Duplicates.Nanoseconds()); err != nil && ctx.Err() == nil {
			m.warn.Warn(m.b.log, m.b.clock.Now(), "pruning message ids failed", "stream", s.Name(), "err", err)
		}
	}
	m.pruned = pruned
}

// applyLimits applies a stream's limits to what it already holds, as JetStream does when
// an update lowers them.
func (b *Bridge) applyLimits(ctx context.Context, s *stream.Stream, cfg *server.StreamConfig) error {
	n, err := b.db.EnforceLimits(ctx, s.ID(), stream.Limits(cfg))
	if err != nil {
		return err
	}
	if cfg.MaxAge > 0 {
		expired, err := b.db.ExpireOlder(ctx, s.ID(), b.clock.Now().Add(-cfg.MaxAge).UnixNano())
		if err != nil {
			return err
		}
		n += expired
	}
	if n > 0 {
		s.Purge(ctx, stream.Purged{})
	}
	return nil
}

// workQueueConflict is nats-server's check that a consumer on a workqueue stream does not
// share messages with another: no second unfiltered consumer, and no filter that collides
// with another consumer's. An existing consumer being updated is only checked for
// collisions, as nats-server does.
func (b *Bridge) workQueueConflict(ctx context.Context, s *stream.Stream, name string, cfg *server.ConsumerConfig) *server.ApiError {
	if s.Config().Retention != server.WorkQueuePolicy {
		return nil
	}
	rows, err := b.db.Consumers(ctx, s.ID())
	if err != nil {
		b.log.Error("listing consumers", "stream", s.Name(), "err", err)
		return apiError(err, server.NewJSConsumerCreateError)
	}
	filters := jswire.ConsumerFilters(cfg)
	exists := false
	var others [][]string
	for _, row := range rows {
		if row.Name == name {
			exists = true
			continue
		}
		var oc server.ConsumerConfig
		if err := json.Unmarshal(row.Config, &oc); err != nil {
			return server.NewJSConsumerCreateError(fmt.Errorf("consumer %q: stored config does not decode", row.Name))
		}
		others = append(others, jswire.ConsumerFilters(&oc))
	}
	if len(others) == 0 {
		return nil
	}
	if len(filters) == 0 && !exists {
		return server.NewJSConsumerWQMultipleUnfilteredError()
	}
	for _, f := range filters {
		for _, of := range others {
			if len(of) == 0 {
				return server.NewJSConsumerWQConsumerNotUniqueError()
			}
			for _, g := range of {
				if server.SubjectsCollide(f, g) {
					return server.NewJSConsumerWQConsumerNotUniqueError()
				}
			}
		}
	}
	return nil
}
