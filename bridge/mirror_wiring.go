package bridge

import (
	"context"

	"github.com/jetgres/jetgres/bridge/mirror"
	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/pg"
)

// copyHost is what the copying engine (bridge/mirror) asks of the bridge: the streams, and
// their announcements of what it stored.
type copyHost struct{ b *Bridge }

var _ mirror.Host = copyHost{}

// newCopies builds the engine that copies into streams with a mirror or sources, talking
// through Config.CopyLink; nil without one.
func newCopies(b *Bridge) (*mirror.Engine, error) {
	if b.cfg.CopyLink == nil {
		return nil, nil
	}
	return mirror.New(mirror.Config{
		Store: b.db, Link: b.cfg.CopyLink, Host: copyHost{b}, Clock: b.clock, Logger: b.log,
		Lease: b.cfg.Lease, Domain: b.cfg.Domain,
	})
}

func (h copyHost) Streams() []*stream.Stream { return h.b.streams.List() }

// Copied announces a mirror's batch as a commit: the consumers keep what they read ahead
// and are woken as for a publish, the tail and the get index take the messages. Then it
// applies the stream's limits to it: a restore's path stores without them.
func (h copyHost) Copied(ctx context.Context, s *stream.Stream, r pg.RestoreResult, msgs []pg.Message) {
	h.b.streams.Copied(s, r.Prev, r.First, r.Last, msgs)
	h.applyLimits(ctx, s)
}

// Restored announces what a mirror stored that the stream's readers could not follow, as a
// restore from a backup, and applies the stream's limits to it.
func (h copyHost) Restored(ctx context.Context, s *stream.Stream, first, last uint64) {
	h.b.streams.Restored(ctx, s, first, last)
	h.applyLimits(ctx, s)
}

// applyLimits applies the stream's limits to what a mirror stored. Under max_msgs and
// max_bytes alone they take the oldest messages, and are announced as a publish's limits
// are: a purge only when the tail holds some of them, so that a mirror kept at its limit
// does not send its consumers back to PostgreSQL and to a recount on every batch.
// Per-subject limits and message TTLs take messages anywhere, and retention announces them
// as a purge.
func (h copyHost) applyLimits(ctx context.Context, s *stream.Stream) {
	cfg := s.ConfigView()
	if cfg.MaxMsgs <= 0 && cfg.MaxBytes <= 0 && cfg.MaxMsgsPer <= 0 {
		return
	}
	if cfg.MaxMsgsPer > 0 || cfg.AllowMsgTTL {
		if err := h.b.retention.ApplyLimits(ctx, s, stream.Limits(cfg), 0); err != nil && ctx.Err() == nil {
			h.b.log.Warn("applying the limits of a mirror failed", "stream", s.Name(), "err", err)
		}
		return
	}
	n, err := h.b.db.EnforceLimits(ctx, s.ID(), stream.Limits(cfg))
	if err == nil && n == 0 {
		return
	}
	var st pg.StreamState
	if err == nil {
		st, err = h.b.db.State(ctx, s.ID())
	}
	if err != nil {
		if ctx.Err() == nil {
			h.b.log.Warn("applying the limits of a mirror failed", "stream", s.Name(), "err", err)
		}
		// Messages may have gone that nobody was told of.
		s.Purge(ctx, stream.Purged{})
		return
	}
	s.Trimmed(ctx, st.FirstSeq)
}

func (copyHost) Batch(s *stream.Stream) pg.AppendBatch {
	cfg := s.ConfigView()
	return pg.AppendBatch{StreamID: s.ID(), DupWindow: cfg.Duplicates, ChunkRows: s.ChunkRows(), Limits: stream.Limits(cfg)}
}

func (copyHost) Commit(ctx context.Context, s *stream.Stream, r pg.AppendResult) { s.Commit(ctx, r) }
