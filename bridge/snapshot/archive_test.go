package snapshot_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/snapshot"
	"github.com/jetgres/jetgres/internal/jsarchive"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// A stream written to an archive by WriteArchive and loaded back by Load into another
// stream holds the same messages, sequences, times and deletes, through a pipe that holds
// no more than what is in flight.
func TestWriteArchiveLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := pg.Open(ctx, pg.Config{URL: pgtest.NewDB(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 20_000
	src, err := db.CreateStream(ctx, "SRC", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	var batch []pg.Message
	for seq := uint64(1); seq <= n; seq++ {
		if seq%11 == 3 {
			continue
		}
		m := pg.Message{Seq: seq, TS: int64(seq) * 1_000_000, Subject: fmt.Sprint("s.", seq%7), Data: fmt.Appendf(nil, "payload %d", seq)}
		if seq%4 == 0 {
			m.Header = []byte("NATS/1.0\r\nX: 1\r\n\r\n")
		}
		batch = append(batch, m)
	}
	if err := db.RestoreMessages(ctx, pg.RestoreParams{StreamID: src.ID, Msgs: batch, Through: n + 5, ChunkRows: 4096}); err != nil {
		t.Fatal(err)
	}
	st, err := db.State(ctx, src.ID)
	if err != nil {
		t.Fatal(err)
	}
	state := server.StreamState{Msgs: st.Msgs, Bytes: st.Bytes, FirstSeq: st.FirstSeq, LastSeq: st.LastSeq, NumDeleted: int(st.Deleted)}
	cons := []jsarchive.ArchivedConsumer{{ConsumerConfig: &server.ConsumerConfig{Durable: "D", Name: "D"},
		ConsumerState: &server.ConsumerState{AckFloor: server.SequencePair{Consumer: 9, Stream: 10}}}}

	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(snapshot.WriteArchive(ctx, pw, db, src.ID, state, cons, time.Unix(0, 7)))
	}()
	ar := jsarchive.NewReader(pr)
	got, err := ar.State()
	if err != nil {
		t.Fatal(err)
	}
	if got.LastSeq != n+5 || got.Msgs != st.Msgs || got.Consumers != 1 {
		t.Fatalf("archive state %+v, stream %+v", got, st)
	}
	if c, err := ar.Consumers(); err != nil || len(c) != 1 || c[0].AckFloor.Stream != 10 {
		t.Fatalf("consumers %+v, %v", c, err)
	}
	dst, err := db.CreateStreamFrom(ctx, "DST", []byte(`{}`), got.FirstSeq)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stored, err := snapshot.Load(ctx, ar, db, snapshot.LoadParams{StreamID: dst.ID, Through: got.LastSeq})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("loaded %d messages in %v", stored, time.Since(start))
	if stored != st.Msgs {
		t.Fatalf("stored %d, want %d", stored, st.Msgs)
	}
	dstate, err := db.State(ctx, dst.ID)
	if err != nil {
		t.Fatal(err)
	}
	// Purged says only how a stream with no message yet reports its first sequence.
	if dstate.Purged = st.Purged; dstate != st {
		t.Fatalf("restored state %+v, original %+v", dstate, st)
	}
	for from := uint64(1); from <= n; {
		a, through, _, err := db.ReadFiltered(ctx, pg.ReadParams{StreamID: src.ID, From: from, UpTo: n, MaxMsgs: 1000}, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _, _, err := db.ReadFiltered(ctx, pg.ReadParams{StreamID: dst.ID, From: from, UpTo: n, MaxMsgs: 1000}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(a) != len(b) {
			t.Fatalf("from %d: %d messages, restored %d", from, len(a), len(b))
		}
		for i := range a {
			if a[i].Seq != b[i].Seq || a[i].TS != b[i].TS || a[i].Subject != b[i].Subject || !bytes.Equal(a[i].Header, b[i].Header) || !bytes.Equal(a[i].Data, b[i].Data) {
				t.Fatalf("message %d differs: %+v, restored %+v", a[i].Seq, a[i], b[i])
			}
		}
		from = through + 1
	}
}
