package pg_test

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// TestServerChangeAfterPromotion: an asynchronous standby promoted without the primary's
// last commits is found by the first connection to it, which reports each stream's
// sequences there; the next append takes the sequences after it, not after what this
// process remembered committing.
func TestServerChangeAfterPromotion(t *testing.T) {
	pair := pgtest.StartPair(t, pgtest.PairConfig{})
	db := pgtest.OpenWith(t, pg.Config{URL: pair.URL()})
	var mu sync.Mutex
	var changes []pg.ServerChange
	db.OnServerChange(func(ch pg.ServerChange) {
		mu.Lock()
		defer mu.Unlock()
		changes = append(changes, ch)
	})
	st, err := db.CreateStream(t.Context(), "S", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	appendOne := func() (uint64, error) {
		res, _, err := db.Append(t.Context(), []pg.AppendBatch{{StreamID: st.ID, Msgs: []pg.AppendMsg{{Subject: "s", Data: []byte("m")}}}}, 1)
		if err != nil {
			return 0, err
		}
		return res[0].Outcomes[0].Seq, nil
	}
	for range 3 {
		if _, err := appendOne(); err != nil {
			t.Fatal(err)
		}
	}
	pair.CatchUp()
	pair.DetachStandby()
	for range 2 {
		if _, err := appendOne(); err != nil {
			t.Fatal(err)
		}
	}
	pair.KillPrimary()
	pair.Promote()
	// The pooled connections to the dead primary fail the first appends, as unavailable or,
	// for one whose pipeline was written before the connection was seen to be dead, with
	// an unknown outcome: the dead primary, which nothing reaches any more, is where it
	// would have been stored.
	var seq uint64
	testwait.For(t, time.Minute, func() error {
		var err error
		seq, err = appendOne()
		return err
	})
	if seq != 4 {
		t.Errorf("the first append on the new primary took sequence %d, want 4", seq)
	}
	if n := db.ServerChanges(); n != 1 {
		t.Errorf("ServerChanges = %d, want 1", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(changes) != 1 {
		t.Fatalf("the handler heard of %d changes, want 1", len(changes))
	}
	ch := changes[0]
	// A promoted standby is the same cluster on a new timeline.
	sysFrom, tlFrom, _ := strings.Cut(ch.From, "/")
	sysTo, tlTo, _ := strings.Cut(ch.To, "/")
	if sysFrom == "" || sysFrom != sysTo || tlFrom == tlTo {
		t.Errorf("the server changed from %q to %q, want the same system identifier on a new timeline", ch.From, ch.To)
	}
	if got := ch.Streams[st.ID]; got != (pg.SeqBounds{First: 1, Last: 3}) {
		t.Errorf("the stream's sequences on the new server: %+v, want 1 to 3", got)
	}
}

// TestReadOnlyServerIsLeft: a primary made read-only under open connections (as before a
// switchover) refuses the writes on them; each such connection is dropped, so that once the
// standby is promoted, appends go there rather than to the read-only server for as long as
// its pooled connections would live, and the ownership session still on the old server is
// given up.
func TestReadOnlyServerIsLeft(t *testing.T) {
	pair := pgtest.StartPair(t, pgtest.PairConfig{})
	db := pgtest.OpenWith(t, pg.Config{URL: pair.URL()})
	st, err := db.CreateStream(t.Context(), "S", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	appendOne := func() error {
		_, _, err := db.Append(t.Context(), []pg.AppendBatch{{StreamID: st.ID, Msgs: []pg.AppendMsg{{Subject: "s", Data: []byte("m")}}}}, 1)
		return err
	}
	if err := appendOne(); err != nil {
		t.Fatal(err)
	}
	own, err := db.OpenOwnership(t.Context(), nil, 10*time.Second, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	pair.CatchUp()
	admin := rawsql.Open(t, pair.PrimaryDSN())
	if err := admin.Exec(t.Context(), `ALTER SYSTEM SET default_transaction_read_only = on`); err != nil {
		t.Fatal(err)
	}
	if err := admin.Exec(t.Context(), `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
	destroyed := db.Stats().Destroyed
	testwait.For(t, time.Minute, func() error {
		err := appendOne()
		if err == nil {
			return errors.New("an append on the read-only primary succeeded")
		}
		if !errors.Is(err, pg.ErrUnavailable) || errors.Is(err, pg.ErrOutcomeUnknown) {
			t.Fatalf("append on a read-only primary: %v, want ErrUnavailable and no unknown outcome", err)
		}
		return nil
	})
	if db.Stats().Destroyed == destroyed {
		t.Error("the connection to the read-only primary was kept")
	}
	pair.Promote()
	testwait.For(t, time.Minute, appendOne)
	// The ownership session is still on the read-only server, where its locks guard nothing.
	if err := own.Confirm(t.Context()); !errors.Is(err, pg.ErrOwnershipLost) {
		t.Errorf("confirming the ownership session left on the old primary: %v, want ErrOwnershipLost", err)
	}
}
