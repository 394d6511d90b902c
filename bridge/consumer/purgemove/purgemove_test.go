package purgemove

import (
	"context"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// A plan reads the stream's first sequence and the first message left on the purged
// subject from PostgreSQL, once the purge is done.
func TestNewPlanReadsWhatThePurgeLeft(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Open(t)
	st, err := db.CreateStream(ctx, "S", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []pg.AppendMsg
	for _, s := range []string{"a", "b", "a", "c", "a"} {
		msgs = append(msgs, pg.AppendMsg{Subject: s})
	}
	if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: msgs}}, time.Now().UnixNano()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Purge(ctx, st.ID, pg.PurgeParams{Filter: "a", Keep: 1}); err != nil {
		t.Fatal(err)
	}
	p, err := NewPlan(ctx, db, st.ID, "a")
	if err != nil {
		t.Fatal(err)
	}
	if p.first != 2 || p.left != 5 || p.last != 5 {
		t.Fatalf("plan after purging a: first %d, left %d, last %d; want 2, 5, 5", p.first, p.left, p.last)
	}
	if _, err := db.Purge(ctx, st.ID, pg.PurgeParams{}); err != nil {
		t.Fatal(err)
	}
	if p, err = NewPlan(ctx, db, st.ID, ""); err != nil {
		t.Fatal(err)
	}
	if move, _ := p.For([]string{"a"}); move.Start != 6 || move.Last != 5 {
		t.Fatalf("after purging everything a consumer moves to %+v, want start 6, last 5", move)
	}
}

// The moves nats-server makes after a purge of a subject, by how a consumer's filters
// relate to it.
func TestPlanForFilters(t *testing.T) {
	p := Plan{subject: "orders.>", first: 10, left: 15, last: 20}
	for _, tc := range []struct {
		name    string
		filters []string
		ok      bool
		start   uint64
		wider   bool
	}{
		{"equal", []string{"orders.>"}, true, 15, false},
		{"inside", []string{"orders.eu", "orders.us.*"}, true, 15, false},
		{"no filters", nil, true, 10, true},
		{"wider", []string{">"}, true, 10, true},
		{"inside and elsewhere", []string{"orders.eu", "billing.>"}, true, 10, true},
		{"elsewhere", []string{"billing.>"}, false, 0, false},
		{"partly overlapping", []string{"*.eu"}, false, 0, false},
	} {
		move, ok := p.For(tc.filters)
		if ok != tc.ok {
			t.Fatalf("%s: moved %v, want %v", tc.name, ok, tc.ok)
		}
		if !ok {
			continue
		}
		if move.Start != tc.start || move.Wider != tc.wider || move.Last != 20 {
			t.Fatalf("%s: move %+v, want start %d, wider %v, last 20", tc.name, move, tc.start, tc.wider)
		}
	}
	all := Plan{first: 10, left: 10, last: 20}
	if move, ok := all.For([]string{"billing.>"}); !ok || move.Start != 10 || move.Wider {
		t.Fatalf("a purge of every subject moved %+v, %v", move, ok)
	}
}
