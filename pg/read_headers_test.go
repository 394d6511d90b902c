package pg_test

import (
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// ReadHeaders reads the live messages of a range over several chunks without their data,
// skipping deleted ones and those below the first sequence, and looks through no more
// sequences than MaxMsgs at a time.
func TestReadHeaders(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Open(t)
	st, err := db.CreateStream(ctx, "H", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		m := pg.AppendMsg{Subject: "h.x", Header: []byte("NATS/1.0\r\nN: v\r\n\r\n"), Data: []byte("data")}
		bt := pg.AppendBatch{StreamID: st.ID, ChunkRows: 3, Msgs: []pg.AppendMsg{m}}
		if _, _, err := db.Append(ctx, []pg.AppendBatch{bt}, time.Now().UnixNano()); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.DeleteMessage(ctx, st.ID, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Purge(ctx, st.ID, pg.PurgeParams{UpTo: 3}); err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for from := uint64(1); from <= 10; {
		msgs, through, err := db.ReadHeaders(ctx, pg.ReadParams{StreamID: st.ID, From: from, UpTo: 10, MaxMsgs: 4})
		if err != nil {
			t.Fatal(err)
		}
		if want := min(from+3, 10); through != want {
			t.Fatalf("from %d: looked through %d, want %d", from, through, want)
		}
		for _, m := range msgs {
			if m.Data != nil || string(m.Header) != "NATS/1.0\r\nN: v\r\n\r\n" || m.Subject != "h.x" || m.TS == 0 {
				t.Fatalf("message %d read as %+v", m.Seq, m)
			}
			seqs = append(seqs, m.Seq)
		}
		from = through + 1
	}
	want := []uint64{3, 4, 6, 7, 8, 9, 10}
	if len(seqs) != len(want) {
		t.Fatalf("read %v, want %v", seqs, want)
	}
	for i := range want {
		if seqs[i] != want[i] {
			t.Fatalf("read %v, want %v", seqs, want)
		}
	}
}
