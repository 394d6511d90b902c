package pg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// MetaChannel is the channel on which every transaction that creates, changes or deletes a
// stream or a consumer notifies, at its commit, with the stream's id as the payload: the
// other replicas re-read what changed at once instead of at their next poll.
const MetaChannel = "jetgres_meta"

// streamAdminLockKey is the transaction-level advisory lock under which streams are created
// and their subjects changed ("jetgres" and 2 in ASCII): the subject-overlap check of one
// replica sees every stream another created before it.
const streamAdminLockKey int64 = 0x6a65746772657302

// metaReconnectDelay paces the listener's reconnections while the database is away.
const metaReconnectDelay = time.Second

func notifyMeta(ctx context.Context, q querier, streamID int64) error {
	_, err := q.Exec(ctx, `SELECT pg_notify('`+MetaChannel+`', $1::bigint::text)`, streamID)
	return err
}

// StreamCheck decides, inside the transaction that stores a stream, whether it may be
// stored next to the others as PostgreSQL holds them (every stream but itself).
type StreamCheck func(others []StreamRow) error

// runStreamCheck runs check, when there is one, on the streams streamsForCheck reads.
// check's refusal is returned and also kept in *refused, so that the caller can tell it from
// the database's errors once the transaction has rolled back.
func runStreamCheck(ctx context.Context, q querier, name string, check StreamCheck, refused *error) error {
	if check == nil {
		return nil
	}
	others, err := streamsForCheck(ctx, q, name)
	if err != nil {
		return err
	}
	*refused = check(others)
	return *refused
}

// streamsForCheck takes the stream-admin lock and reads every stream but the one named.
func streamsForCheck(ctx context.Context, q querier, name string) ([]StreamRow, error) {
	if _, err := q.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, streamAdminLockKey); err != nil {
		return nil, err
	}
	rows, err := q.Query(ctx, `SELECT id, name, config, created FROM jetgres.streams WHERE name <> $1`, name)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (StreamRow, error) {
		var s StreamRow
		err := r.Scan(&s.ID, &s.Name, &s.Config, &s.Created)
		return s, err
	})
}

// UpdateStreamChecked replaces a stream's stored configuration when check accepts it.
// check's error is returned as it is; ErrNotFound says the stream is gone.
func (db *DB) UpdateStreamChecked(ctx context.Context, id int64, name string, config []byte, check StreamCheck) error {
	var checkErr error
	err := db.backgroundTx(ctx, func(ctx context.Context, q querier) error {
		if err := runStreamCheck(ctx, q, name, check, &checkErr); err != nil {
			return err
		}
		tag, err := q.Exec(ctx, `UPDATE jetgres.streams SET config = $2, updated = now() WHERE id = $1`, id, config)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrNotFound
		}
		return notifyMeta(ctx, q, id)
	})
	if checkErr != nil || errors.Is(err, ErrNotFound) {
		return err
	}
	if err != nil {
		return fmt.Errorf("pg: update stream: %w", err)
	}
	return nil
}

// ListenMeta calls fn with the stream id of each notification on MetaChannel until ctx ends,
// on a dedicated connection. It calls fn with 0 after each (re)connection, when
// notifications may have been missed: the caller re-reads everything then.
func (db *DB) ListenMeta(ctx context.Context, fn func(streamID int64)) {
	for ctx.Err() == nil {
		err := db.listenMeta(ctx, fn)
		if ctx.Err() != nil {
			return
		}
		db.log.Warn("listening for stream and consumer changes failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(metaReconnectDelay):
		}
	}
}

func (db *DB) listenMeta(ctx context.Context, fn func(streamID int64)) error {
	cfg := db.pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = cfg.RuntimeParams["application_name"] + " listen"
	cctx, cancel := context.WithTimeout(ctx, db.cfg.StmtTimeout)
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err == nil {
		_, err = conn.Exec(cctx, `LISTEN `+MetaChannel)
	}
	cancel()
	if err != nil {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	fn(0)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		var id int64
		if _, err := fmt.Sscan(n.Payload, &id); err == nil && id > 0 {
			fn(id)
		}
	}
}
