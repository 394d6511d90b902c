package pg

import (
	"context"
	"time"
)

// Querier is querier, for the tests of how pg runs work.
type Querier = querier

// Hot exposes hot to the tests of timeouts, cancellation and connection reuse.
func (db *DB) Hot(ctx context.Context, fn func(ctx context.Context, q Querier) error) (time.Duration, error) {
	return db.hot(ctx, fn)
}

// HotTx is Hot inside BEGIN … COMMIT, as backgroundTx runs a transaction.
func (db *DB) HotTx(ctx context.Context, fn func(ctx context.Context, q Querier) error) (time.Duration, error) {
	return db.runRetry(ctx, db.cfg.StmtTimeout, func(ctx context.Context, q querier) error { return inTx(ctx, q, fn) })
}

// Background exposes background to the tests.
func (db *DB) Background(ctx context.Context, fn func(ctx context.Context, q Querier) error) error {
	return db.background(ctx, fn)
}

// BackgroundTx exposes backgroundTx to the tests.
func (db *DB) BackgroundTx(ctx context.Context, fn func(ctx context.Context, q Querier) error) error {
	return db.backgroundTx(ctx, fn)
}
