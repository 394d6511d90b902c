package gets

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/jetgres/jetgres/bridge/tailcache"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// counter reads one series of a labelled counter.
func counter(t testing.TB, v *prometheus.CounterVec, label string) float64 {
	t.Helper()
	var m dto.Metric
	if err := v.WithLabelValues(label).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// stored creates a stream in a fresh database and appends one message per subject, in
// order, one commit each; it returns the database, the stream's id and what was stored.
func stored(t *testing.T, subjects ...string) (*pg.DB, int64, []pg.Message) {
	t.Helper()
	ctx := t.Context()
	db := pgtest.Open(t)
	st, err := db.CreateStream(ctx, "G", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []pg.Message
	for _, subj := range subjects {
		res, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: []pg.AppendMsg{{Subject: subj, Data: []byte(subj)}}}}, time.Now().UnixNano())
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, res[0].Stored...)
	}
	return db, st.ID, msgs
}

// After a restart the index is empty and the tail has not started: a last-by-subject get
// reads PostgreSQL once and fills the index, the next is answered through it, with one
// read of the message by sequence outside the tail.
func TestSubjectIndexFillsAfterRestart(t *testing.T) {
	t.Parallel()
	db, id, _ := stored(t, "r.a", "r.b", "r.a")
	ix := New(db, 1<<20, nil)
	x := ix.Open(id, tailcache.New(1<<20, tailcache.NewBudget(1<<20)))
	for i := range 2 {
		m, err := x.Get(t.Context(), Request{LastFor: "r.a"})
		if err != nil {
			t.Fatal(err)
		}
		if m.Seq != 3 {
			t.Fatalf("get %d: last of r.a is %d, want 3", i, m.Seq)
		}
	}
	if miss, hit := counter(t, ix.m.lookups, "miss"), counter(t, ix.m.lookups, "hit"); miss != 1 || hit != 1 {
		t.Errorf("index lookups: %v misses, %v hits; want 1 and 1", miss, hit)
	}
	if reads := counter(t, ix.m.served, "database"); reads != 2 {
		t.Errorf("database reads: %v, want 2 (the fill, then the message by sequence outside the tail)", reads)
	}
}

// Commits that reach the tail and the index are answered from memory: by sequence, the
// last of a subject and the next of a wildcard. A purge that leaves the tail as it was
// (work-queue retention keeps it for the consumers) fences off what it holds: gets of those
// sequences go to PostgreSQL, which knows what is gone.
func TestGetsFromMemoryUntilPurged(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, id, msgs := stored(t, "k.a", "k.b", "k.a", "k.c")
	ix := New(db, 1<<20, nil)
	tail := tailcache.New(1<<20, tailcache.NewBudget(1<<20))
	x := ix.Open(id, tail)
	tail.Add(msgs, 1, 4)
	x.Committed(1, 4, msgs)
	for _, c := range []struct {
		req  Request
		want uint64
	}{
		{Request{Seq: 2}, 2},
		{Request{LastFor: "k.a"}, 3},
		{Request{Seq: 2, NextFor: "k.*"}, 2},
		{Request{Seq: 4, NextFor: "k.c"}, 4},
	} {
		m, live, ok := x.FromMemory(c.req)
		if !ok || !live || m.Seq != c.want {
			t.Fatalf("%+v from memory: %v live %v ok %v, want %d", c.req, m, live, ok, c.want)
		}
	}
	if served := counter(t, ix.m.served, "memory"); served != 4 {
		t.Errorf("%v gets served from memory, want 4", served)
	}

	if err := db.DeleteMessage(ctx, id, 3); err != nil {
		t.Fatal(err)
	}
	x.Purged(0)
	if m, live, ok := x.FromMemory(Request{Seq: 3}); ok {
		t.Fatalf("a purged sequence the tail still holds answered from memory: %v live %v", m, live)
	}
	if _, err := x.Get(ctx, Request{Seq: 3}); !errors.Is(err, pg.ErrNotFound) {
		t.Fatalf("get of the deleted message: %v, want not found", err)
	}
	m, err := x.Get(ctx, Request{LastFor: "k.a"})
	if err != nil || m.Seq != 1 {
		t.Fatalf("last of k.a after its last went: %v %v, want 1", m, err)
	}
	if reads := counter(t, ix.m.served, "database"); reads != 2 {
		t.Errorf("%v database reads after the purge, want 2", reads)
	}

	msgs5 := []pg.Message{{Seq: 5, Subject: "k.d", Data: []byte("k.d")}}
	tail.Add(msgs5, 5, 5)
	x.Committed(1, 5, msgs5)
	if m, live, ok := x.FromMemory(Request{Seq: 5}); !ok || !live || m.Seq != 5 {
		t.Fatalf("a commit after the purge not answered from memory: %v live %v ok %v", m, live, ok)
	}
}

