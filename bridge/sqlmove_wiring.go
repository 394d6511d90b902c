package bridge

import (
	"context"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/sqlmove"
	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/pg"
)

// sqlHost is what the SQL mover (bridge/sqlmove) asks of the bridge: the streams, and the
// publish path's checks, batches and commit announcements, so that a
// message moved from SQL is handled as a NATS publish is.
type sqlHost struct{ b *Bridge }

var _ sqlmove.AppendPath[*stream.Stream] = sqlHost{}

// newSQLMover builds the bridge's SQL mover: its moves take append permits and at most
// FlushMaxMsgs messages, as flushes do, and it looks on the consumers' tick period.
func newSQLMover(b *Bridge) (*sqlmove.Mover[*stream.Stream], error) {
	return sqlmove.New(sqlmove.Config[*stream.Stream]{
		Store:      b.db,
		Append:     b.cfg.Append,
		Host:       sqlHost{b},
		Logger:     b.log,
		Clock:      b.clock,
		Registerer: b.cfg.Registerer,
		TickPeriod: b.cfg.TickPeriod,
		IdleMax:    TickIdleMaxDefault,
		MaxMsgs:    b.cfg.FlushMaxMsgs,
	})
}

func (h sqlHost) Streams() []*stream.Stream { return h.b.streams.List() }

func (h sqlHost) Sync(ctx context.Context) error { return h.b.streams.Sync(ctx) }

func (sqlHost) Batch(s *stream.Stream) pg.AppendBatch {
	cfg := s.ConfigView()
	return pg.AppendBatch{StreamID: s.ID(), DupWindow: cfg.Duplicates, ChunkRows: s.ChunkRows(), Limits: stream.Limits(cfg)}
}

func (sqlHost) Expectations(cfg *server.StreamConfig, hdr []byte, m *pg.AppendMsg) *server.ApiError {
	return stream.ParseExpectations(cfg, hdr, m)
}

func (h sqlHost) NoInterest(s *stream.Stream, subjects []string) []bool {
	return h.b.retention.NoInterest(s, subjects)
}

func (sqlHost) Commit(ctx context.Context, s *stream.Stream, r pg.AppendResult) { s.Commit(ctx, r) }

func (sqlHost) Forget(ctx context.Context, s *stream.Stream) { s.Purge(ctx, stream.Purged{}) }
