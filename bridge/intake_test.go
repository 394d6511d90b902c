package bridge

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
	"github.com/nats-io/nats.go/jetstream"
)

// Four streams face a database that has stopped answering. Each stream's own bound is far
// from full, but together they reach the process-wide bound: from there on publishes are
// refused at once with 503 / 10023, counted as intake_total_full, and what was taken in is
// stored once the database answers again.
func TestIntakeTotalBound(t *testing.T) {
	t.Parallel()
	const (
		streams   = 4
		perStream = 1 << 20
		total     = 64 << 10
		payload   = 2048
		each      = 100 // 200 KiB a stream, 800 KiB in all
	)
	url := pgtest.NewDB(t)
	tb := setup(t, setupOpts{db: pgtest.OpenAt(t, url), config: func(c *Config) { c.IntakeBytes, c.IntakeTotalBytes = perStream, total }})
	probe := rawsql.Open(t, url)
	ctx := testContext(t)
	for i := range streams {
		newStream(t, ctx, tb, fmt.Sprintf("T%d", i), fmt.Sprintf("t%d.>", i))
		if _, err := tb.js.Publish(ctx, fmt.Sprintf("t%d.first", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	// Released before the bridge stops, should the test end early: cleanups run last first.
	unlock := probe.HoldRows(t, `SELECT 1 FROM jetgres.stream_state FOR UPDATE`)
	var futures []jetstream.PubAckFuture
	for i := range each * streams {
		f, err := tb.js.PublishAsync(fmt.Sprintf("t%d.x", i%streams), make([]byte, payload))
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
	}
	// Refusals come back while the database is still stuck.
	testwait.For(t, 10*time.Second, func() error {
		if n := rejected(t, tb, stream.ReasonIntakeAll); n == 0 {
			return errors.New("no publish refused for the total bound yet")
		}
		return nil
	})
	unlock()
	stored, refused := 0, 0
	for _, f := range futures {
		select {
		case <-f.Ok():
			stored++
		case err := <-f.Err():
			var apiErr *jetstream.APIError
			if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10023 {
				t.Fatalf("publish failed with %v, want err_code 10023", err)
			}
			refused++
		case <-ctx.Done():
			t.Fatal("a publish got no answer")
		}
	}
	fit := total / int(pg.MessageSize(false, "t0.x", nil, make([]byte, payload)))
	if refused == 0 || stored < fit {
		t.Errorf("%d stored and %d refused; want refusals, and at least the %d that fit", stored, refused, fit)
	}
	if n := rejected(t, tb, stream.ReasonIntakeAll); n != float64(refused) {
		t.Errorf("intake_total_full counted %v, %d refused", n, refused)
	}
	if n := rejected(t, tb, stream.ReasonIntakeFull); n != 0 {
		t.Errorf("intake_full counted %v with every stream below its own bound", n)
	}
	var msgs uint64
	for i := range streams {
		s, err := tb.js.Stream(ctx, fmt.Sprintf("T%d", i))
		if err != nil {
			t.Fatal(err)
		}
		msgs += s.CachedInfo().State.Msgs
	}
	if want := uint64(stored + streams); msgs != want {
		t.Errorf("streams hold %d messages, want %d (%d acknowledged and the first of each)", msgs, want, stored)
	}
	if n := gaugeValue(t, tb.reg, "jetgres_intake_bytes"); n != 0 {
		t.Errorf("%v bytes still counted in the intakes with nothing waiting", n)
	}
}

// rejected is jetgres_publish_rejected_total for one reason.
func rejected(t *testing.T, tb *testBundle, reason string) float64 {
	t.Helper()
	return reasonCount(t, tb.reg, "jetgres_publish_rejected_total", reason)
}
