package pg_test

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// liveSeqs reads the sequences a stream still holds, through its state and its rows.
func liveSeqs(ctx context.Context, t *testing.T, db *pg.DB, id int64) []uint64 {
	t.Helper()
	st, err := db.State(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for seq := st.FirstSeq; seq <= st.LastSeq; seq++ {
		m, err := db.GetMessage(ctx, id, seq)
		if err != nil {
			continue
		}
		out = append(out, m.Seq)
	}
	if uint64(len(out)) != st.Msgs {
		t.Fatalf("state counts %d messages, rows hold %v", st.Msgs, out)
	}
	return out
}

// TestExpireTTLs: a message goes when its TTL passes, whether or not max_age would keep
// it; max_age takes what has no TTL and what has a longer one, and never what has "never".
func TestExpireTTLs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgtest.Open(t)
	st, err := db.CreateStream(ctx, "T", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	msgs := []pg.AppendMsg{
		{Subject: "t.a", TTL: 2},            // 1: TTL before max_age
		{Subject: "t.b"},                    // 2: max_age only
		{Subject: "t.c", TTL: pg.TTLNever},  // 3: never
		{Subject: "t.d", TTL: 60},           // 4: max_age first
		{Subject: "t.e", TTL: 2, Rollup: 0}, // 5: TTL before max_age
	}
	if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, ChunkRows: 2, Msgs: msgs}}, t0.UnixNano()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, ChunkRows: 2, Msgs: []pg.AppendMsg{{Subject: "t.f"}}}}, t0.Add(5*time.Second).UnixNano()); err != nil {
		t.Fatal(err)
	}
	maxAge := 4 * time.Second
	res, err := db.Expire(ctx, pg.ExpireParams{StreamID: st.ID, Now: t0.Add(time.Second).UnixNano(), MaxAge: maxAge, Limit: 100})
	if err != nil || res.Removed != 0 {
		t.Fatalf("before any TTL: %+v %v", res, err)
	}
	res, err = db.Expire(ctx, pg.ExpireParams{StreamID: st.ID, Now: t0.Add(3 * time.Second).UnixNano(), MaxAge: maxAge, Limit: 100})
	if err != nil || res.Removed != 2 {
		t.Fatalf("after 3s: %+v %v", res, err)
	}
	if got := liveSeqs(ctx, t, db, st.ID); !slices.Equal(got, []uint64{2, 3, 4, 6}) {
		t.Fatalf("after 3s the stream holds %v", got)
	}
	res, err = db.Expire(ctx, pg.ExpireParams{StreamID: st.ID, Now: t0.Add(6 * time.Second).UnixNano(), MaxAge: maxAge, Limit: 100})
	if err != nil || res.Removed != 2 {
		t.Fatalf("after 6s: %+v %v", res, err)
	}
	if got := liveSeqs(ctx, t, db, st.ID); !slices.Equal(got, []uint64{3, 6}) {
		t.Fatalf("after 6s the stream holds %v", got)
	}
	res, err = db.Expire(ctx, pg.ExpireParams{StreamID: st.ID, Now: t0.Add(time.Hour).UnixNano(), MaxAge: maxAge, Limit: 100})
	if err != nil || res.Removed != 1 {
		t.Fatalf("after an hour: %+v %v", res, err)
	}
	if got := liveSeqs(ctx, t, db, st.ID); !slices.Equal(got, []uint64{3}) {
		t.Fatalf("after an hour the stream holds %v", got)
	}
}

// TestExpireMarkers: with markers, the last message of a subject that expires stays for
// the caller's marker to roll up, unless it is a marker itself; older ones go.
func TestExpireMarkers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgtest.Open(t)
	st, err := db.CreateStream(ctx, "M", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	marker := []byte("NATS/1.0\r\nNats-Marker-Reason: MaxAge\r\n\r\n")
	t0 := time.Now()
	msgs := []pg.AppendMsg{
		{Subject: "m.a", TTL: 2},                 // 1: last of m.a: marked
		{Subject: "m.b", TTL: 2},                 // 2: m.b has a later message: goes
		{Subject: "m.b"},                         // 3
		{Subject: "m.c", TTL: 2, Header: marker}, // 4: a marker: goes
		{Subject: "m.d", TTL: 2},                 // 5: last of m.d, but
		{Subject: "m.d", TTL: 2},                 // 6: this is: marked
	}
	if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: msgs}}, t0.UnixNano()); err != nil {
		t.Fatal(err)
	}
	isMarker := func(hdr []byte) bool { return bytes.Contains(hdr, []byte("Nats-Marker-Reason")) }
	res, err := db.Expire(ctx, pg.ExpireParams{StreamID: st.ID, Now: t0.Add(3 * time.Second).UnixNano(), IsMarker: isMarker, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var marked []uint64
	for _, m := range res.Markers {
		marked = append(marked, m.Seq)
	}
	if res.Removed != 3 || !slices.Equal(marked, []uint64{1, 6}) {
		t.Fatalf("removed %d, markers for %v", res.Removed, marked)
	}
	if got := liveSeqs(ctx, t, db, st.ID); !slices.Equal(got, []uint64{1, 3, 6}) {
		t.Fatalf("the stream holds %v", got)
	}
	// The marker rolls its subject up; the next pass finds nothing more to do there.
	last := uint64(6)
	if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: []pg.AppendMsg{
		{Subject: "m.a", Header: marker, TTL: 5, Rollup: pg.RollupSubject, ExpectLastSubjSeq: &[]uint64{1}[0]},
		{Subject: "m.d", Header: marker, TTL: 5, Rollup: pg.RollupSubject, ExpectLastSubjSeq: &last},
	}}}, t0.Add(3*time.Second).UnixNano()); err != nil {
		t.Fatal(err)
	}
	res, err = db.Expire(ctx, pg.ExpireParams{StreamID: st.ID, Now: t0.Add(4 * time.Second).UnixNano(), IsMarker: isMarker, Limit: 100})
	if err != nil || res.Removed != 0 || len(res.Markers) != 0 {
		t.Fatalf("after the markers: %+v %v", res, err)
	}
	if got := liveSeqs(ctx, t, db, st.ID); !slices.Equal(got, []uint64{3, 7, 8}) {
		t.Fatalf("after the markers the stream holds %v", got)
	}
	// The markers' own TTLs take them without a marker in their place.
	res, err = db.Expire(ctx, pg.ExpireParams{StreamID: st.ID, Now: t0.Add(9 * time.Second).UnixNano(), IsMarker: isMarker, Limit: 100})
	if err != nil || res.Removed != 2 || len(res.Markers) != 0 {
		t.Fatalf("after the markers' TTL: %+v %v", res, err)
	}
	if got := liveSeqs(ctx, t, db, st.ID); !slices.Equal(got, []uint64{3}) {
		t.Fatalf("after the markers' TTL the stream holds %v", got)
	}
}
