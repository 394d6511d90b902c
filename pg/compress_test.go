package pg_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/jsonrecords"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// chunkCompression is the compression method a chunk table's data column asks for: "p" for
// pglz, "l" for lz4, "" for the server's default_toast_compression.
func chunkCompression(t *testing.T, raw *rawsql.Pool, streamID, chunk int64) string {
	t.Helper()
	var method string
	if err := raw.QueryRow(context.Background(), `SELECT a.attcompression::text FROM pg_attribute a
		WHERE a.attrelid = format('jetgres.msgs_%s_%s', $1::bigint, $2::bigint)::regclass AND a.attname = 'data'`,
		streamID, chunk).Scan(&method); err != nil {
		t.Fatalf("chunk %d of stream %d: %v", chunk, streamID, err)
	}
	return method
}

// A stream with compression s2 has its chunks store payloads with pglz, whatever the
// database's default_toast_compression (lz4 here): its compressible payloads take less room
// than a stream's without compression, and read back as they were published, through pg and
// through jetgres.messages. A stream update changes the chunks opened after it and leaves
// the chunks it has as they are.
func TestS2StreamChunksCompressWithPglz(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := pgtest.NewDB(t)
	raw := rawsql.Open(t, url)
	if err := raw.Exec(ctx, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_toast_compression = lz4', current_database()); END $$`); err != nil {
		t.Fatal(err)
	}
	db := pgtest.OpenAt(t, url)
	s2, err := db.CreateStream(ctx, "S2", []byte(`{"name":"S2","subjects":["s2"],"compression":"s2"}`))
	if err != nil {
		t.Fatal(err)
	}
	none, err := db.CreateStream(ctx, "NONE", []byte(`{"name":"NONE","subjects":["none"],"compression":"none"}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := chunkCompression(t, raw, s2.ID, 0); got != "p" {
		t.Errorf("s2 stream's chunk compresses with %q, want pglz (p)", got)
	}
	if got := chunkCompression(t, raw, none.ID, 0); got != "" {
		t.Errorf("stream without compression: chunk compresses with %q, want the default", got)
	}

	const n, size = 300, 4096
	gen := jsonrecords.New(7)
	payloads := make([][]byte, n)
	for i := range payloads {
		payloads[i] = gen.Record(size)
	}
	for _, st := range []pg.StreamRow{s2, none} {
		msgs := make([]pg.AppendMsg, n)
		for i := range msgs {
			msgs[i] = pg.AppendMsg{Subject: "x", Data: payloads[i]}
		}
		if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: msgs}}, time.Now().UnixNano()); err != nil {
			t.Fatal(err)
		}
	}
	var methods [2]string
	var bytesPer [2]float64
	for i, st := range []pg.StreamRow{s2, none} {
		if err := raw.QueryRow(ctx, `SELECT string_agg(DISTINCT pg_column_compression(data), ','),
				pg_total_relation_size(format('jetgres.msgs_%s_0', $1::bigint)::regclass)::float8 / count(*)
			FROM jetgres.msgs WHERE stream_id = $1`, st.ID).Scan(&methods[i], &bytesPer[i]); err != nil {
			t.Fatal(err)
		}
	}
	if methods != [2]string{"pglz", "lz4"} {
		t.Errorf("payloads compressed with %v, want pglz for the s2 stream and lz4 for the other", methods)
	}
	if bytesPer[0] > 0.9*bytesPer[1] {
		t.Errorf("s2 stream takes %.0f bytes a message, the other %.0f: want at most 90%%", bytesPer[0], bytesPer[1])
	}
	if bytesPer[0] > 0.6*size {
		t.Errorf("s2 stream takes %.0f bytes a message of %d bytes of JSON: want at most 60%%", bytesPer[0], size)
	}
	t.Logf("%d-byte JSON payloads: %.0f bytes a message with s2 (pglz), %.0f without (lz4)", size, bytesPer[0], bytesPer[1])

	for _, seq := range []uint64{1, n / 2, n} {
		m, err := db.GetMessage(ctx, s2.ID, seq)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(m.Data, payloads[seq-1]) {
			t.Fatalf("message %d reads back changed", seq)
		}
	}
	rows, err := raw.Query(ctx, `SELECT seq, data FROM jetgres.messages('S2')`)
	if err != nil {
		t.Fatal(err)
	}
	read := 0
	for rows.Next() {
		var seq int64
		var data []byte
		if err := rows.Scan(&seq, &data); err != nil {
			t.Fatal(err)
		}
		if seq < 1 || seq > n || !bytes.Equal(data, payloads[seq-1]) {
			t.Fatalf("jetgres.messages('S2') returned message %d changed", seq)
		}
		read++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if read != n {
		t.Fatalf("jetgres.messages('S2') returned %d messages, want %d", read, n)
	}

	// Updates: each stream's next chunk follows its new setting, its first keeps the old.
	if err := db.UpdateStreamConfig(ctx, s2.ID, []byte(`{"name":"S2","subjects":["s2"],"compression":"none"}`)); err != nil {
		t.Fatal(err)
	}
	if err := db.UpdateStreamConfig(ctx, none.ID, []byte(`{"name":"NONE","subjects":["none"],"compression":"s2"}`)); err != nil {
		t.Fatal(err)
	}
	for _, st := range []pg.StreamRow{s2, none} {
		// A chunk size the first chunk already holds makes this append open the next.
		msgs := []pg.AppendMsg{{Subject: "x", Data: payloads[0]}}
		if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: msgs, ChunkRows: n}}, time.Now().UnixNano()); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		st           pg.StreamRow
		chunk        int64
		want, stored string
	}{
		{s2, 0, "p", "pglz"}, {s2, 1, "", "lz4"}, {none, 0, "", "lz4"}, {none, 1, "p", "pglz"},
	} {
		if got := chunkCompression(t, raw, c.st.ID, c.chunk); got != c.want {
			t.Errorf("stream %s chunk %d compresses with %q after the update, want %q", c.st.Name, c.chunk, got, c.want)
		}
		var stored string
		if err := raw.QueryRow(ctx, `SELECT string_agg(DISTINCT pg_column_compression(data), ',') FROM jetgres.msgs
			WHERE stream_id = $1 AND chunk = $2`, c.st.ID, c.chunk).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if stored != c.stored {
			t.Errorf("stream %s chunk %d holds payloads compressed with %s, want %s", c.st.Name, c.chunk, stored, c.stored)
		}
	}
}