// Identical gets that arrive while one reads PostgreSQL wait for its answer: one read.
func TestGetsShareReads(t *testing.T) {
	ix := New(nil, 1<<20, nil)
	release := make(chan struct{})
	var reads sync.WaitGroup
	var mu sync.Mutex
	n := 0
	read := func() (*pg.Message, error) {
		mu.Lock()
		n++
		mu.Unlock()
		<-release
		return &pg.Message{Seq: 7}, nil
	}
	k := flightKey{kind: bySeq, seq: 7}
	results := make(chan uint64, 4)
	for range 4 {
		reads.Add(1)
		go func() {
			defer reads.Done()
			m, err := ix.shared(context.Background(), k, read)
			if err != nil {
				t.Error(err)
				return
			}
			results <- m.Seq
		}()
	}
	// Every get but the first waits on the first's flight.
	testwait.For(t, 5*time.Second, func() error {
		if v := counter(t, ix.m.served, "shared"); v != 3 {
			return fmt.Errorf("%v gets wait for the read in flight, want 3", v)
		}
		return nil
	})
	close(release)
	reads.Wait()
	close(results)
	for seq := range results {
		if seq != 7 {
			t.Errorf("shared answer %d, want 7", seq)
		}
	}
	if n != 1 {
		t.Errorf("%d reads, want 1", n)
	}
}

// The index stays within its bound and counts what it evicts.
func TestSubjectIndexBound(t *testing.T) {
	ix := New(nil, 10*(entryBytes+4), nil)
	x := ix.Open(1, tailcache.New(1<<20, tailcache.NewBudget(1<<20)))
	var msgs []pg.Message
	for i := range 30 {
		msgs = append(msgs, pg.Message{Seq: uint64(i + 1), Subject: fmt.Sprintf("k.%02d", i)})
	}
	x.Committed(1, 30, msgs)
	if used := ix.used.Load(); used > ix.max {
		t.Errorf("index holds %d bytes, bound %d", used, ix.max)
	}
	var m dto.Metric
	if err := ix.m.evictions.Write(&m); err != nil {
		t.Fatal(err)
	}
	if m.GetCounter().GetValue() != 20 {
		t.Errorf("%v evictions, want 20", m.GetCounter().GetValue())
	}
	if seq, _, ok := x.lastOf("k.29", 30); !ok || seq != 30 {
		t.Errorf("the newest subject is not indexed: %d %v", seq, ok)
	}
	x.Dropped()
	if used := ix.used.Load(); used != 0 {
		t.Errorf("a dropped stream left %d bytes", used)
	}
	x.Committed(31, 31, []pg.Message{{Seq: 31, Subject: "k.late"}})
	if used := ix.used.Load(); used != 0 {
		t.Errorf("a commit that landed after the drop holds %d bytes", used)
	}
}

// After the database went back to an earlier state, the index forgets what it saw past it:
// a message the tail takes at a rewound sequence is answered from memory, and another
// replica's commit there, of subjects the index does not know, resets the index as any
// other replica's commit does.
func TestGetsAfterRewind(t *testing.T) {
	ix := New(nil, 1<<20, nil)
	tail := tailcache.New(1<<20, tailcache.NewBudget(1<<20))
	x := ix.Open(1, tail)
	var msgs []pg.Message
	for i := range 10 {
		msgs = append(msgs, pg.Message{Seq: uint64(i + 1), Subject: "k.a"})
	}
	tail.Add(msgs, 1, 10)
	x.Committed(1, 10, msgs)

	tail.Rewind(6)
	x.Rewound(1, 6)
	again := []pg.Message{{Seq: 7, Subject: "k.a", Data: []byte("new")}}
	tail.Add(again, 7, 7)
	x.Committed(1, 7, again)
	m, live, ok := x.FromMemory(Request{Seq: 7})
	if !ok || !live || string(m.Data) != "new" {
		t.Fatalf("sequence 7 after the rewind: %v live %v ok %v, want the new message from memory", m, live, ok)
	}
	if seq, _, ok := x.lastOf("k.a", tail.HighWater()); !ok || seq != 7 {
		t.Fatalf("last of k.a after the rewind: %d %v, want 7", seq, ok)
	}
	tail.Raise(8)
	if seq, _, ok := x.lastOf("k.a", tail.HighWater()); ok {
		t.Fatalf("last of k.a after another replica's commit: %d from the index, want a miss", seq)
	}
}
