package pg

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// schedulerLockBase is the high half of the one-key advisory locks that say which replica
// fires a stream's message schedules: "jgsc" above the stream's id, away from
// replicaLockKey and the numbered keys of migrations and stream administration.
const schedulerLockBase int64 = 0x6a677363 << 32

// HoldScheduler reports whether this session holds the lock that makes its replica the one
// that fires the message schedules of the stream streamID, taking it if no other session
// holds it. Like the consumers' locks, it goes with the session: a replica that dies frees
// it at once, and one whose session breaks must take it again before it fires. A lock the
// session took is answered from memory: the scheduler asks every pass, and the ownership
// loop confirms the session.
func (o *Ownership) HoldScheduler(ctx context.Context, streamID int64) (bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.conn != nil && o.schedulers[streamID] {
		return true, nil
	}
	var ok bool
	err := o.exec(ctx, func(ctx context.Context, c *pgx.Conn) error {
		return c.QueryRow(ctx, `SELECT pg_try_advisory_lock($1::bigint)`, schedulerLockBase|streamID).Scan(&ok)
	})
	if ok && err == nil {
		if o.schedulers == nil {
			o.schedulers = make(map[int64]bool)
		}
		o.schedulers[streamID] = true
	}
	return ok, err
}

// ReleaseScheduler gives up the scheduler lock of the stream streamID if this session holds
// it, for a stream deleted while its replica fired its schedules: a session-level lock
// outlives the stream, and would stay taken until the session ends.
func (o *Ownership) ReleaseScheduler(ctx context.Context, streamID int64) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.schedulers, streamID)
	return o.exec(ctx, func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SELECT pg_advisory_unlock($1::bigint)`, schedulerLockBase|streamID)
		return err
	})
}
