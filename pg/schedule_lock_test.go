package pg_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// One session holds a stream's scheduler lock, and keeps it when it asks again; the
// session's end frees it for another; another stream's lock is apart.
func TestHoldScheduler(t *testing.T) {
	t.Parallel()
	db := pgtest.Open(t)
	ctx := context.Background()
	a, b := openOwnership(t, db), openOwnership(t, db)
	hold := func(who string, o *pg.Ownership, id int64, want bool) {
		t.Helper()
		got, err := o.HoldScheduler(ctx, id)
		if err != nil || got != want {
			t.Fatalf("%s holds stream %d's scheduler lock: %t, %v; want %t", who, id, got, err, want)
		}
	}
	hold("a", a, 7, true)
	hold("a again", a, 7, true)
	hold("b", b, 7, false)
	hold("b, another stream", b, 8, true)
	a.Close()
	// The server ends a's session, and frees its locks, a moment after a hangs up.
	testwait.For(t, 10*time.Second, func() error {
		got, err := b.HoldScheduler(ctx, 7)
		if err != nil || !got {
			return fmt.Errorf("b, once a is gone, holds stream 7's scheduler lock: %t, %v", got, err)
		}
		return nil
	})
}
