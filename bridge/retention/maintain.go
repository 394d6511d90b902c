package retention

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats-server/v2/server"

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

// maintain is the maintainer's goroutine, until ctx ends; see the package doc.
func (e *Enforcer[S]) maintain(ctx context.Context) {
	tick := e.clock.NewTicker(maintainPeriod)
	defer tick.Stop()
	retry := e.clock.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.kick:
			if e.retainAll(ctx, true) {
				retry.Reset(retainRetry)
			}
		case <-retry.C():
			if e.retainAll(ctx, false) {
				retry.Reset(retainRetry)
			}
		case <-tick.C():
			if err := e.host.RefreshUsage(ctx); err != nil && ctx.Err() == nil {
				e.warn.Warn(e.log, e.clock.Now(), "reading what the streams hold failed", "err", err)
			}
			e.retainAll(ctx, false)
			e.expire(ctx)
			e.closeChunks(ctx)
			e.dropChunks(ctx)
			e.pruneIDs(ctx)
			e.forget()
		}
	}
}

// retainAll runs a retention pass on every interest and workqueue stream (only those with
// acks seen since the last pass when dirtyOnly). It reports whether acks were left for the
// consumer to apply.
func (e *Enforcer[S]) retainAll(ctx context.Context, dirtyOnly bool) (again bool) {
	for _, s := range e.host.Streams() {
		if s.ConfigView().Retention == server.LimitsPolicy {
			continue
		}
		if dirtyOnly {
			st := e.state(s)
			st.mu.Lock()
			dirty := st.dirty
			st.mu.Unlock()
			if !dirty {
				continue
			}
		}
		waiting, err := e.retain(ctx, s)
		if err != nil && !errors.Is(err, pg.ErrNotFound) && ctx.Err() == nil {
			e.warn.Warn(e.log, e.clock.Now(), "retention pass failed", "stream", s.Name(), "err", err)
		}
		again = again || waiting
	}
	return again
}

// expire applies max_age, and the message TTLs of the streams that allow them.
func (e *Enforcer[S]) expire(ctx context.Context) {
	now := e.clock.Now()
	for _, s := range e.host.Streams() {
		cfg := s.ConfigView()
		if cfg.AllowMsgTTL {
			if err := e.expireTTL(ctx, s, cfg, now); err != nil && !errors.Is(err, pg.ErrNotFound) && ctx.Err() == nil {
				e.warn.Warn(e.log, e.clock.Now(), "expiring messages failed", "stream", s.Name(), "err", err)
			}
			continue
		}
		if cfg.MaxAge <= 0 {
			continue
		}
		n, err := e.store.ExpireOlder(ctx, s.ID(), now.Add(-cfg.MaxAge).UnixNano())
		switch {
		case err != nil && !errors.Is(err, pg.ErrNotFound) && ctx.Err() == nil:
			e.warn.Warn(e.log, e.clock.Now(), "expiring messages failed", "stream", s.Name(), "err", err)
		case n > 0:
			e.host.Purged(ctx, s, 0, false)
		}
	}
}

// closeChunks closes the chunks of the streams whose limits ask for chunks smaller than
// their appends open, once they hold that many messages and are pg.ChunkCloseAge old, and
// those of streams with a max_age once they hold pg.ChunkRowsMin messages older than a
// quarter of it, so that a slow stream's removed messages go with whole chunks.
func (e *Enforcer[S]) closeChunks(ctx context.Context) {
	now := e.clock.Now()
	var closes []pg.ChunkClose
	for _, s := range e.host.Streams() {
		if rows := s.ChunkCloseRows(); rows > 0 {
			closes = append(closes, pg.ChunkClose{StreamID: s.ID(), Rows: rows, Before: now.Add(-pg.ChunkCloseAge).UnixNano()})
		}
		if age := s.ConfigView().MaxAge; age > 0 {
			closes = append(closes, pg.ChunkClose{StreamID: s.ID(), Rows: pg.ChunkRowsMin, Before: now.Add(-age / 4).UnixNano()})
		}
	}
	if len(closes) == 0 {
		return
	}
	if _, err := e.store.CloseChunks(ctx, closes); err != nil && ctx.Err() == nil {
		e.warn.Warn(e.log, now, "closing chunks failed", "err", err)
	}
}

// dropChunks gives back the space of chunks that no stream can read any more, and, once a
// reapPeriod, of chunk tables that no stream lists.
func (e *Enforcer[S]) dropChunks(ctx context.Context) {
	ids, err := e.store.ChunkDropCandidates(ctx, chunkIdleRetire)
	if err != nil && ctx.Err() == nil {
		e.warn.Warn(e.log, e.clock.Now(), "finding chunks to drop failed", "err", err)
	}
	for _, id := range ids {
		if _, err := e.store.DropChunks(ctx, id, chunkIdleRetire); err != nil && !errors.Is(err, pg.ErrNotFound) && ctx.Err() == nil {
			e.warn.Warn(e.log, e.clock.Now(), "dropping chunks failed", "stream_id", id, "err", err)
		}
	}
	if now := e.clock.Now(); now.Sub(e.reaped) >= reapPeriod {
		e.reaped = now
		if _, err := e.store.ReapChunks(ctx); err != nil && ctx.Err() == nil {
			e.warn.Warn(e.log, now, "dropping the chunk tables no stream lists failed", "err", err)
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
func (e *Enforcer[S]) pruneIDs(ctx context.Context) {
	now := e.clock.Now()
	streams := e.host.Streams()
	pruned := make(map[int64]time.Time, len(streams))
	for _, s := range streams {
		cfg := s.ConfigView()
		last, ok := e.pruned[s.ID()]
		if !ok || now.Sub(last) < min(max(cfg.Duplicates, maintainPeriod), pruneIDsPeriod) {
			if !ok {
				last = now
			}
			pruned[s.ID()] = last
			continue
		}
		pruned[s.ID()] = now
		from := now.UnixNano()
		if f := s.FlushSince(); f != 0 {
			from = min(from, f)
		}
		if _, err := e.store.PruneMsgIDs(ctx, s.ID(), from-cfg.Duplicates.Nanoseconds()); err != nil && ctx.Err() == nil {
			e.warn.Warn(e.log, e.clock.Now(), "pruning message ids failed", "stream", s.Name(), "err", err)
		}
	}
	e.pruned = pruned
}
