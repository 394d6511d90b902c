package sqlmove

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetgres/jetgres/internal/wake"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// BenchmarkSQLPublish sets publishing from SQL beside the same load written by a plain
// INSERT into an application table, in one run: 100 sessions with one message per
// transaction, and one session with 10,000 messages per transaction (one statement over
// generate_series for both). One op is one message; msgs/s is what the sessions committed.
// PostgreSQL runs with fsync and synchronous_commit on (pgtest.Durable), and a Mover with
// the bridge's settings moves what the sessions publish throughout. The floor is the
// bare INSERT a call makes, into a table shaped as staging is (the transaction's id, a call
// number from a sequence, the (xid, call) index): what no function body can go below.
// floorcall is that INSERT inside a PL/pgSQL function that does nothing else: a call is a
// statement of its own, which a row of one INSERT over generate_series is not, so this is
// what no per-call body can go below.
//
// floormove is floorcall's sessions with a mover beside them, on the same cores, for as long
// as the sub-benchmark runs: every message a staged design publishes is written twice (the
// staged row, then the stream's) and read once in between, whatever the design's code, so
// this is what no staged design can go above. Its mover does the least a move can: one
// statement, which reads the next committed staged rows in (xid, call) order below the
// snapshot's xmin as jetgres.staged_ready does, inserts them into a table shaped as a
// stream's chunk with sequences numbered in SQL, and updates one progress row, nothing of
// the data passing through Go. A commit wakes it through a channel, which costs the
// sessions nothing. Its msgs/s is what the sessions committed, as for the other rows, and
// moved/s is b.N over the time until the mover had moved all of it: a mover that falls
// behind shows there.
//
// floorroute is floormove with the one check a call must make that needs a table: the
// stream that takes the subject, read from jetgres.stream_routes by the statement
// jetgres.publish's first call in a transaction uses, so that a subject no stream takes
// fails the application's transaction. With one message per transaction every call is a
// first: this is what no staged design that routes at the call can go above there.
//
// outbox writes the same messages into jetgres.outbox, with the mover taking them: the
// price of an INSERT that the outbox promises, against insert. The copy100000 rows write
// 100,000 rows a transaction with COPY, into the application's table and into the outbox.
//
//	go test -run '^$' -bench 'SQLPublish$' -benchtime 3s ./bridge/sqlmove/
func BenchmarkSQLPublish(b *testing.B) {
	url := pgtest.Durable(b)
	db := pgtest.OpenAt(b, url)
	createStream(b, db, `{"name":"S","subjects":["s.>"]}`)
	startMover(b, db, newHost(b, db), nil)
	ctx := context.Background()
	raw := rawsql.Open(b, pgtest.WithParam(b, url, "pool_max_conns", "110"))
	if err := raw.Exec(ctx, `CREATE TABLE app_events (id bigserial PRIMARY KEY, subject text NOT NULL, data bytea NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	if err := raw.Exec(ctx, `CREATE SEQUENCE floor_call CACHE 64;
		CREATE TABLE floor_staged (LIKE jetgres.staged_0 INCLUDING ALL);
		CREATE FUNCTION floor_call(subject text, data bytea) RETURNS void LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO floor_staged (call, stream_id, subject, data) VALUES (nextval('floor_call'), 1, subject, data);
		END $$;
		CREATE FUNCTION floor_route(subject text, data bytea) RETURNS void LANGUAGE plpgsql AS $$
		DECLARE
			v_stream bigint;
		BEGIN
			SELECT r.stream_id INTO v_stream FROM jetgres.stream_routes r
			WHERE r.head IN (split_part(floor_route.subject, '.', 1), '*', '>') AND floor_route.subject ~ r.pattern;
			IF v_stream IS NULL THEN
				RAISE EXCEPTION 'no stream takes subject %', subject;
			END IF;
			INSERT INTO floor_staged (call, stream_id, subject, data) VALUES (nextval('floor_call'), v_stream, subject, data);
		END $$`); err != nil {
		b.Fatal(err)
	}
	// floor_chunk is shaped as pg's chunk tables are; floor_moved is the move's progress and
	// the stream's last sequence in one row, updated once per move as jetgres.staging is.
	for _, ddl := range pg.ChunkShapeDDL("floor_chunk") {
		if err := raw.Exec(ctx, ddl); err != nil {
			b.Fatal(err)
		}
	}
	if err := raw.Exec(ctx, `CREATE TABLE floor_moved (
			one        boolean PRIMARY KEY DEFAULT true CHECK (one),
			moved_xid  xid8    NOT NULL DEFAULT '0',
			moved_call bigint  NOT NULL DEFAULT 0,
			last_seq   bigint  NOT NULL DEFAULT 0
		) WITH (fillfactor = 50);
		INSERT INTO floor_moved DEFAULT VALUES`); err != nil {
		b.Fatal(err)
	}
	const insert = `INSERT INTO app_events (subject, data) VALUES ($1, $2::text::bytea)`
	const publish = `SELECT jetgres.publish($1, $2::text)`
	const insertMany = `INSERT INTO app_events (subject, data) SELECT 's.x', g::text::bytea FROM generate_series(1, $1) g`
	const publishMany = `SELECT jetgres.publish('s.x', g::text) FROM generate_series(1, $1) g`
	const floor = `INSERT INTO floor_staged (call, stream_id, subject, data) VALUES (nextval('floor_call'), 1, $1, $2::text::bytea)`
	const floorMany = `INSERT INTO floor_staged (call, stream_id, subject, data) SELECT nextval('floor_call'), 1, 's.x', g::text::bytea FROM generate_series(1, $1) g`
	const floorCall = `SELECT floor_call($1, $2::text::bytea)`
	const floorCallMany = `SELECT floor_call('s.x', g::text::bytea) FROM generate_series(1, $1) g`
	const floorRoute = `SELECT floor_route($1, $2::text::bytea)`
	const outbox = `INSERT INTO jetgres.outbox (subject, data) VALUES ($1, $2::text::bytea)`
	const outboxMany = `INSERT INTO jetgres.outbox (subject, data) SELECT 's.x', g::text::bytea FROM generate_series(1, $1) g`
	copyConn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer copyConn.Close(ctx)
	for _, c := range []struct {
		name, sql string
		sessions  int
		move      bool
		copyInto  pgx.Identifier // COPY of copyRows rows a transaction into this table
	}{
		{"insert/100x1", insert, 100, false, nil},
		{"publish/100x1", publish, 100, false, nil},
		{"floor/100x1", floor, 100, false, nil},
		{"floorcall/100x1", floorCall, 100, false, nil},
		{"floormove/100x1", floorCall, 100, true, nil},
		{"floorroute/100x1", floorRoute, 100, true, nil},
		{"insert/1x10000", insertMany, 1, false, nil},
		{"publish/1x10000", publishMany, 1, false, nil},
		{"floor/1x10000", floorMany, 1, false, nil},
		{"floorcall/1x10000", floorCallMany, 1, false, nil},
		{"floormove/1x10000", floorCallMany, 1, true, nil},
		{"outbox/100x1", outbox, 100, false, nil},
		{"outbox/1x10000", outboxMany, 1, false, nil},
		{"insert/copy100000", "", 1, false, pgx.Identifier{"app_events"}},
		{"outbox/copy100000", "", 1, false, pgx.Identifier{"jetgres", "outbox"}},
	} {
		b.Run(c.name, func(b *testing.B) {
			var next atomic.Int64
			var wg sync.WaitGroup
			// Buffered so that a commit never waits for the mover, and a wake-up given while
			// the mover is busy is kept for its next look.
			woken := make(chan struct{}, 1)
			var moved chan time.Time
			if c.move {
				moved = floorMove(b, raw, woken)
			}
			b.ResetTimer()
			start := time.Now()
			for range c.sessions {
				wg.Go(func() {
					for {
						if c.copyInto != nil {
							from := next.Add(copyRows) - copyRows
							if from >= int64(b.N) {
								return
							}
							if err := copyTx(ctx, copyConn, c.copyInto, from, min(int64(b.N)-from, copyRows)); err != nil {
								b.Error(err)
								return
							}
							continue
						}
						if c.sessions == 1 {
							from := next.Add(10_000) - 10_000
							if from >= int64(b.N) {
								return
							}
							n := min(int64(b.N)-from, 10_000)
							if err := raw.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error { return q.Exec(ctx, c.sql, n) }); err != nil {
								b.Error(err)
								return
							}
							wake.Poke(woken)
							continue
						}
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						if err := raw.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error {
							return q.Exec(ctx, c.sql, "s.x", strconv.FormatInt(i, 10))
						}); err != nil {
							b.Error(err)
							return
						}
						wake.Poke(woken)
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
			if c.move {
				if at, ok := <-moved; ok {
					b.ReportMetric(float64(b.N)/at.Sub(start).Seconds(), "moved/s")
				}
			}
		})
	}
}

// copyRows is how many rows one COPY of the copy rows writes.
const copyRows = 100_000

// copyTx copies n rows into table in one transaction: subject and data, as the other rows
// insert them.
func copyTx(ctx context.Context, conn *pgx.Conn, table pgx.Identifier, from, n int64) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		i := from
		_, err := tx.CopyFrom(ctx, table, []string{"subject", "data"}, pgx.CopyFromFunc(func() ([]any, error) {
			if i == from+n {
				return nil, nil
			}
			i++
			return []any{"s.x", strconv.AppendInt(nil, i, 10)}, nil
		}))
		return err
	})
}

// floorMove starts floormove's mover for one run of a sub-benchmark: it moves from
// floor_staged into floor_chunk what the run's sessions commit, woken by woken, until b.N
// messages are moved, and then sends the time it finished on the returned channel, which
// it closes without one if a move or the benchmark failed. The chunk starts empty and the
// progress after what earlier runs and rows staged, all of it committed by then.
func floorMove(b *testing.B, raw *rawsql.Pool, woken <-chan struct{}) chan time.Time {
	b.Helper()
	ctx := context.Background()
	if err := raw.Exec(ctx, `TRUNCATE floor_chunk;
		UPDATE floor_moved SET (moved_xid, moved_call, last_seq) = (
			SELECT coalesce(max(s.xid), '0'), coalesce(max(s.call), 0), 0 FROM (
				SELECT xid, call FROM floor_staged ORDER BY xid DESC, call DESC LIMIT 1) s)`); err != nil {
		b.Fatal(err)
	}
	// One statement in a transaction of its own: the sequences go on from the progress row's
	// last_seq, and the progress row takes the last row moved, which it returns with the
	// stream's new last sequence. A look that finds nothing writes nothing and returns no row.
	// The progress is read by subqueries, not joined: joined, the row comparison filtered
	// the scan instead of starting it, which read every row moved before at every move.
	move := `WITH m AS (
			SELECT s.xid, s.call, (SELECT last_seq FROM floor_moved) + row_number() OVER (ORDER BY s.xid, s.call) AS seq,
			       s.subject, s.hdr, s.data
			FROM floor_staged s
			WHERE (s.xid, s.call) > (SELECT moved_xid, moved_call FROM floor_moved)
			  AND s.xid < pg_snapshot_xmin(pg_current_snapshot())
			ORDER BY s.xid, s.call
			LIMIT ` + strconv.Itoa(testMaxMsgs) + `
		), w AS (
			INSERT INTO floor_chunk (seq, ts, subject, hdr, data, cum_before) SELECT seq, $1, subject, hdr, data, 0 FROM m
		)
		UPDATE floor_moved f SET moved_xid = l.xid, moved_call = l.call, last_seq = l.seq
		FROM (SELECT xid, call, seq FROM m ORDER BY seq DESC LIMIT 1) l
		RETURNING f.last_seq`
	done := make(chan time.Time, 1)
	go func() {
		defer close(done)
		var last int64
		for last < int64(b.N) && !b.Failed() {
			rows, err := raw.Query(ctx, move, time.Now().UnixNano())
			if err != nil {
				b.Error(err)
				return
			}
			before := last
			for rows.Next() {
				if err := rows.Scan(&last); err != nil {
					rows.Close()
					b.Error(err)
					return
				}
			}
			if err := rows.Err(); err != nil {
				b.Error(err)
				return
			}
			if last-before == testMaxMsgs || last >= int64(b.N) {
				continue
			}
			// Caught up with what the horizon lets through. A commit wakes it; the timer is for
			// a transaction outside the benchmark holding the horizon back, whose end nothing
			// signals.
			select {
			case <-woken:
			case <-time.After(10 * time.Millisecond):
			}
		}
		switch {
		case last > int64(b.N):
			// More than the run committed: the progress let earlier rows through again.
			b.Errorf("floormove moved %d messages of %d", last, b.N)
		case last == int64(b.N):
			done <- time.Now()
		}
	}()
	return done
}
