package pg

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetgres/jetgres/internal/clock"
)

// PostgreSQL's clock is the one clock every replica of a deployment reads, whatever their
// own say: a replica learns how far its clock is from PostgreSQL's from the round trips it
// makes anyway (the ownership session's confirmations, and one at the forwarder's start)
// and moves onto PostgreSQL's clock the times that other replicas compare with their own:
// the seals of forwarded requests (bridge/ownership) and the store times of messages.
//
// A round trip sent at s and answered at a, in which PostgreSQL read its clock as p, proves
// only that the offset lies between p-a and p-s. The estimate moves just as far as a new
// round trip proves it wrong (to the nearest end of that interval) and otherwise stays: a
// midpoint estimate would move by up to half of every slow round trip, and a replica beside
// its database (offset zero) would then store messages milliseconds off its own clock at
// random. The error is at most one round trip, where the replicas' own clocks may be
// minutes apart.
//
// The offset is the DB's: a DB serves one replica, whose clock is the one given to
// OpenOwnership and MeasureClock.

// sqlClock reads PostgreSQL's clock as it is when the statement runs, not when its
// transaction began.
const sqlClock = `SELECT clock_timestamp()`

// clockOffset is PostgreSQL's clock minus the replica's, in nanoseconds, as last measured.
type clockOffset struct {
	ns    atomic.Int64
	known atomic.Bool
}

// record moves the offset into what a round trip sent at sent and answered at answered,
// both on the replica's clock, proves when PostgreSQL read pgNow, and returns it.
func (c *clockOffset) record(sent, answered, pgNow time.Time) time.Duration {
	lo, hi := int64(pgNow.Sub(answered)), int64(pgNow.Sub(sent))
	for {
		cur := c.ns.Load()
		next := min(max(cur, lo), hi)
		if c.ns.CompareAndSwap(cur, next) {
			c.known.Store(true)
			return time.Duration(next)
		}
	}
}

// ClockOffset is how far PostgreSQL's clock is ahead of the replica's (negative: behind), as
// last measured, and false before the first measurement.
func (db *DB) ClockOffset() (time.Duration, bool) {
	return time.Duration(db.offset.ns.Load()), db.offset.known.Load()
}

// PGTime is t, a time of the replica's clock, moved onto PostgreSQL's clock by the last
// measured offset; t itself before any measurement.
func (db *DB) PGTime(t time.Time) time.Time {
	off, _ := db.ClockOffset()
	return t.Add(off)
}

// pgUnixNano is PGTime for a time in unix nanoseconds.
func (db *DB) pgUnixNano(ns int64) int64 {
	off, _ := db.ClockOffset()
	return ns + int64(off)
}

// MeasureClock measures ClockOffset against clk with one round trip on the pool, for a
// caller that needs it before the ownership session confirms anything.
func (db *DB) MeasureClock(ctx context.Context, clk clock.Clock) (time.Duration, error) {
	var off time.Duration
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		sent := clk.Now()
		var pgNow time.Time
		if err := q.QueryRow(ctx, sqlClock).Scan(&pgNow); err != nil {
			return err
		}
		off = db.offset.record(sent, clk.Now(), pgNow)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("pg: read the database's clock: %w", err)
	}
	return off, nil
}

// readClock is the ownership session's confirmation: one round trip that reads
// PostgreSQL's clock and records the offset.
func (db *DB) readClock(ctx context.Context, c *pgx.Conn, clk clock.Clock) error {
	sent := clk.Now()
	var pgNow time.Time
	if err := c.QueryRow(ctx, sqlClock).Scan(&pgNow); err != nil {
		return err
	}
	db.offset.record(sent, clk.Now(), pgNow)
	return nil
}
