package pg

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// StagedChannel is the channel jetgres.publish notifies when its transaction commits.
const StagedChannel = "jetgres_staged"

// StagedMsg is one message an application published with jetgres.publish, committed and
// waiting to be moved into its stream.
type StagedMsg struct {
	StreamID int64 // the stream that took the subject at the call
	Subject  string
	Header   []byte
	Data     []byte
}

// MovePlan turns the staged messages of one move, in the order they must keep, into the
// batches to append. Messages it leaves out are moved past all the same: the caller refused
// them. An error ends the move with nothing moved, and MoveStaged returns it. It runs
// inside the move's transaction, so it must not block.
type MovePlan func(staged []StagedMsg) ([]AppendBatch, error)

// MoveStaged moves up to max committed staged messages into their streams in one
// transaction: it locks the mover's progress row (so one replica moves at a time), reads
// the staged rows after that progress whose transactions ended before every transaction
// still running, appends plan's batches exactly as Append does (de-duplication, limits,
// dense sequences) and records the new progress, then commits. A crash anywhere before the
// commit moves nothing; after it, nothing is moved twice. It returns how many staged
// messages it took (0: none was ready) and the append's results, and, like Append, the
// round trip for the append lane's limiter. ts is the store time as Append takes it.
func (db *DB) MoveStaged(ctx context.Context, max int, plan MovePlan, ts int64) (taken int, results []AppendResult, rtt time.Duration, err error) {
	ts = db.pgUnixNano(ts)
	rtt, err = db.hot(ctx, func(ctx context.Context, q querier) error {
		committed := false
		defer func() {
			if !committed && ctx.Err() == nil {
				_, _ = q.Exec(ctx, "ROLLBACK")
			}
		}()
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(`SELECT 1 FROM jetgres.staging FOR UPDATE`)
		b.Queue(`SELECT xid::text, call, stream_id, subject, hdr, data FROM jetgres.staged_ready($1)`, max)
		br := q.SendBatch(ctx, b)
		staged, lastXID, lastCall, err := readStaged(br)
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		taken = len(staged)
		if taken == 0 {
			return nil // the deferred ROLLBACK ends the transaction
		}
		const progress = `UPDATE jetgres.staging SET moved_xid = $1::xid8, moved_call = $2`
		batches, err := plan(staged)
		if err != nil {
			return err
		}
		if len(batches) == 0 {
			if _, err := q.Exec(ctx, progress, lastXID, lastCall); err != nil {
				return err
			}
			if _, err := q.Exec(ctx, "COMMIT"); err != nil {
				return err
			}
			committed = true
			return nil
		}
		if !slices.IsSortedFunc(batches, byStreamID) {
			slices.SortFunc(batches, byStreamID)
		}
		// appendTx commits, or rolls back the whole transaction, progress included.
		committed = true
		results, err = db.appendTx(ctx, q, batches, ts, progress, lastXID, lastCall)
		return err
	})
	if err != nil {
		return 0, nil, rtt, fmt.Errorf("pg: move staged: %w", err)
	}
	return taken, results, rtt, nil
}

// readStaged reads the staged rows after the results of BEGIN and the progress lock.
func readStaged(br pgx.BatchResults) (staged []StagedMsg, lastXID string, lastCall int64, err error) {
	if err := skipResults(br, 2); err != nil {
		return nil, "", 0, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, "", 0, err
	}
	defer rows.Close()
	for rows.Next() {
		var m StagedMsg
		if err := rows.Scan(&lastXID, &lastCall, &m.StreamID, &m.Subject, &m.Header, &m.Data); err != nil {
			return nil, "", 0, err
		}
		staged = append(staged, m)
	}
	return staged, lastXID, lastCall, rows.Err()
}

// StagedWaiting reports whether a staged message is ready to move. It runs outside the
// flow lanes, so that a mover polling on its timer holds no append permit while nothing waits.
func (db *DB) StagedWaiting(ctx context.Context) (bool, error) {
	var ready bool
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		return q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM jetgres.staged_ready(1))`).Scan(&ready)
	})
	if err != nil {
		return false, fmt.Errorf("pg: staged waiting: %w", err)
	}
	return ready, nil
}

// StagedSettled reports whether every transaction that was running when a mover let its
// awake lock go (horizon, from MoverAwake.Release) has ended: until then one of them may
// commit staged messages without notifying, and the mover must keep looking on its timer.
func (db *DB) StagedSettled(ctx context.Context, horizon string) (bool, error) {
	var settled bool
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		return q.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot()) >= $1::xid8`, horizon).Scan(&settled)
	})
	if err != nil {
		return false, fmt.Errorf("pg: staged settled: %w", err)
	}
	return settled, nil
}

