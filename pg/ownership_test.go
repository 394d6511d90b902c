package pg_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

func openOwnership(t *testing.T, db *pg.DB) *pg.Ownership {
	t.Helper()
	o, err := db.OpenOwnership(context.Background(), nil, 10*time.Second, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Close)
	return o
}

// One session holds a consumer's lock at a time; the moment that session ends, however it
// ends, another claims the consumer, and the ended one knows it has lost everything.
func TestOwnershipLocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDB(t)
	db := pgtest.OpenAt(t, url)
	raw := rawsql.Open(t, url)
	st := consumerTestStream(t, ctx, db)
	for _, name := range []string{"A", "B"} {
		if _, err := db.CreateConsumer(ctx, pg.Consumer{StreamID: st.ID, Name: name, Config: []byte(`{}`)}, 0); err != nil {
			t.Fatal(err)
		}
	}
	r1, r2 := openOwnership(t, db), openOwnership(t, db)
	a := pg.ConsumerKey{StreamID: st.ID, Name: "A"}
	if _, ok, err := r1.TryLock(ctx, a); !ok || err != nil {
		t.Fatalf("r1 locks A: %v %v", ok, err)
	}
	if _, ok, err := r2.TryLock(ctx, a); ok || err != nil {
		t.Fatalf("r2 locks A that r1 holds: %v %v", ok, err)
	}
	got, _, err := r2.ClaimFree(ctx, []int64{st.ID}, false)
	if err != nil || len(got) != 1 || got[0].Name != "B" {
		t.Fatalf("r2 claims the free consumers: %v %v, want B alone", got, err)
	}
	if got, _, err := r2.ClaimFree(ctx, []int64{st.ID}, false); err != nil || len(got) != 0 {
		t.Fatalf("r2 claims again: %v %v, want none", got, err)
	}
	c, prev, err := db.SetOwner(ctx, got[0].ID, "r2")
	if err != nil || prev != "" || c.Owner != "r2" {
		t.Fatalf("r2 records itself as B's owner: %+v, previous %q, %v", c, prev, err)
	}
	if gone, err := r2.Deleted(ctx); err != nil || len(gone) != 0 {
		t.Fatalf("r2's deleted consumers: %v, %v; want none", gone, err)
	}
	if err := db.DeleteConsumer(ctx, st.ID, "B"); err != nil {
		t.Fatal(err)
	}
	gone, err := r2.Deleted(ctx)
	if err != nil || len(gone) != 1 || gone[0].Name != "B" {
		t.Fatalf("r2's deleted consumers: %v, %v; want B", gone, err)
	}
	// As the engine gives back the lock of a deleted consumer once it stopped serving it.
	if err := r2.Unlock(ctx, gone[0].ID); err != nil {
		t.Fatal(err)
	}
	rowA, err := db.GetConsumer(ctx, st.ID, "A")
	if err != nil {
		t.Fatal(err)
	}

	// r1's session is ended from outside, as PostgreSQL ends a dead client's.
	if err := raw.Exec(ctx, `SELECT pg_terminate_backend(l.pid) FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted AND l.classid = 0 AND l.objid = $1::bigint::oid
			AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`, rowA.ID); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, func() error {
		got, _, err := r2.ClaimFree(ctx, []int64{st.ID}, false)
		if err != nil {
			return err
		}
		if len(got) != 1 || got[0].Name != "A" {
			return errors.New("A not free yet")
		}
		return nil
	})
	if err := r1.Confirm(ctx); !errors.Is(err, pg.ErrOwnershipLost) {
		t.Fatalf("r1 confirms after its session ended: %v, want ErrOwnershipLost", err)
	}
	if r1.Connected() || !r1.Confirmed().IsZero() {
		t.Fatal("r1 still reports a connection")
	}
	if err := r1.Reconnect(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := r1.TryLock(ctx, a); ok || err != nil {
		t.Fatalf("r1 locks A that r2 took over: %v %v", ok, err)
	}
	// Unlocking gives it back.
	if err := r2.Unlock(ctx, rowA.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := r1.TryLock(ctx, a); !ok || err != nil {
		t.Fatalf("r1 locks A once r2 let go: %v %v", ok, err)
	}
}

// The session's confirmations are stamped on the clock it was opened with, whatever the
// system clock says, so that the caller's fence measures their age on its own clock; a
// statement that fails or a close leaves none.
func TestOwnershipConfirmsOnItsClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Open(t)
	clk := clocktest.At(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	o, err := db.OpenOwnership(ctx, clk, 10*time.Second, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Close)
	if got := o.Confirmed(); !got.Equal(clk.Now()) {
		t.Fatalf("confirmed at %v once opened, want the clock's %v", got, clk.Now())
	}
	clk.Advance(time.Hour)
	if err := o.Confirm(ctx); err != nil {
		t.Fatal(err)
	}
	if got := o.Confirmed(); !got.Equal(clk.Now()) {
		t.Fatalf("confirmed at %v after an hour of the clock, want %v", got, clk.Now())
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if err := o.Confirm(canceled); !errors.Is(err, pg.ErrOwnershipLost) {
		t.Fatalf("a confirmation that cannot run: %v, want ErrOwnershipLost", err)
	}
	if got := o.Confirmed(); !got.IsZero() {
		t.Fatalf("confirmed at %v after the session broke, want never", got)
	}
	clk.Advance(time.Minute)
	if err := o.Reconnect(ctx); err != nil {
		t.Fatal(err)
	}
	if got := o.Confirmed(); !got.Equal(clk.Now()) {
		t.Fatalf("confirmed at %v once reconnected, want %v", got, clk.Now())
	}
}

// A stream or consumer change notifies at its commit; a check run in the creating
// transaction refuses a stream.
func TestMetaNotifyAndCheck(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db := pgtest.Open(t)
	got := make(chan int64, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		db.ListenMeta(ctx, func(id int64) { got <- id })
	}()
	defer func() { cancel(); <-done }()
	select {
	case id := <-got:
		if id != 0 {
			t.Fatalf("first call %d, want 0 (re-read everything)", id)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("ListenMeta never made its first call")
	}
	st, err := db.CreateStream(ctx, "N", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-got:
		if id != st.ID {
			t.Fatalf("notified %d, want %d", id, st.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no notification of a created stream")
	}
	wantNote := func(what string) {
		t.Helper()
		select {
		case id := <-got:
			if id != st.ID {
				t.Fatalf("%s: notified %d, want %d", what, id, st.ID)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no notification of %s", what)
		}
	}
	if _, err := db.CreateConsumer(ctx, pg.Consumer{StreamID: st.ID, Name: "C", Config: []byte(`{}`)}, 0); err != nil {
		t.Fatal(err)
	}
	wantNote("a created consumer")
	if err := db.UpdateConsumerConfig(ctx, st.ID, "C", []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	wantNote("an updated consumer")
	if err := db.DeleteConsumer(ctx, st.ID, "C"); err != nil {
		t.Fatal(err)
	}
	wantNote("a deleted consumer")
	if err := db.DeleteConsumer(ctx, st.ID, "C"); !errors.Is(err, pg.ErrNotFound) {
		t.Fatalf("deleting it again: %v, want ErrNotFound", err)
	}
	refused := errors.New("refused")
	var seen []string
	_, err = db.CreateStreamChecked(ctx, "M", []byte(`{}`), 1, func(others []pg.StreamRow) error {
		for _, o := range others {
			seen = append(seen, o.Name)
		}
		return refused
	})
	if !errors.Is(err, refused) || len(seen) != 1 || seen[0] != "N" {
		t.Fatalf("checked create: %v, check saw %v", err, seen)
	}
	if _, err := db.CreateStreamChecked(ctx, "M", []byte(`{}`), 1, func([]pg.StreamRow) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if n, err := db.CountConsumers(ctx, st.ID); err != nil || n != 0 {
		t.Fatalf("consumers: %d %v", n, err)
	}
}

// Each replica claims its fair share of the free consumers among the live ones, so that the
// consumers of a replica that died spread over those left rather than go to the first that
// looks.
func TestOwnershipClaimsFairShare(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDB(t)
	db := pgtest.OpenAt(t, url)
	raw := rawsql.Open(t, url)
	st := consumerTestStream(t, ctx, db)
	for _, name := range []string{"A", "B", "C", "D", "E", "F", "G", "H", "I"} {
		if _, err := db.CreateConsumer(ctx, pg.Consumer{StreamID: st.ID, Name: name, Config: []byte(`{}`)}, 0); err != nil {
			t.Fatal(err)
		}
	}
	reps := []*pg.Ownership{openOwnership(t, db), openOwnership(t, db), openOwnership(t, db)}
	overdue := false
	claim := func(o *pg.Ownership) int {
		t.Helper()
		got, _, err := o.ClaimFree(ctx, []int64{st.ID}, overdue)
		if err != nil {
			t.Fatal(err)
		}
		return len(got)
	}
	for i, o := range reps {
		if n := claim(o); n != 3 {
			t.Fatalf("replica %d of 3 claimed %d of 9 free consumers, want 3", i+1, n)
		}
	}
	// A closed session ends on the server a moment later, and its locks go one lock
	// partition at a time: a claim in between would see some of them free and its replica
	// lock still held. So the claim waits until only the live sessions hold locks.
	holders := func() (int, error) {
		var n int
		err := raw.QueryRow(ctx, `SELECT count(DISTINCT pid) FROM pg_locks
			WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n)
		return n, err
	}
	live := len(reps)
	claimOnceFreed := func(o *pg.Ownership) int {
		t.Helper()
		live--
		testwait.For(t, 10*time.Second, func() error {
			n, err := holders()
			if err == nil && n != live {
				err = fmt.Errorf("%d sessions hold locks, want %d", n, live)
			}
			return err
		})
		return claim(o)
	}
	reps[2].Close()
	// Two live replicas holding 3 each: a share is 5, so the first takes 2 of the 3 freed.
	if n := claimOnceFreed(reps[0]); n != 2 {
		t.Fatalf("the first of 2 replicas left claimed %d of 3 freed consumers, want 2", n)
	}
	if n := claim(reps[1]); n != 1 {
		t.Fatalf("the second of 2 replicas left claimed %d of 1 freed consumer, want 1", n)
	}
	// The last replica's share is everything.
	reps[1].Close()
	if n := claimOnceFreed(reps[0]); n != 4 {
		t.Fatalf("the last replica claimed %d of 4 freed consumers, want 4", n)
	}

	// A replica at its share takes no more, and says how many it left; once its caller
	// finds them left too long (overdue), it takes one per look, so that none stays free for
	// good because a live replica does not look.
	r4, r5 := openOwnership(t, db), openOwnership(t, db)
	live += 2
	reps[0].Close()
	if n := claimOnceFreed(r4); n != 5 {
		t.Fatalf("the first of 2 replicas left claimed %d of 9 freed consumers, want 5", n)
	}
	if got, left, err := r4.ClaimFree(ctx, []int64{st.ID}, false); err != nil || len(got) != 0 || left != 4 {
		t.Fatalf("a replica at its share claimed %v and left %d (%v), want none and 4 left", got, left, err)
	}
	overdue = true
	if n := claim(r4); n != 1 {
		t.Fatalf("a replica at its share claimed %d overdue free consumers, want 1", n)
	}
	overdue = false
	if n := claim(r5); n != 3 {
		t.Fatalf("the second of 2 replicas left claimed %d of 3 free consumers, want 3", n)
	}
	if n := claim(r4); n != 0 {
		t.Fatalf("a replica claimed %d consumers when none was free", n)
	}
}

// Every consumer has a lock of its own: two consumers of one stream whose names hash alike
// (as lock keys of the stream's id and hashtext of the name did) are served by two replicas.
func TestOwnershipLockPerConsumer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDB(t)
	db := pgtest.OpenAt(t, url)
	raw := rawsql.Open(t, url)
	st := consumerTestStream(t, ctx, db)
	var a, b string
	if err := raw.QueryRow(ctx, `SELECT min(n), max(n) FROM (SELECT 'c' || g AS n, hashtext('c' || g) AS h FROM generate_series(1, 300000) g) x
		GROUP BY h HAVING count(*) > 1 LIMIT 1`).Scan(&a, &b); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{a, b} {
		if _, err := db.CreateConsumer(ctx, pg.Consumer{StreamID: st.ID, Name: name, Config: []byte(`{}`)}, 0); err != nil {
			t.Fatal(err)
		}
	}
	r1, r2 := openOwnership(t, db), openOwnership(t, db)
	if _, ok, err := r1.TryLock(ctx, pg.ConsumerKey{StreamID: st.ID, Name: a}); !ok || err != nil {
		t.Fatalf("r1 locks %s: %v %v", a, ok, err)
	}
	if _, ok, err := r2.TryLock(ctx, pg.ConsumerKey{StreamID: st.ID, Name: b}); !ok || err != nil {
		t.Fatalf("r2 locks %s, whose name hashes as %s's: %v %v", b, a, ok, err)
	}
	if _, _, err := r2.TryLock(ctx, pg.ConsumerKey{StreamID: st.ID, Name: "missing"}); !errors.Is(err, pg.ErrNotFound) {
		t.Fatalf("locking a consumer that does not exist: %v, want ErrNotFound", err)
	}
	if !r2.Connected() {
		t.Fatal("a lock of a missing consumer broke the session")
	}
	id, err := r1.LockNew(ctx, pg.ConsumerKey{StreamID: st.ID, Name: "new"})
	if err != nil {
		t.Fatal(err)
	}
	if c, err := db.CreateConsumer(ctx, pg.Consumer{ID: id, StreamID: st.ID, Name: "new", Config: []byte(`{}`), Owner: "r1"}, 0); err != nil || c.ID != id {
		t.Fatalf("create with the locked id %d: %+v %v", id, c, err)
	}
	if got, _, err := r2.ClaimFree(ctx, []int64{st.ID}, false); err != nil || len(got) != 0 {
		t.Fatalf("r2 claims %v, %v; every consumer is held", got, err)
	}
}

// A consumer deleted and created again under its name while this session still holds the
// old one's lock (its goroutine still stopping) gets a lock of its own: giving the old one
// back leaves the new one held.
func TestOwnershipRecreatedConsumerKeepsItsLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Open(t)
	st := consumerTestStream(t, ctx, db)
	r1, r2 := openOwnership(t, db), openOwnership(t, db)
	k := pg.ConsumerKey{StreamID: st.ID, Name: "C"}
	oldID, err := r1.LockNew(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.CreateConsumer(ctx, pg.Consumer{ID: oldID, StreamID: st.ID, Name: "C", Config: []byte(`{}`), Owner: "r1"}, 0); err != nil {
		t.Fatal(err)
	}
	if err := db.DeleteConsumer(ctx, st.ID, "C"); err != nil {
		t.Fatal(err)
	}
	newID, err := r1.LockNew(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.CreateConsumer(ctx, pg.Consumer{ID: newID, StreamID: st.ID, Name: "C", Config: []byte(`{}`), Owner: "r1"}, 0); err != nil {
		t.Fatal(err)
	}
	gone, err := r1.Deleted(ctx)
	if err != nil || len(gone) != 1 || gone[0].ID != oldID {
		t.Fatalf("deleted: %v, %v; want the old consumer %d alone", gone, err, oldID)
	}
	if err := r1.Unlock(ctx, oldID); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := r2.TryLock(ctx, k); ok || err != nil {
		t.Fatalf("another session locks the new consumer once the old one's lock was given back: %v %v", ok, err)
	}
	if got, _, err := r2.ClaimFree(ctx, []int64{st.ID}, false); err != nil || len(got) != 0 {
		t.Fatalf("another session claims %v, %v; the new consumer is held", got, err)
	}
}
