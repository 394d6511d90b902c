package bridge

import (
	"context"

	"github.com/jetgres/jetgres/bridge/schedule"
	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/pg"
)

// scheduleHost is what the scheduler (bridge/schedule) asks of the bridge: the streams,
// the scheduler locks of the consumers' ownership session, and appends and purges that
// the streams' readers hear of.
type scheduleHost struct{ b *Bridge }

var _ schedule.Host[*stream.Stream] = scheduleHost{}

// newScheduler builds the bridge's scheduler.
func newScheduler(b *Bridge) (*schedule.Scheduler[*stream.Stream], error) {
	return schedule.New(schedule.Config[*stream.Stream]{
		Store: b.db, Host: scheduleHost{b}, Clock: b.clock, Logger: b.log, Registerer: b.cfg.Registerer,
	})
}

func (h scheduleHost) Streams() []*stream.Stream { return h.b.streams.List() }

func (h scheduleHost) Hold(ctx context.Context, streamID int64) (bool, error) {
	return h.b.cons.HoldScheduler(ctx, streamID)
}

// Append stores a produced message as the retention's delete markers are stored: through
// the stream's append, in a transaction of its own, announced once committed.
func (h scheduleHost) Append(ctx context.Context, s *stream.Stream, subject string, hdr, data []byte) (uint64, error) {
	cfg := s.ConfigView()
	bt := pg.AppendBatch{StreamID: s.ID(), ChunkRows: s.ChunkRows(), Limits: stream.Limits(cfg),
		Msgs: []pg.AppendMsg{stream.Produced(cfg, subject, hdr, data)}}
	res, _, err := h.b.db.Append(ctx, []pg.AppendBatch{bt}, h.b.clock.Now().UnixNano())
	var seq uint64
	for _, r := range res {
		if r.Gone {
			return 0, pg.ErrNotFound
		}
		s.Commit(ctx, r)
		for _, o := range r.Outcomes {
			if o.Err != nil && err == nil {
				err = o.Err
			}
			seq = o.Seq
		}
	}
	return seq, err
}

func (h scheduleHost) Purge(ctx context.Context, s *stream.Stream, subject string, upTo uint64) (bool, error) {
	n, err := h.b.db.Purge(ctx, s.ID(), pg.PurgeParams{Filter: subject, UpTo: upTo})
	if err != nil || n == 0 {
		return false, err
	}
	s.Purge(ctx, stream.Purged{Request: true, Subject: subject})
	return true, nil
}
