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

// StagedMsg is one message an application published in SQL, with jetgres.publish or into
// jetgres.outbox, committed and waiting to be moved into its stream.
type StagedMsg struct {
	// StreamID is the stream that took the subject: at the call for jetgres.publish, at the
	// move for an outbox row; 0 when none does.
	StreamID int64
	Subject  string
	Header   []byte
	Data     []byte
	// Outbox says the row was inserted into jetgres.outbox: nothing was checked at the
	// insert, and Problem says what the move found wrong before any stream looked (a reason
	// label of jetgres_sql_publish_refused_total, "" for nothing), Detail how.
	Outbox          bool
	Problem, Detail string
	headers         *string // an outbox row's headers as inserted, for jetgres.outbox_rejected
}

// Rejection is a staged message that is not stored: MoveStaged records it in
// jetgres.outbox_rejected in the move's own transaction, so that a message is either in its
// stream or there, never lost.
type Rejection struct {
	Staged int    // its index among the move's staged messages
	Stream string // the stream that refused it, "" when none took its subject
	Reason string
	Detail string
}

// MovePlanner decides a move. Both methods run inside the move's transaction, so they must
// not block.
type MovePlanner interface {
	// Plan turns the staged messages of one move, in the order they must keep, into the
	// batches to append, and rejects the rest. An error ends the move with nothing moved, and
	// MoveStaged returns it.
	Plan(staged []StagedMsg) ([]AppendBatch, []Rejection, error)
	// Refused is what the append refused of Plan's batches (duplicates are not refusals).
	Refused(results []AppendResult) []Rejection
}

// MoveStaged moves up to max committed staged messages into their streams in one
// transaction: it locks the mover's progress row (so one replica moves at a time), reads
// the staged rows after that progress whose transactions ended before every transaction
// still running, appends the planner's batches exactly as Append does (de-duplication,
// limits, dense sequences), records what was rejected and the new progress, then commits. A crash anywhere before the
// commit moves nothing; after it, nothing is moved twice. It returns how many staged
// messages it took (0: none was ready) and the append's results, and, like Append, the
// round trip for the append lane's limiter. ts is the store time as Append takes it.
func (db *DB) MoveStaged(ctx context.Context, max int, planner MovePlanner, ts int64) (taken int, results []AppendResult, rtt time.Duration, err error) {
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
		b.Queue(`SELECT xid::text, call, coalesce(stream_id, 0), subject, hdr, data, outbox, headers::text,
			coalesce(problem, ''), coalesce(detail, '') FROM jetgres.staged_ready($1)`, max)
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
		batches, rejected, err := planner.Plan(staged)
		if err != nil {
			return err
		}
		if len(batches) == 0 {
			b := &pgx.Batch{}
			b.Queue(progress, lastXID, lastCall)
			queueRejections(b, staged, rejected)
			b.Queue("COMMIT")
			if err := q.SendBatch(ctx, b).Close(); err != nil {
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
		results, err = db.appendTx(ctx, q, batches, ts, txEnds{
			first: progress, firstArgs: []any{lastXID, lastCall},
			last: func(b *pgx.Batch, res []AppendResult) {
				queueRejections(b, staged, append(rejected, planner.Refused(res)...))
			},
		})
		return err
	})
	if err != nil {
		return 0, nil, rtt, fmt.Errorf("pg: move staged: %w", err)
	}
	return taken, results, rtt, nil
}

// queueRejections queues the insert of rejected into jetgres.outbox_rejected.
func queueRejections(b *pgx.Batch, staged []StagedMsg, rejected []Rejection) {
	if len(rejected) == 0 {
		return
	}
	n := len(rejected)
	outbox, streams, subjects, headers := make([]bool, n), make([]string, n), make([]string, n), make([]*string, n)
	hdrs, data, reasons, details := make([][]byte, n), make([][]byte, n), make([]string, n), make([]string, n)
	for i, r := range rejected {
		m := staged[r.Staged]
		outbox[i], streams[i], subjects[i], headers[i] = m.Outbox, r.Stream, m.Subject, m.headers
		hdrs[i], data[i], reasons[i], details[i] = m.Header, m.Data, r.Reason, r.Detail
		if m.Outbox {
			hdrs[i] = nil // as inserted, not as converted
		}
	}
	b.Queue(`INSERT INTO jetgres.outbox_rejected (source, stream, subject, headers, data, reason, detail)
		SELECT CASE WHEN t.o THEN 'outbox' ELSE 'publish' END, nullif(t.st, ''), t.su,
		       coalesce(t.hj::jsonb, jetgres.headers_jsonb(t.hb)), t.d, t.r, nullif(t.de, '')
		FROM unnest($1::boolean[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::bytea[], $7::text[], $8::text[])
		     AS t(o, st, su, hj, hb, d, r, de)`,
		outbox, streams, subjects, headers, hdrs, data, reasons, details)
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
		if err := rows.Scan(&lastXID, &lastCall, &m.StreamID, &m.Subject, &m.Header, &m.Data, &m.Outbox, &m.headers,
			&m.Problem, &m.Detail); err != nil {
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

// RotateOutbox runs one step of jetgres.outbox's rotation (see migration 016): it truncates
// the table that is not the turn's once everything in it is moved and no transaction holds
// it, or else turns once the turn's table has held rows for period. It never waits for a
// lock. It returns what it did: "truncated", "switched", "busy", "undrained" or "idle".
func (db *DB) RotateOutbox(ctx context.Context, period time.Duration) (string, error) {
	var did string
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		return q.QueryRow(ctx, `SELECT jetgres.outbox_rotate($1)`, period).Scan(&did)
	})
	if err != nil {
		return "", fmt.Errorf("pg: rotate outbox: %w", err)
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
