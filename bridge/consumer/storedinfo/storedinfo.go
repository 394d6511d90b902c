// Package storedinfo reports a consumer as JetStream's ConsumerInfo from what PostgreSQL
// stores of it: its row (configuration, ack floor) and, for a consumer read in SQL
// (jetgres.next), what those transactions committed. It is the info of a consumer this
// replica does not serve, whose deliveries and pending acks no process holds in memory. It
// keeps nothing and has no locks.
package storedinfo

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/consumer/priority"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg"
)

// Store is what Info reads; *pg.DB satisfies it.
type Store interface {
	SQLConsumerState(ctx context.Context, id int64) (pg.SQLConsumerState, bool, error)
	CountPending(ctx context.Context, p pg.PendingParams) (uint64, error)
}

// Info reports the consumer row describes on the stream streamID called streamName, at now;
// hw is the stream's high-water mark, up to which num_pending counts. The caller adds what
// only it knows: push_bound and the cluster block.
func Info(ctx context.Context, db Store, streamID int64, streamName string, row pg.Consumer, hw uint64, now time.Time) (*server.ConsumerInfo, error) {
	var cfg server.ConsumerConfig
	if err := json.Unmarshal(row.Config, &cfg); err != nil {
		return nil, err
	}
	sq, inSQL, err := db.SQLConsumerState(ctx, row.ID)
	if err != nil {
		return nil, err
	}
	from := row.AckStreamSeq + 1
	if inSQL {
		from = max(from, sq.DeliveredStreamSeq+1)
	}
	np, err := db.CountPending(ctx, pg.PendingParams{StreamID: streamID, From: from, UpTo: hw, Filters: jswire.ConsumerFilters(&cfg)})
	if err != nil {
		return nil, err
	}
	floor := server.SequenceInfo{Consumer: row.AckConsumerSeq, Stream: row.ShownStreamSeq}
	info := &server.ConsumerInfo{Stream: streamName, Name: row.Name, Created: row.Created.UTC(), Config: jswire.ConsumerConfigForResponse(&cfg),
		Delivered: floor, AckFloor: floor, NumPending: np, TimeStamp: now.UTC()}
	if inSQL {
		info.Delivered = server.SequenceInfo{Consumer: sq.DeliveredConsumerSeq, Stream: max(sq.DeliveredStreamSeq, row.ShownStreamSeq),
			Last: UTCOrNil(sq.LastDelivered)}
		info.AckFloor.Last = UTCOrNil(sq.LastAcked)
		info.NumAckPending, info.NumRedelivered = sq.AckPending, sq.Redelivered
	}
	info.Paused, info.PauseRemaining = PausedAt(cfg.PauseUntil, now)
	// The pin lives with the replica serving the consumer: none is known here.
	info.PriorityGroups = priority.States(&cfg, nil, now)
	return info, nil
}

// PausedAt reports whether pause_until holds deliveries back at now, and for how long yet.
func PausedAt(until *time.Time, now time.Time) (paused bool, remaining time.Duration) {
	if until == nil || !now.Before(*until) {
		return false, 0
	}
	return true, until.Sub(now)
}

// UTCOrNil is t in UTC, or nil for the zero time, as ConsumerInfo leaves out a time it has
// not seen.
func UTCOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}
