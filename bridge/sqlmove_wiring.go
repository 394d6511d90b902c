package bridge

import (
	"context"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/sqlmove"
	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/pg"
)

// sqlHost is what the SQL mover (bridge/sqlmove) asks of the bridge: the streams, and the
// publish path's checks, batches, commit announcements and permit accounting, so that a
// message moved from SQL is handled as a NATS publish is.
type sqlHost struct{ b *Bridge }

var _ sqlmove.Host[*stream] = sqlHost{}

// newSQLMover builds the bridge's SQL mover: its moves take push permits and at most
// FlushMaxMsgs messages, as flushes do, and it looks on the consumers' tick period.
func newSQLMover(b *Bridge) (*sqlmove.Mover[*stream], error) {
	return sqlmove.New(sqlmove.Config[*stream]{
		Store:      b.db,
		Push:       b.cfg.Push,
		Host:       sqlHost{b},
		Logger:     b.log,
		Clock:      b.clock,
		Registerer: b.cfg.Registerer,
		TickPeriod: b.cfg.TickPeriod,
		IdleMax:    TickIdleMaxDefault,
		MaxMsgs:    b.cfg.FlushMaxMsgs,
	})
}

func (h sqlHost) Streams() []*stream { return h.b.streamList() }

func (h sqlHost) Sync(ctx context.Context) error { return h.b.syncStreams(ctx) }

func (sqlHost) Batch(s *stream) pg.AppendBatch {
	cfg := s.cfgView()
	return pg.AppendBatch{StreamID: s.id, DupWindow: cfg.Duplicates, ChunkRows: s.chunkRows.Load(),
		Limits: streamLimits(cfg)}
}

func (sqlHost) Expectations(cfg *server.StreamConfig, hdr []byte, m *pg.AppendMsg) *server.ApiError {
	return parseExpectations(cfg, hdr, m)
}

func (h sqlHost) NoInterest(s *stream, subjects []string) []bool { return h.b.noInterest(s, subjects) }

func (sqlHost) Commit(ctx context.Context, s *stream, r pg.AppendResult) { s.commit(ctx, r) }

func (sqlHost) GiveBack(p *flow.Permit, rtt time.Duration, err error) { giveBack(p, rtt, err) }
