package pg

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetgres/jetgres/internal/clock"
)

// copyLockBase is the high half of the one-key advisory locks that say which replica
// copies into a stream with a mirror or sources: the stream's id is the low half. It is
// "jgco", away from the numbered keys and from replicaLockKey.
const copyLockBase int64 = 0x6a67636f << 32

// OpenCopyLocks opens a session for the locks of stream copying (TryLockCopy): an
// ownership session, confirmed and fenced as one, that does not count as a live replica in
// the consumers' fair shares.
func (db *DB) OpenCopyLocks(ctx context.Context, clk clock.Clock, keepalive, timeout time.Duration) (*Ownership, error) {
	o := &Ownership{db: db, clock: clock.OrSystem(clk), keepalive: keepalive, timeout: timeout, held: make(map[int64]heldLock), plain: true}
	if err := o.Reconnect(ctx); err != nil {
		return nil, err
	}
	return o, nil
}

// TryLockCopy takes the copy lock of a stream unless another session holds it. This
// session taking it twice counts twice, as PostgreSQL's advisory locks do.
func (o *Ownership) TryLockCopy(ctx context.Context, streamID int64) (bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var ok bool
	err := o.exec(ctx, func(ctx context.Context, c *pgx.Conn) error {
		return c.QueryRow(ctx, `SELECT pg_try_advisory_lock($1::bigint)`, copyLockBase|streamID).Scan(&ok)
	})
	return ok, err
}

// UnlockCopy gives back one TryLockCopy of the stream.
func (o *Ownership) UnlockCopy(ctx context.Context, streamID int64) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.exec(ctx, func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SELECT pg_advisory_unlock($1::bigint)`, copyLockBase|streamID)
		return err
	})
}
