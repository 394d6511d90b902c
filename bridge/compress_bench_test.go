package bridge

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/jsonrecords"
	"github.com/jetgres/jetgres/internal/jstwin"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// compressCase is one store of one run of BenchmarkCompressionBytes.
type compressCase struct {
	side        int
	compression jetstream.StoreCompression
}

// compressResult is what one case measured.
type compressResult struct {
	took time.Duration
	// disk is the stream's bytes on disk: for jetgres its chunk tables with their indexes
	// and TOAST tables (pg_total_relation_size), for JetStream its directory in the file
	// store (message blocks, their indexes and the stream's metadata).
	disk int64
	// state is the stream info's state bytes, as each side counts them.
	state uint64
	// compressed is, for jetgres, how many rows hold their payload compressed.
	compressed int64
}

// BenchmarkCompressionBytes publishes the same JSON records (internal/jsonrecords, of
// JETGRES_COMPRESS_SIZES bytes, 1024 by default), JETGRES_COMPRESS_MSGS of them (100,000),
// asynchronously with at most 1,000 unacknowledged, into four streams in turn, each fresh:
// jetgres's and a JetStream file store's (an embedded nats-server in a temporary
// directory), each with compression none and s2. It logs, per stream, bytes on disk per
// message and publishes per second, and the table BENCHMARKS.md's "Compression" section
// shows; JETGRES_COMPRESS_ROUNDS repeats the cases in turn, for publish rates on a machine
// whose load changes.
func BenchmarkCompressionBytes(b *testing.B) {
	n := envCount(b, "JETGRES_COMPRESS_MSGS", 100_000)
	rounds := envCount(b, "JETGRES_COMPRESS_ROUNDS", 1)
	sizes := []int{1024}
	if v := os.Getenv("JETGRES_COMPRESS_SIZES"); v != "" {
		sizes = sizes[:0]
		for f := range strings.SplitSeq(v, ",") {
			size, err := strconv.Atoi(f)
			if err != nil || size <= 0 {
				b.Fatalf("JETGRES_COMPRESS_SIZES=%q: want positive numbers", v)
			}
			sizes = append(sizes, size)
		}
	}
	cases := []compressCase{{ours, jetstream.NoCompression}, {ours, jetstream.S2Compression},
		{theirs, jetstream.NoCompression}, {theirs, jetstream.S2Compression}}
	for b.Loop() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		tb := setup(b)
		storeDir := b.TempDir()
		srv, err := jstwin.Start(jstwin.Config{StoreDir: storeDir})
		if err != nil {
			b.Fatal(err)
		}
		nc, err := nats.Connect(srv.ClientURL())
		if err != nil {
			b.Fatal(err)
		}
		conns := [2]*nats.Conn{tb.nc, nc}
		raw := rawsql.Open(b, tb.dbURL)
		var table []string
		for _, size := range sizes {
			results := make([][]compressResult, len(cases))
			for round := range rounds {
				for i, c := range cases {
					name := fmt.Sprintf("C%d_%d_%s", size, round, c.compression)
					r := benchCompressCase(b, ctx, conns[c.side], c, name, size, n)
					if c.side == ours {
						r.disk, r.compressed = jetgresStreamBytes(b, ctx, raw, name)
					} else {
						r.disk = storeBytes(b, filepath.Join(storeDir, "jetstream", "$G", "streams", name))
					}
					results[i] = append(results[i], r)
					b.Logf("%d B JSON, %s, %s, round %d: %d messages in %v, %.0f msgs/s; %.0f B a message on disk, state %.0f B a message, %d payloads compressed",
						size, sideName[c.side], c.compression, round, n, r.took.Round(time.Millisecond), float64(n)/r.took.Seconds(),
						float64(r.disk)/float64(n), float64(r.state)/float64(n), r.compressed)
				}
			}
			table = append(table, compressRows(size, n, cases, results)...)
		}
		nc.Close()
		srv.Stop()
		cancel()
		b.Logf("\n| payload | store | compression | bytes on disk per message | ratio to JetStream s2 | state bytes per message | publishes/s, median of %d | ratio to none on its side, median |\n|---|---|---|---:|---:|---:|---:|---:|\n%s",
			rounds, strings.Join(table, "\n"))
	}
}

