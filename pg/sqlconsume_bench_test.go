package pg_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// BenchmarkSQLConsume measures one consuming transaction per op, batch messages each, on
// one PostgreSQL: jetgres.next + jetgres.ack_through + commit; a hand-written cursor queue
// (the cursor row locked, the rows after it read, the cursor updated); and a queue table
// taken with FOR UPDATE SKIP LOCKED and DELETE. Messages are 100-byte payloads, loaded
// before the timer starts. Run with a fixed count: -benchtime=50x.
func BenchmarkSQLConsume(b *testing.B) {
	for _, batch := range []int{100, 1000} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			url := pgtest.NewDB(b)
			db := pgtest.OpenAt(b, url)
			raw := rawsql.Open(b, url+" pool_max_conns=2")
			ctx := context.Background()
			b.Run("jetgres", func(b *testing.B) { benchJetgresNext(b, ctx, db, raw, batch) })
			b.Run("cursor", func(b *testing.B) { benchCursorQueue(b, ctx, raw, batch) })
			b.Run("skiplocked", func(b *testing.B) { benchSkipLocked(b, ctx, raw, batch) })
		})
	}
}

func benchJetgresNext(b *testing.B, ctx context.Context, db *pg.DB, raw *rawsql.Pool, batch int) {
	name := fmt.Sprintf("B%d", benchRuns.Add(1))
	st, err := db.CreateStream(ctx, name, []byte(fmt.Sprintf(`{"name":%q,"subjects":["%s.>"]}`, name, name)))
	if err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 100)
	for left := b.N * batch; left > 0; left -= 1000 {
		msgs := make([]pg.AppendMsg, min(left, 1000))
		for i := range msgs {
			msgs[i] = pg.AppendMsg{Subject: name + ".orders.new", Data: payload}
		}
		if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: msgs}}, time.Now().UnixNano()); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := db.CreateConsumer(ctx, pg.Consumer{StreamID: st.ID, Name: "C", Config: []byte(`{"ack_policy":"explicit"}`)}, 0); err != nil {
		b.Fatal(err)
	}
	if err := raw.Exec(ctx, `SELECT jetgres.read_in_sql($1, 'C')`, name); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		err := raw.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error {
			last, err := drain(ctx, q, batch, `SELECT seq, subject, data FROM jetgres.next($1, 'C', $2)`, name, batch)
			if err != nil {
				return err
			}
			return q.Exec(ctx, `SELECT jetgres.ack_through($1, 'C', $2)`, name, last)
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "msgs/s")
}

func benchCursorQueue(b *testing.B, ctx context.Context, raw *rawsql.Pool, batch int) {
	tab := fmt.Sprintf("cursorq_%d", benchRuns.Add(1))
	for _, stmt := range []string{
		`CREATE TABLE ` + tab + ` (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, subject text NOT NULL, data bytea NOT NULL)`,
		`CREATE TABLE ` + tab + `_cursor (one boolean PRIMARY KEY, pos bigint NOT NULL) WITH (fillfactor = 50)`,
		`INSERT INTO ` + tab + `_cursor VALUES (true, 0)`,
		fmt.Sprintf(`INSERT INTO %s (subject, data) SELECT 'orders.new', decode(repeat('00', 100), 'hex') FROM generate_series(1, %d)`, tab, b.N*batch),
		`VACUUM ANALYZE ` + tab,
	} {
		if err := raw.Exec(ctx, stmt); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		err := raw.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error {
			var pos int64
			if err := q.QueryRow(ctx, `SELECT pos FROM `+tab+`_cursor FOR UPDATE`).Scan(&pos); err != nil {
				return err
			}
			last, err := drain(ctx, q, batch, `SELECT id, subject, data FROM `+tab+` WHERE id > $1 ORDER BY id LIMIT $2`, pos, batch)
			if err != nil {
				return err
			}
			return q.Exec(ctx, `UPDATE `+tab+`_cursor SET pos = $1`, last)
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "msgs/s")
}

func benchSkipLocked(b *testing.B, ctx context.Context, raw *rawsql.Pool, batch int) {
	tab := fmt.Sprintf("skipq_%d", benchRuns.Add(1))
	for _, stmt := range []string{
		`CREATE TABLE ` + tab + ` (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, subject text NOT NULL, data bytea NOT NULL)`,
		fmt.Sprintf(`INSERT INTO %s (subject, data) SELECT 'orders.new', decode(repeat('00', 100), 'hex') FROM generate_series(1, %d)`, tab, b.N*batch),
		`VACUUM ANALYZE ` + tab,
	} {
		if err := raw.Exec(ctx, stmt); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		err := raw.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error {
			_, err := drain(ctx, q, batch, `DELETE FROM `+tab+` WHERE id IN (
				SELECT id FROM `+tab+` ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING id, subject, data`, batch)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "msgs/s")
}

// benchRuns names each run's stream or tables apart: -count repeats a b.N.
var benchRuns atomic.Int64

// drain reads a query's (id, subject, data) rows, which must be want, and returns the
// highest id.
func drain(ctx context.Context, q rawsql.Runner, want int, sql string, args ...any) (int64, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var last int64
	var subject string
	var data []byte
	n := 0
	for rows.Next() {
		if err := rows.Scan(&last, &subject, &data); err != nil {
			return 0, err
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if n != want {
		return 0, fmt.Errorf("read %d rows, want %d", n, want)
	}
	return last, nil
}
