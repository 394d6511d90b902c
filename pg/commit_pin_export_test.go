package pg

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// CommitModeStatements is how many statements a push or cursor transaction on one of db's
// connections queues to set its synchronous_commit.
func (db *DB) CommitModeStatements(ctx context.Context) (n int, err error) {
	_, err = db.hot(ctx, func(ctx context.Context, q querier) error {
		n = db.queueCommitMode(q, &pgx.Batch{})
		return nil
	})
	return n, err
}