// benchCompressCase creates stream name with c's compression on its side and publishes n
// records of size bytes into it.
func benchCompressCase(b *testing.B, ctx context.Context, nc *nats.Conn, c compressCase, name string, size, n int) compressResult {
	b.Helper()
	var mu sync.Mutex
	var failed error
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(1000),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
			mu.Lock()
			defer mu.Unlock()
			failed = err
		}))
	if err != nil {
		b.Fatal(err)
	}
	subject := strings.ToLower(name)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Compression: c.compression}); err != nil {
		b.Fatalf("%s: create stream: %v", sideName[c.side], err)
	}
	// Every case publishes the same records; making them is not timed.
	gen := jsonrecords.New(uint64(size))
	const batch = 1000
	records := make([][]byte, batch)
	var took time.Duration
	for sent := 0; sent < n; sent += batch {
		for i := range min(batch, n-sent) {
			records[i] = gen.Record(size)
		}
		start := time.Now()
		for i := range min(batch, n-sent) {
			if _, err := js.PublishAsync(subject, records[i], jetstream.WithStallWait(time.Minute)); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			b.Fatal("publishes not acknowledged in time")
		}
		took += time.Since(start)
	}
	mu.Lock()
	defer mu.Unlock()
	if failed != nil {
		b.Fatalf("%s: a publish failed: %v", sideName[c.side], failed)
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		b.Fatal(err)
	}
	st := s.CachedInfo().State
	if st.Msgs != uint64(n) {
		b.Fatalf("%s: stream %s holds %d messages, want %d", sideName[c.side], name, st.Msgs, n)
	}
	return compressResult{took: took, state: st.Bytes}
}

// jetgresStreamBytes is the size of a jetgres stream's chunk tables with their indexes and
// TOAST tables, and how many of its rows hold their payload compressed.
func jetgresStreamBytes(b *testing.B, ctx context.Context, raw *rawsql.Pool, name string) (size, compressed int64) {
	b.Helper()
	if err := raw.QueryRow(ctx, `SELECT
			(SELECT sum(pg_total_relation_size(format('jetgres.msgs_%s_%s', c.stream_id, c.chunk)::regclass))::bigint
				FROM jetgres.chunks c WHERE c.stream_id = s.id),
			(SELECT count(*) FROM jetgres.msgs m WHERE m.stream_id = s.id AND pg_column_compression(m.data) IS NOT NULL)
		FROM jetgres.streams s WHERE s.name = $1`, name).Scan(&size, &compressed); err != nil {
		b.Fatal(err)
	}
	return size, compressed
}

// storeBytes is the size of the files under dir once it has stopped changing: the file
// store writes its last block, and compresses full ones, behind the acknowledgements.
func storeBytes(b *testing.B, dir string) int64 {
	b.Helper()
	last := int64(-1)
	var size int64
	testwait.For(b, time.Minute, func() error {
		size = 0
		err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			size += info.Size()
			return nil
		})
		if err != nil {
			return err
		}
		if size != last {
			last = size
			return fmt.Errorf("%s still changing: %d bytes", dir, size)
		}
		return nil
	})
	return size
}

// compressRows are the table's rows for one payload size: bytes from the first round,
// publish rates as medians over the rounds.
func compressRows(size, n int, cases []compressCase, results [][]compressResult) []string {
	var jsS2 float64
	for i, c := range cases {
		if c.side == theirs && c.compression == jetstream.S2Compression {
			jsS2 = float64(results[i][0].disk) / float64(n)
		}
	}
	rate := func(i, round int) float64 { return float64(n) / results[i][round].took.Seconds() }
	var rows []string
	for i, c := range cases {
		r := results[i][0]
		perMsg := float64(r.disk) / float64(n)
		rates := make([]float64, len(results[i]))
		ratios := make([]float64, len(results[i]))
		for round := range results[i] {
			rates[round] = rate(i, round)
			// The case without compression on the same side, in the same round.
			ratios[round] = rates[round] / rate(i-i%2, round)
		}
		ratio := ""
		if c.compression == jetstream.S2Compression {
			ratio = fmt.Sprintf("%.2f", compressMedian(ratios))
		}
		rows = append(rows, fmt.Sprintf("| %d B JSON | %s | %s | %.0f | %.2f | %.0f | %.0f | %s |",
			size, sideName[c.side], c.compression, perMsg, perMsg/jsS2, float64(r.state)/float64(n), compressMedian(rates), ratio))
	}
	return rows
}

func compressMedian(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
