package bridge

import (
	"context"

	"github.com/jetgres/jetgres/bridge/retention"
	"github.com/jetgres/jetgres/bridge/stream"
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
