package pg_test

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// A message that purges another subject stores and purges in one transaction: two
// replicas firing the same one-shot at once, each expecting the schedule to be the
// subject's last message, store one message between them, and the schedule is gone in
// the same commit; the state's counts and the subject's reads agree.
func TestAppendPurgeIsOneStep(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.NewDB(t)
	a, b := pgtest.OpenAt(t, url), pgtest.OpenAt(t, url)
	st, err := a.CreateStream(ctx, "P", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	appendOne := func(db *pg.DB, m pg.AppendMsg) pg.Outcome {
		t.Helper()
		res, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: []pg.AppendMsg{m}}}, time.Now().UnixNano())
		if err != nil {
			t.Fatal(err)
		}
		return res[0].Outcomes[0]
	}
	for _, subj := range []string{"p.sched", "p.other", "p.sched"} {
		if o := appendOne(a, pg.AppendMsg{Subject: subj, Data: []byte(subj)}); o.Err != nil {
			t.Fatal(o.Err)
		}
	}
	sched := uint64(3)
	fire := pg.AppendMsg{Subject: "p.out", Data: []byte("fired"), ExpectLastSubjSeq: &sched, ExpectLastSubjFilter: "p.sched", Purge: "p.sched"}
	var wg sync.WaitGroup
	outcomes := make([]pg.Outcome, 2)
	for i, db := range []*pg.DB{a, b} {
		wg.Go(func() { outcomes[i] = appendOne(db, fire) })
	}
	wg.Wait()
	stored := 0
	for _, o := range outcomes {
		var ee *pg.ExpectError
		switch {
		case o.Err == nil:
			stored++
		case !errors.As(o.Err, &ee):
			t.Fatalf("the losing fire: %v, want an expectation error", o.Err)
		}
	}
	if stored != 1 {
		t.Fatalf("%d fires stored, want 1: %+v", stored, outcomes)
	}
	if _, err := a.LastBySubject(ctx, st.ID, "p.sched"); !errors.Is(err, pg.ErrNotFound) {
		t.Fatalf("the schedule's subject after the fire: %v, want it purged", err)
	}
	state, err := a.State(ctx, st.ID)
	if err != nil {
		t.Fatal(err)
	}
	if state.Msgs != 2 || state.LastSeq != 4 {
		t.Fatalf("state after the fire: %+v, want 2 messages (p.other, p.out) through sequence 4", state)
	}
	live, err := a.LiveBySubject(ctx, st.ID, []string{"p.sched", "p.other", "p.out"})
	if err != nil {
		t.Fatal(err)
	}
	if live["p.sched"] != 0 || live["p.other"] != 1 || live["p.out"] != 1 {
		t.Fatalf("live rows by subject: %v", live)
	}
}

// PurgeCheck decides from the purged subject's last live message, as committed or as the
// batch left it, and its error refuses the message, which then purges nothing; a message
// taken without interest purges too.
func TestAppendPurgeCheck(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Open(t)
	st, err := db.CreateStream(ctx, "C", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	refuse := errors.New("not a schedule")
	var saw []string
	check := func(last *pg.Message) error {
		if last == nil {
			saw = append(saw, "none")
			return nil
		}
		saw = append(saw, string(last.Data))
		if string(last.Data) != "schedule" {
			return refuse
		}
		return nil
	}
	purge := pg.AppendMsg{Subject: "c.purge", Purge: "c.s", PurgeCheck: check}
	batch := func(msgs ...pg.AppendMsg) []pg.Outcome {
		t.Helper()
		res, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: msgs}}, time.Now().UnixNano())
		if err != nil {
			t.Fatal(err)
		}
		return res[0].Outcomes
	}
	// Committed before: a plain message refuses the purge, which leaves it.
	batch(pg.AppendMsg{Subject: "c.s", Data: []byte("plain")})
	if o := batch(purge); !errors.Is(o[0].Err, refuse) {
		t.Fatalf("purge of a plain message: %+v", o)
	}
	if m, err := db.LastBySubject(ctx, st.ID, "c.s"); err != nil || string(m.Data) != "plain" {
		t.Fatalf("c.s after a refused purge: %v %v", m, err)
	}
	// Stored earlier in the same batch: the schedule is checked and purged, and a second
	// purge finds nothing left.
	o := batch(pg.AppendMsg{Subject: "c.s", Data: []byte("schedule")}, purge, purge)
	for i, oc := range o {
		if oc.Err != nil {
			t.Fatalf("message %d: %v", i, oc.Err)
		}
	}
	// A message no consumer wants is not stored, and purges all the same, as nats-server's.
	batch(pg.AppendMsg{Subject: "c.s", Data: []byte("schedule")})
	if o := batch(pg.AppendMsg{Subject: "c.purge", Purge: "c.s", PurgeCheck: check, NoInterest: true}); o[0].Err != nil || o[0].Seq != 6 {
		t.Fatalf("a purge without interest: %+v", o)
	}
	if _, err := db.LastBySubject(ctx, st.ID, "c.s"); !errors.Is(err, pg.ErrNotFound) {
		t.Fatalf("c.s after a purge without interest: %v", err)
	}
	if want := []string{"plain", "schedule", "none", "schedule"}; !slices.Equal(saw, want) {
		t.Fatalf("the check saw %v, want %v", saw, want)
	}
	state, err := db.State(ctx, st.ID)
	if err != nil {
		t.Fatal(err)
	}
	if state.Msgs != 2 || state.LastSeq != 6 {
		t.Fatalf("state %+v, want the two stored purges alone, through sequence 6", state)
	}
}
