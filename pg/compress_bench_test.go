package pg_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/jsonrecords"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// BenchmarkCompressionSettings stores the same JSON records (internal/jsonrecords),
// JETGRES_COMPRESS_MSGS of each size (2,000 by default), in tables shaped as chunk tables
// (pg.ChunkShapeDDL) with each of the storage settings a stream with compression s2 could
// ask PostgreSQL for, and logs the table BENCHMARKS.md's "Compression" section shows: bytes
// on disk per message (pg_total_relation_size: the table, its indexes and its TOAST table)
// and how many payloads PostgreSQL compressed.
func BenchmarkCompressionSettings(b *testing.B) {
	n := 2000
	if v := os.Getenv("JETGRES_COMPRESS_MSGS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 {
			b.Fatalf("JETGRES_COMPRESS_MSGS=%q: want a positive number", v)
		}
	}
	sizes := []int{1024, 2048, 4096, 16384}
	settings := []struct{ name, ddl string }{
		{"server default (pglz), as compression none", ``},
		{"COMPRESSION pglz, as compression s2", `ALTER TABLE %s ALTER COLUMN data SET COMPRESSION pglz`},
		{"COMPRESSION lz4", `ALTER TABLE %s ALTER COLUMN data SET COMPRESSION lz4`},
		{"lz4, toast_tuple_target 128", `ALTER TABLE %s ALTER COLUMN data SET COMPRESSION lz4, SET (toast_tuple_target = 128)`},
		{"lz4, STORAGE MAIN, toast_tuple_target 128", `ALTER TABLE %s ALTER COLUMN data SET COMPRESSION lz4, ALTER COLUMN data SET STORAGE MAIN, SET (toast_tuple_target = 128)`},
		{"pglz, STORAGE MAIN, toast_tuple_target 128", `ALTER TABLE %s ALTER COLUMN data SET COMPRESSION pglz, ALTER COLUMN data SET STORAGE MAIN, SET (toast_tuple_target = 128)`},
	}
	for b.Loop() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		raw := rawsql.Open(b, pgtest.NewDB(b))
		head := "| storage of the data column |"
		for _, size := range sizes {
			head += fmt.Sprintf(" %d B JSON |", size)
		}
		rows := []string{head, "|---|" + strings.Repeat("---:|", len(sizes))}
		for i, s := range settings {
			row := "| " + s.name + " |"
			for _, size := range sizes {
				t := fmt.Sprintf("public.shape_%d_%d", i, size)
				ddls := pg.ChunkShapeDDL(t)
				if s.ddl != "" {
					ddls = append(ddls, fmt.Sprintf(s.ddl, t))
				}
				for _, ddl := range ddls {
					if err := raw.Exec(ctx, ddl); err != nil {
						b.Fatal(err)
					}
				}
				gen := jsonrecords.New(uint64(size))
				for first := 0; first < n; first += 500 {
					data := make([][]byte, min(500, n-first))
					for j := range data {
						data[j] = gen.Record(size)
					}
					if err := raw.Exec(ctx, `INSERT INTO `+t+` (seq, ts, subject, data, cum_before)
						SELECT $1::bigint + u.i, 0, 'orders.created', u.d, 0 FROM unnest($2::bytea[]) WITH ORDINALITY AS u(d, i)`,
						first, data); err != nil {
						b.Fatal(err)
					}
				}
				var bytes float64
				var compressed int
				if err := raw.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass)::float8 / count(*),
						count(*) FILTER (WHERE pg_column_compression(data) IS NOT NULL)
					FROM `+t, t).Scan(&bytes, &compressed); err != nil {
					b.Fatal(err)
				}
				row += fmt.Sprintf(" %.0f (%d%% compressed) |", bytes, compressed*100/n)
			}
			rows = append(rows, row)
		}
		cancel()
		b.Logf("%d messages of each size, bytes on disk per message:\n%s", n, strings.Join(rows, "\n"))
	}
}
