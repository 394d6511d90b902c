package bridge

import (
	"context"
	"time"

	"github.com/jetgres/jetgres/bridge/schedule"
	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/pg"
)

// scheduleHost is what the scheduler (bridge/schedule) asks of the bridge: the streams,
// the scheduler locks of the consumers' ownership session, and appends that the streams'
// readers hear of.
type scheduleHost struct{ b *Bridge }

var _ schedule.Host[*stream.Stream] = scheduleHost{}

// newScheduler builds the bridge's scheduler, whose appends take permits of the publishes'
// lane.
func newScheduler(b *Bridge) (*schedule.Scheduler[*stream.Stream], error) {
	return schedule.New(schedule.Config[*stream.Stream]{
		Store: b.db, Host: scheduleHost{b}, Append: b.cfg.Append, Clock: b.clock, Logger: b.log, Registerer: b.cfg.Registerer,
	})
}

func (h scheduleHost) Streams() []*stream.Stream { return h.b.streams.List() }

func (h scheduleHost) Hold(ctx context.Context, streamID int64) (bool, error) {
	return h.b.cons.HoldScheduler(ctx, streamID)
}

func (h scheduleHost) Release(ctx context.Context, streamID int64) error {
	return h.b.cons.ReleaseScheduler(ctx, streamID)
}

// Append stores a produced message as the retention's delete markers are stored: through
// the stream's append, in a transaction of its own, announced once committed.
func (h scheduleHost) Append(ctx context.Context, s *stream.Stream, m pg.AppendMsg) (pg.Outcome, time.Duration, error) {
	cfg := s.ConfigView()
	bt := pg.AppendBatch{StreamID: s.ID(), ChunkRows: s.ChunkRows(), Limits: stream.Limits(cfg), Msgs: []pg.AppendMsg{m}}
	res, rtt, err := h.b.db.Append(ctx, []pg.AppendBatch{bt}, h.b.clock.Now().UnixNano())
	if len(res) == 0 {
		return pg.Outcome{}, rtt, err
	}
	if res[0].Gone {
		return pg.Outcome{Err: pg.ErrNotFound}, rtt, err
	}
	s.Commit(ctx, res[0])
	return res[0].Outcomes[0], rtt, err
}