// moverAwakeKey is the session-level advisory lock an awake mover holds ("jetgres" and 3 in
// ASCII); jetgres.publish notifies only when it could take it shared (migration 007).
const moverAwakeKey int64 = 0x6a65746772657303

// MoverAwake is a mover's claim that it is awake, so that commits that publish need not
// notify: a session-level advisory lock on a connection of its own, which PostgreSQL lets
// go the moment that connection ends. Its methods are not safe for concurrent use.
type MoverAwake struct {
	db   *DB
	conn *pgx.Conn // nil until Hold connects, and after an error
}

// MoverAwake returns a mover's awake lock, not yet held and not yet connected.
func (db *DB) MoverAwake() *MoverAwake { return &MoverAwake{db: db} }

// Hold takes the lock without waiting, connecting first if need be. It reports false when
// another session holds it: another replica's mover is awake.
func (a *MoverAwake) Hold(ctx context.Context) (bool, error) {
	if a.conn == nil {
		c, err := pgx.ConnectConfig(ctx, a.db.pool.Config().ConnConfig.Copy())
		if err != nil {
			return false, fmt.Errorf("pg: mover awake: connecting: %w", err)
		}
		a.conn = c
	}
	var held bool
	if err := a.conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, moverAwakeKey).Scan(&held); err != nil {
		a.Close()
		return false, fmt.Errorf("pg: mover awake: %w", err)
	}
	return held, nil
}

// Release lets the lock go and returns the horizon for StagedSettled: transactions below
// it may have published while the lock was held. When the unlock fails the connection is
// closed, which lets the lock go all the same.
func (a *MoverAwake) Release(ctx context.Context) (horizon string, err error) {
	if a.conn != nil {
		if err := a.conn.QueryRow(ctx, `SELECT pg_advisory_unlock($1)`, moverAwakeKey).Scan(new(bool)); err != nil {
			a.Close()
		}
	}
	// Read after the unlock, so that every transaction that found the lock held is below.
	err = a.db.background(ctx, func(ctx context.Context, q querier) error {
		return q.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text`).Scan(&horizon)
	})
	if err != nil {
		return "", fmt.Errorf("pg: mover awake: release: %w", err)
	}
	return horizon, nil
}

// Close ends the connection, and the lock with it.
func (a *MoverAwake) Close() {
	if a.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	_ = a.conn.Close(ctx)
	a.conn = nil
}

// RotateStaging runs one step of the staging tables' rotation (see migration 007): it
// truncates the table calls no longer insert into once everything in it is moved and no
// transaction holds it, or else switches the target once it has held rows for period. It
// never waits for a lock. It returns what it did: "truncated", "switched", "busy",
// "undrained" or "idle".
func (db *DB) RotateStaging(ctx context.Context, period time.Duration) (string, error) {
	var did string
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		return q.QueryRow(ctx, `SELECT jetgres.staging_rotate($1)`, period).Scan(&did)
	})
	if err != nil {
		return "", fmt.Errorf("pg: rotate staging: %w", err)
	}
	return did, nil
}

// Listen calls notify for every notification on channel, and once when it starts
// listening, so that whatever was sent before is not missed. It holds a connection of its
// own, outside the pool, until ctx ends or the connection fails, and returns the error
// that ended it (ctx's when ctx ended). notify runs on Listen's goroutine and must not block.
func (db *DB) Listen(ctx context.Context, channel string, notify func()) error {
	cfg := db.pool.Config().ConnConfig.Copy()
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("pg: listen: connecting: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		_ = c.Close(cctx)
	}()
	if _, err := c.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return fmt.Errorf("pg: listen %s: %w", channel, err)
	}
	notify()
	for {
		if _, err := c.WaitForNotification(ctx); err != nil {
			return fmt.Errorf("pg: listen %s: %w", channel, err)
		}
		notify()
	}
}
