package bridge

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/jsonrecords"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// A stream's compression is reported in stream info as nats-server reports it, after its
// creation and after updates that change it; publishes compare along the way. The chunk
// table jetgres opens for the stream follows the setting (pg's tests check what that
// stores).
func TestCompressionConfigMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	raw := rawsql.Open(t, tw.tb.dbURL)
	gen := jsonrecords.New(11)
	compression := func(stream string, want jetstream.StoreCompression) {
		t.Helper()
		for side, js := range tw.js {
			s, err := js.Stream(tw.ctx, stream)
			if err != nil {
				t.Fatalf("%s: stream info: %v", sideName[side], err)
			}
			if got := s.CachedInfo().Config.Compression; got != want {
				t.Errorf("%s: stream %s reports compression %v, want %v", sideName[side], stream, got, want)
			}
		}
	}
	chunkMethod := func(stream string) string {
		t.Helper()
		var method string
		if err := raw.QueryRow(tw.ctx, `SELECT a.attcompression::text FROM jetgres.streams s
				JOIN jetgres.stream_state st ON st.stream_id = s.id
				JOIN pg_attribute a ON a.attrelid = format('jetgres.msgs_%s_%s', s.id, st.chunk)::regclass AND a.attname = 'data'
			WHERE s.name = $1`, stream).Scan(&method); err != nil {
			t.Fatal(err)
		}
		return method
	}

	tw.createStream(jetstream.StreamConfig{Name: "PLAIN", Subjects: []string{"plain"}})
	compression("PLAIN", jetstream.NoCompression)
	cfg := jetstream.StreamConfig{Name: "CZ", Subjects: []string{"cz"}, Compression: jetstream.S2Compression}
	tw.createStream(cfg)
	compression("CZ", jetstream.S2Compression)
	if m := chunkMethod("CZ"); m != "p" {
		t.Errorf("s2 stream's chunk compresses with %q, want pglz (p)", m)
	}
	if m := chunkMethod("PLAIN"); m != "" {
		t.Errorf("plain stream's chunk compresses with %q, want the server's default", m)
	}
	tw.pub("cz", gen.Record(4096))

	cfg.Compression = jetstream.NoCompression
	tw.updateStream(cfg)
	compression("CZ", jetstream.NoCompression)
	tw.pub("cz", gen.Record(4096))

	cfg.Compression = jetstream.S2Compression
	tw.updateStream(cfg)
	compression("CZ", jetstream.S2Compression)
	tw.pub("cz", gen.Record(1024))
	tw.want("CZ", 3, 1, 3, 0)
}

// Publishes, fetches and gets of a stream with compression s2 see the payloads as they were
// published, small ones that PostgreSQL stores as they are and large ones it compresses.
func TestCompressedStreamPublishFetchGet(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	js := tb.js
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "JSON", Subjects: []string{"json.>"}, Compression: jetstream.S2Compression}); err != nil {
		t.Fatal(err)
	}
	gen := jsonrecords.New(5)
	sizes := []int{300, 1024, 4096, 16384, 100_000}
	const n = 100
	payloads := make([][]byte, n)
	futures := make([]jetstream.PubAckFuture, n)
	for i := range payloads {
		payloads[i] = gen.Record(sizes[i%len(sizes)])
		f, err := js.PublishAsync(fmt.Sprintf("json.%d", i%len(sizes)), payloads[i])
		if err != nil {
			t.Fatal(err)
		}
		futures[i] = f
	}
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			if ack.Sequence != uint64(i+1) {
				t.Fatalf("publish %d acknowledged as sequence %d", i, ack.Sequence)
			}
		case err := <-f.Err():
			t.Fatalf("publish %d: %v", i, err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}

	cons, err := js.CreateConsumer(ctx, "JSON", jetstream.ConsumerConfig{Durable: "all", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	deadline := time.Now().Add(time.Minute)
	for got < n {
		if time.Now().After(deadline) {
			t.Fatalf("fetched %d messages of %d in a minute", got, n)
		}
		batch, err := cons.Fetch(n-got, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			seq := md.Sequence.Stream
			if seq < 1 || seq > n || !bytes.Equal(m.Data(), payloads[seq-1]) {
				t.Fatalf("fetched message %d changed (%d bytes)", seq, len(m.Data()))
			}
			if err := m.Ack(); err != nil {
				t.Fatal(err)
			}
			got++
		}
		if err := batch.Error(); err != nil {
			t.Fatal(err)
		}
	}

	s, err := js.Stream(ctx, "JSON")
	if err != nil {
		t.Fatal(err)
	}
	for _, seq := range []uint64{1, 3, 4, 5, n} {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(m.Data, payloads[seq-1]) {
			t.Fatalf("get of message %d: %d bytes, changed", seq, len(m.Data))
		}
	}
	for i := range sizes {
		subj := fmt.Sprintf("json.%d", i)
		m, err := s.GetLastMsgForSubject(ctx, subj)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(m.Data, payloads[m.Sequence-1]) || m.Sequence != uint64(n-len(sizes)+i+1) {
			t.Fatalf("last message of %s: sequence %d, %d bytes, changed", subj, m.Sequence, len(m.Data))
		}
	}
}
