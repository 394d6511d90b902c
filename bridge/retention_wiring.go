package bridge

import (
	"context"
	"time"

	"github.com/jetgres/jetgres/bridge/retention"
	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg"
)

// retentionHost is what the retention engine (bridge/retention) asks of the bridge: the
// streams, the consumers this process serves, and the streams' events for what it removed.
type retentionHost struct{ b *Bridge }

var _ retention.Host[*stream.Stream] = retentionHost{}

// newRetention builds the bridge's retention engine.
func newRetention(b *Bridge) (*retention.Enforcer[*stream.Stream], error) {
	return retention.New(retention.Config[*stream.Stream]{
		Store:      b.db,
		Host:       retentionHost{b},
		Logger:     b.log,
		Clock:      b.clock,
		Registerer: b.cfg.Registerer,
	})
}

func (h retentionHost) Streams() []*stream.Stream { return h.b.streams.List() }

// Served is the progress of the consumer a stored row describes when this process serves
// it: on the same stream and of the same creation, not a consumer deleted and made again.
func (h retentionHost) Served(s *stream.Stream, row pg.Consumer) (retention.ConsumerProgress, bool) {
	return h.b.cons.Progress(s, row)
}

func (h retentionHost) LocalFilters(s *stream.Stream) [][]string { return h.b.cons.Filters(s) }

func (retentionHost) Purged(ctx context.Context, s *stream.Stream, first uint64, consumed bool) {
	s.Purge(ctx, stream.Purged{First: first, Consumed: consumed})
}

func (retentionHost) Removed(s *stream.Stream, first uint64) {
	s.Remove(stream.Removed{First: first})
}

func (h retentionHost) RefreshUsage(ctx context.Context) error { return h.b.streams.RefreshUsage(ctx) }

// Mark stores the subject delete markers of a retention pass as nats-server stores them:
// through the stream's append with a subject roll-up, which takes the expired message, and
// with the expected last subject sequence that message's, so that a marker never rolls up
// a message published since. A publish that won that race leaves the expired message to
// the next pass, which finds it no longer last and just removes it.
func (h retentionHost) Mark(ctx context.Context, s *stream.Stream, last []pg.Message, ttl time.Duration) (int, error) {
	cfg := s.ConfigView()
	hdr := jswire.DeleteMarkerHeader(ttl)
	bt := pg.AppendBatch{StreamID: s.ID(), ChunkRows: s.ChunkRows(), Limits: stream.Limits(cfg)}
	for _, m := range last {
		bt.Msgs = append(bt.Msgs, pg.AppendMsg{Subject: m.Subject, Header: hdr, Rollup: pg.RollupSubject,
			TTL: int64(ttl.Seconds()), ExpectLastSubjSeq: &m.Seq})
	}
	res, _, err := h.b.db.Append(ctx, []pg.AppendBatch{bt}, h.b.clock.Now().UnixNano())
	stored := 0
	for _, r := range res {
		if r.Gone {
			continue
		}
		s.Commit(ctx, r)
		for _, o := range r.Outcomes {
			if o.Err == nil {
				stored++
			}
		}
	}
	return stored, err
}
