package pg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrReadInSQL says a consumer is read in SQL (jetgres.read_in_sql): no replica serves it
// until jetgres.read_over_nats gives it back. It is an ErrServedElsewhere.
var ErrReadInSQL = fmt.Errorf("%w: it is read in SQL (jetgres.read_over_nats gives it back to NATS)", ErrServedElsewhere)

// SQLConsumerState is what the transactions reading a consumer in SQL (jetgres.next,
// jetgres.ack, jetgres.ack_through; migration 015) committed, as consumer info reports it.
// Attempts that rolled back are counted by the next attempt, not here.
type SQLConsumerState struct {
	// DeliveredStreamSeq is the highest stream sequence handed out, DeliveredConsumerSeq
	// the deliveries made, redeliveries included.
	DeliveredStreamSeq   uint64
	DeliveredConsumerSeq uint64
	// AckPending counts the messages handed out and not acked; Redelivered those of them
	// handed out more than once.
	AckPending  int
	Redelivered int
	// LastDelivered and LastAcked are zero before the first delivery and ack.
	LastDelivered, LastAcked time.Time
}

// SQLConsumerState reports the consumer with that id if it is read in SQL; ok is false
// when it is read over NATS (or gone).
func (db *DB) SQLConsumerState(ctx context.Context, id int64) (st SQLConsumerState, ok bool, err error) {
	err = db.background(ctx, func(ctx context.Context, q querier) error {
		var handed, deliveries, pending, redelivered int64
		var delivered, acked *time.Time
		err := q.QueryRow(ctx, `SELECT q.handed, q.deliveries, q.last_delivered, q.last_acked,
				(SELECT count(*) FROM jetgres.sqlc_msgs(c.stream_id, c.ack_stream_seq, q.handed, q.pattern, NULL) m
				 WHERE NOT EXISTS (SELECT 1 FROM jetgres.sql_pending p WHERE p.consumer_id = q.consumer_id AND p.seq = m.seq AND p.acked)),
				(SELECT count(*) FROM jetgres.sql_pending p WHERE p.consumer_id = q.consumer_id AND p.delivered > 1 AND NOT p.acked)
			FROM jetgres.sql_consumers q JOIN jetgres.consumers c ON c.id = q.consumer_id
			WHERE q.consumer_id = $1`, id).Scan(&handed, &deliveries, &delivered, &acked, &pending, &redelivered)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		ok = true
		st = SQLConsumerState{DeliveredStreamSeq: uint64(handed), DeliveredConsumerSeq: uint64(deliveries),
			AckPending: int(pending), Redelivered: int(redelivered)}
		if delivered != nil {
			st.LastDelivered = *delivered
		}
		if acked != nil {
			st.LastAcked = *acked
		}
		return nil
	})
	if err != nil {
		return SQLConsumerState{}, false, fmt.Errorf("pg: state of consumer read in SQL: %w", err)
	}
	return st, ok, nil
}
