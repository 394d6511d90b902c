package pg

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// schedulerLockBase is the high half of the one-key advisory locks that say which replica
// fires a stream's message schedules: "jgsc" above the stream's id, away from
// replicaLockKey and the numbered keys of migrations and stream administration.
const schedulerLockBase int64 = 0x6a677363 << 32

// sqlHoldScheduler takes a scheduler lock ($1) unless the session holds it already: a
// session-level advisory lock counts each time it is taken, so it is taken once.
const sqlHoldScheduler = `SELECT CASE WHEN EXISTS (
		SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
			AND objsubid = 1 AND classid = ($1::bigint >> 32)::oid AND objid = ($1::bigint & 4294967295)::oid)
	THEN true ELSE pg_try_advisory_lock($1::bigint) END`

// HoldScheduler reports whether this session holds the lock that makes its replica the one
// that fires the message schedules of the stream streamID, taking it if no other session
// holds it. Like the consumers' locks, it goes with the session: a replica that dies frees
// it at once, and one whose session breaks must take it again before it fires.
func (o *Ownership) HoldScheduler(ctx context.Context, streamID int64) (bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var ok bool
	err := o.exec(ctx, func(ctx context.Context, c *pgx.Conn) error {
		return c.QueryRow(ctx, sqlHoldScheduler, schedulerLockBase|streamID).Scan(&ok)
	})
	return ok, err
}

// ReleaseScheduler gives up the scheduler lock of the stream streamID if this session holds
// it, for a stream deleted while its replica fired its schedules: a session-level lock
// outlives the stream, and would stay taken until the session ends.
func (o *Ownership) ReleaseScheduler(ctx context.Context, streamID int64) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.exec(ctx, func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SELECT pg_advisory_unlock($1::bigint)`, schedulerLockBase|streamID)
		return err
	})
}
