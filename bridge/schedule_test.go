package bridge

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/internal/testwait"
)

// schedulePub publishes a message schedule on subject with the headers kv.
func schedulePub(t *testing.T, ctx context.Context, js jetstream.JetStream, subject string, data string, kv ...string) (*jetstream.PubAck, error) {
	t.Helper()
	m := nats.NewMsg(subject)
	m.Data = []byte(data)
	for i := 0; i < len(kv); i += 2 {
		m.Header.Set(kv[i], kv[i+1])
	}
	return js.PublishMsg(ctx, m)
}

// lastOn is the last message stored on subject, nil when there is none.
func lastOn(t *testing.T, ctx context.Context, s jetstream.Stream, subject string) *jetstream.RawStreamMsg {
	t.Helper()
	m, err := s.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		return nil
	}
	return m
}

// Schedules on jetgres's injected clock: a one-shot fires when the clock reaches its time
// and not before, with nats-server's headers, and its schedule is purged; a repeating one
// fires each period and stays; a restart resumes them from what PostgreSQL holds, firing a
// missed time once.
func TestScheduleFakeClock(t *testing.T) {
	t.Parallel()
	clk := clocktest.At(time.Now().Truncate(time.Second))
	onClock := func(c *Config) { c.Clock = clk }
	tb := setup(t, setupOpts{config: onClock})
	ctx := testContext(t)
	s, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "SCH", Subjects: []string{"sch.>"}, AllowMsgSchedules: true, AllowMsgTTL: true})
	if err != nil {
		t.Fatal(err)
	}
	if !s.CachedInfo().Config.AllowRollup {
		t.Fatal("allow_msg_schedules did not turn roll-ups on")
	}
	at := clk.Now().Add(10 * time.Second).Format(time.RFC3339)
	if _, err := schedulePub(t, ctx, tb.js, "sch.once", "hello", "Nats-Schedule", "@at "+at, "Nats-Schedule-Target", "sch.out.once",
		"Nats-Schedule-TTL", "5m", "Custom", "kept", "Nats-Msg-Id", "m1"); err != nil {
		t.Fatal(err)
	}
	if m := lastOn(t, ctx, s, "sch.once"); m == nil || m.Header.Get("Nats-Rollup") != "sub" {
		t.Fatalf("the schedule as stored: %+v", m)
	}
	advance := func(d time.Duration) {
		for range int(d / time.Second) {
			clk.Advance(time.Second)
		}
	}
	advance(9 * time.Second)
	if m := lastOn(t, ctx, s, "sch.out.once"); m != nil {
		t.Fatalf("fired before its time: %+v", m)
	}
	advance(2 * time.Second)
	var out *jetstream.RawStreamMsg
	testwait.For(t, 20*time.Second, func() error {
		if out = lastOn(t, ctx, s, "sch.out.once"); out == nil {
			return fmt.Errorf("nothing produced on sch.out.once")
		}
		if lastOn(t, ctx, s, "sch.once") != nil {
			return fmt.Errorf("the one-shot schedule is still stored")
		}
		return nil
	})
	want := map[string]string{"Nats-Scheduler": "sch.once", "Nats-Schedule-Next": "purge", "Nats-TTL": "5m", "Custom": "kept",
		"Nats-Msg-Id": "", "Nats-Schedule": "", "Nats-Schedule-Target": "", "Nats-Rollup": ""}
	for k, v := range want {
		if got := out.Header.Get(k); got != v {
			t.Errorf("produced %s: %q, want %q", k, got, v)
		}
	}
	if string(out.Data) != "hello" {
		t.Errorf("produced data %q", out.Data)
	}

	if _, err := schedulePub(t, ctx, tb.js, "sch.every", "tick", "Nats-Schedule", "@every 5s", "Nats-Schedule-Target", "sch.out.every"); err != nil {
		t.Fatal(err)
	}
	produced := func(n uint64) func() error {
		return func() error {
			info, err := s.Info(ctx, jetstream.WithSubjectFilter("sch.out.every"))
			if err != nil {
				return err
			}
			if got := info.State.Subjects["sch.out.every"]; got != n {
				return fmt.Errorf("%d produced on sch.out.every, want %d", got, n)
			}
			return nil
		}
	}
	for n := range uint64(3) {
		advance(5 * time.Second)
		testwait.For(t, 20*time.Second, produced(n+1))
	}
	next := lastOn(t, ctx, s, "sch.out.every").Header.Get("Nats-Schedule-Next")
	if nt, err := time.Parse(time.RFC3339Nano, next); err != nil || nt.Before(clk.Now()) {
		t.Fatalf("Nats-Schedule-Next %q: %v, want after %v", next, err, clk.Now())
	}
	if lastOn(t, ctx, s, "sch.every") == nil {
		t.Fatal("the repeating schedule is gone")
	}
	for name, want := range map[string]float64{"jetgres_schedule_fired_total": 4, "jetgres_schedule_purges_total": 1, "jetgres_schedule_failures_total": 0} {
		if got := counterValue(t, tb.reg, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}

	// Stopped for a minute: the new bridge fires the missed time once, then every period.
	tb.stop(t)
	clk.Advance(time.Minute)
	tb = setup(t, setupOpts{db: tb.db, config: onClock})
	if s, err = tb.js.Stream(ctx, "SCH"); err != nil {
		t.Fatal(err)
	}
	advance(time.Second)
	testwait.For(t, 20*time.Second, produced(4))
	advance(5 * time.Second)
	testwait.For(t, 20*time.Second, produced(5))
}

// Two replicas on one database and one clock: only the one holding the stream's scheduler
// lock fires, so each period produces one message, not two; when it stops, the other takes
// the stream over and fires on.
func TestScheduleWithReplicas(t *testing.T) {
	t.Parallel()
	clk := clocktest.At(time.Now().Truncate(time.Second))
	a := setup(t, setupOpts{config: func(c *Config) { c.Clock = clk; c.ReplicaName = "a" }})
	ctx := testContext(t)
	s, err := a.js.CreateStream(ctx, jetstream.StreamConfig{Name: "SR", Subjects: []string{"sr.>"}, AllowMsgSchedules: true})
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, setupOpts{db: a.db, nats: a.nats, config: func(c *Config) { c.Clock = clk; c.ReplicaName = "b" }})
	testwait.For(t, 5*time.Second, func() error {
		_, err := b.js.Stream(ctx, "SR")
		return err
	})
	if _, err := schedulePub(t, ctx, a.js, "sr.sched", "tick", "Nats-Schedule", "@every 2s", "Nats-Schedule-Target", "sr.out"); err != nil {
		t.Fatal(err)
	}
	produced := func() uint64 {
		info, err := s.Info(ctx, jetstream.WithSubjectFilter("sr.out"))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects["sr.out"]
	}
	for n := range uint64(4) {
		clk.Advance(time.Second)
		clk.Advance(time.Second)
		testwait.For(t, 20*time.Second, func() error {
			if got := produced(); got != n+1 {
				return fmt.Errorf("%d produced, want %d", got, n+1)
			}
			return nil
		})
	}
	// a's bridge stops (its NATS server, b's too, stays): if it fired, b takes the stream
	// over and fires on from what PostgreSQL holds.
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := a.bridge.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	clk.Advance(time.Second)
	testwait.For(t, 20*time.Second, func() error {
		info, err := b.js.Stream(ctx, "SR")
		if err != nil {
			return err
		}
		if got := info.CachedInfo().State.Msgs; got < 6 {
			return fmt.Errorf("the stream holds %d messages, want the schedule and at least 5 produced", got)
		}
		return nil
	})
}
