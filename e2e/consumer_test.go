package e2e

// Pull consumers across a jetgres's life: delivery resumed after a SIGKILL, parked pulls that
// hold no PostgreSQL connection, and Consume() and Messages() clients left idle.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// TestResumeAfterSIGKILL kills jetgres while a consumer is busy and starts it again on the
// same database: delivery resumes right after the persisted ack floor and every published
// message is acked at least once.
func TestResumeAfterSIGKILL(t *testing.T) {
	t.Parallel()
	const total = 5000
	dsn := testDatabase(t)
	// The same replica name takes the consumer's lease back at once instead of waiting for
	// the dead process's lease to run out.
	args := []string{"--replica-name", "e2e-sigkill"}
	j := startWithDatabase(t, dsn, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	nc, js := j.connect(t)
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "KILL", Subjects: []string{"kill.>"}})
	if err != nil {
		t.Fatal(err)
	}
	publishAll(t, ctx, js, "kill.id", total, func(i int) []byte { return []byte(strconv.Itoa(i)) })
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}

	// Before the kill: fetch and ack until jetgres dies under the consumer.
	var mu sync.Mutex
	acked := make(map[int]int) // payload id → acks sent
	consumed := make(chan struct{})
	fetchCtx, stopFetching := context.WithCancel(ctx)
	defer stopFetching()
	go func() {
		defer close(consumed)
		for {
			b, err := c.Fetch(20, jetstream.FetchContext(fetchCtx))
			if err != nil {
				return
			}
			for m := range b.Messages() {
				id, err := strconv.Atoi(string(m.Data()))
				if err != nil {
					t.Errorf("payload %q", m.Data())
					return
				}
				if m.Ack() != nil {
					return
				}
				mu.Lock()
				acked[id]++
				mu.Unlock()
			}
			if b.Error() != nil {
				return
			}
			// Stands for the work a client does per batch. Without it the 5,000 messages
			// are consumed in a few tens of milliseconds, too fast to be killed midway.
			time.Sleep(5 * time.Millisecond)
		}
	}()
	probe := openProbe(t, dsn, 1)
	floorOfC := func() uint64 {
		f, err := storedFloor(ctx, probe, "KILL", "C")
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	// Kill once a good part of the floor is in PostgreSQL, with the consumer still busy.
	testwait.For(t, time.Minute, func() error {
		if f := floorOfC(); f < total/3 {
			return fmt.Errorf("stored ack floor %d", f)
		}
		return nil
	})
	j.kill(t)
	stopFetching()
	<-consumed
	nc.Close()
	before := len(acked)
	if before == total {
		t.Fatal("every message was acked before the kill")
	}

	j2 := startWithDatabase(t, dsn, args...)
	_, js2 := j2.connect(t)
	c2, err := js2.Consumer(ctx, "KILL", "C")
	if err != nil {
		t.Fatal(err)
	}
	floor := c2.CachedInfo().AckFloor.Stream
	if stored := floorOfC(); floor != stored || floor < total/3 {
		t.Fatalf("ack floor after the restart %d, stored %d", floor, stored)
	}
	// Everything at or below the floor was acked before the kill (id i is sequence i+1).
	for id := range int(floor) {
		if acked[id] == 0 {
			t.Fatalf("sequence %d is below the persisted floor %d but was never acked", id+1, floor)
		}
	}
	t.Logf("killed with %d of %d messages acked; persisted ack floor %d", before, total, floor)

	// After the restart: delivery starts right after the floor, in order, and covers the rest.
	next := floor + 1
	for next <= total {
		b, err := c2.Fetch(int(min(500, total+1-next)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range b.Messages() {
			md, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			if md.Sequence.Stream != next {
				t.Fatalf("after the restart got sequence %d, want %d", md.Sequence.Stream, next)
			}
			id, err := strconv.Atoi(string(m.Data()))
			if err != nil || id != int(next)-1 {
				t.Fatalf("sequence %d carries %q", next, m.Data())
			}
			if err := m.Ack(); err != nil {
				t.Fatal(err)
			}
			acked[id]++
			next++
			n++
		}
		if err := b.Error(); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatalf("nothing after sequence %d of %d", next-1, total)
		}
	}
	twice := 0
	for id := range total {
		switch acked[id] {
		case 0:
			t.Fatalf("sequence %d was never acked", id+1)
		case 2:
			twice++
		}
	}
	t.Logf("all %d messages acked; %d of them twice, acked before the kill but above the persisted floor", total, twice)
	testwait.For(t, 10*time.Second, func() error {
		info, err := c2.Info(ctx)
		if err != nil {
			return err
		}
		if info.AckFloor.Stream != total || info.NumPending != 0 || info.NumAckPending != 0 {
			return fmt.Errorf("consumer at the end: floor %d, pending %d, ack pending %d", info.AckFloor.Stream, info.NumPending, info.NumAckPending)
		}
		return nil
	})
}

// TestParkedPullsHoldNoConnection parks 1,000 pull requests and shows in pg_stat_activity
// that none of them holds a PostgreSQL backend busy, then that a publish reaches the waiting
// consumers. That the local commit wakes them, not a poll, is bridge's
// TestParkedPullWokenByPublish, on a clock that stands still: here a wall clock would only
// measure the machine's load.
func TestParkedPullsHoldNoConnection(t *testing.T) {
	t.Parallel()
	const (
		conns      = 10
		perConn    = 100
		tickPeriod = 5 * time.Second
	)
	dsn := testDatabase(t)
	j := startWithDatabase(t, dsn, "--tick-period", tickPeriod.String())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	_, js := j.connect(t)
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PARK", Subjects: []string{"park.>"}})
	if err != nil {
		t.Fatal(err)
	}
	// The stream's first publish also sets up its storage; the measured one should not.
	if _, err := js.Publish(ctx, "park.warmup", nil); err != nil {
		t.Fatal(err)
	}
	// One consumer per connection keeps each under the default max_waiting of 512.
	var consumers []jetstream.Consumer
	for i := range conns {
		c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: fmt.Sprintf("C%d", i), FilterSubject: "park.wake"})
		if err != nil {
			t.Fatal(err)
		}
		consumers = append(consumers, c)
	}

	// Raw MSG.NEXT requests as Fetch(1) sends them, each with its own reply subject, all
	// answered through one wildcard subscription per connection. Idle heartbeats are
	// expected; a message or any other status before the publish is not.
	var heartbeats atomic.Int64
	delivered := make(chan time.Time, conns*perConn)
	unexpected := make(chan string, conns*perConn)
	onAnswer := func(m *nats.Msg) {
		switch {
		case string(m.Data) == "wake up":
			delivered <- time.Now()
		case len(m.Data) == 0 && m.Header.Get("Status") == "100":
			heartbeats.Add(1)
		default:
			unexpected <- fmt.Sprintf("%q %v", m.Data, m.Header)
		}
	}
	req, err := json.Marshal(server.JSApiConsumerGetNextRequest{Batch: 1, Expires: 30 * time.Second, Heartbeat: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := range conns {
		nc, _ := j.connect(t)
		prefix := nats.NewInbox()
		if _, err := nc.Subscribe(prefix+".*", onAnswer); err != nil {
			t.Fatal(err)
		}
		for k := range perConn {
			if err := nc.PublishRequest(fmt.Sprintf("$JS.API.CONSUMER.MSG.NEXT.PARK.C%d", i), fmt.Sprintf("%s.%d", prefix, k), req); err != nil {
				t.Fatal(err)
			}
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, 30*time.Second, func() error {
		waiting := 0
		for _, c := range consumers {
			info, err := c.Info(ctx)
			if err != nil {
				return err
			}
			waiting += info.NumWaiting
		}
		if waiting != conns*perConn {
			return fmt.Errorf("%d pull requests waiting, want %d", waiting, conns*perConn)
		}
		return nil
	})

	// Watch jetgres's backends for a while: idle pooled connections are fine, a backend
	// running a statement or sitting in a transaction is what a held connection looks like.
	probe := openProbe(t, dsn, 1)
	// jetgres's own view, from /metrics, must agree: pool connections in use and pop lane
	// permits held stay at (about) zero while every pull waits.
	const samples = 40
	busyMax, busySamples, idleMax := 0, 0, 0
	var acquiredMax, popPermitsMax, waitingMin float64 = 0, 0, conns * perConn
	// Background work (ticks, lease renewal, the SQL mover's look, retention) takes a pooled
	// connection for a moment now and then, two of them at once when they coincide; a
	// parked pull that held one would show in every sample.
	acquiredSamples, popPermitSamples := 0, 0
	busyWith := make(map[string]bool) // what the busy backends were running
	for range samples {
		var busy, idle int
		err := func() error {
			rows, err := probe.Query(ctx, `
				SELECT state, query FROM pg_stat_activity
				WHERE datname = current_database() AND application_name = 'jetgres'`)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var state, query string
				if err := rows.Scan(&state, &query); err != nil {
					return err
				}
				if state == "idle" {
					idle++
					continue
				}
				busy++
				busyWith[state+": "+strings.Join(strings.Fields(query), " ")] = true
			}
			return rows.Err()
		}()
		if err != nil {
			t.Fatal(err)
		}
		busyMax, idleMax = max(busyMax, busy), max(idleMax, idle)
		_, body := j.mustGet(t, "/metrics")
		acquired, popPermits := metricValue(t, body, "jetgres_pg_pool_acquired_conns"), metricValue(t, body, "jetgres_pop_vegas_in_flight")
		acquiredMax, popPermitsMax = max(acquiredMax, acquired), max(popPermitsMax, popPermits)
		if acquired > 0 {
			acquiredSamples++
		}
		if popPermits > 0 {
			popPermitSamples++
		}
		waitingMin = min(waitingMin, metricValue(t, body, `jetgres_consumers_total_messages{kind="waiting"}`))
		if busy > 0 {
			busySamples++
		}
		time.Sleep(50 * time.Millisecond) // spreads the samples over two seconds
	}
	t.Logf("%d parked pulls; jetgres backends over %d samples: at most %d busy (busy in %d samples), at most %d idle",
		conns*perConn, samples, busyMax, busySamples, idleMax)
	t.Logf("jetgres metrics over the same samples: at most %.0f pool connections in use (in %d samples), at most %.0f pop permits held (in %d samples), at least %.0f requests waiting",
		acquiredMax, acquiredSamples, popPermitsMax, popPermitSamples, waitingMin)
	for q := range busyWith {
		t.Logf("busy backend seen: %.200s", q)
	}
	// The maintainer's pass, once a second, may be seen in any number of samples when the
	// machine is loaded; a parked pull that held a connection would be a thousand of them.
	if busyMax > 1 || acquiredMax > 1 {
		t.Errorf("parked pulls keep jetgres's backends busy: at most %d busy (in %d of %d samples), at most %.0f pool connections in use", busyMax, busySamples, samples, acquiredMax)
	}
	if popPermitSamples > samples/10 || waitingMin != conns*perConn {
		t.Errorf("jetgres's metrics: connections in use in %d of %d samples (at most %.0f), pop permits held in %d (at most %.0f), %.0f requests waiting",
			acquiredSamples, samples, acquiredMax, popPermitSamples, popPermitsMax, waitingMin)
	}
	select {
	case m := <-unexpected:
		t.Fatalf("a parked pull was answered before any publish: %s", m)
	case <-delivered:
		t.Fatal("a parked pull got a message before any publish")
	default:
	}

	start := time.Now()
	if _, err := js.Publish(ctx, "park.wake", []byte("wake up")); err != nil {
		t.Fatal(err)
	}
	// Every consumer hands the message to one of its waiting requests.
	var first, last time.Duration
	for got := 0; got < conns; got++ {
		select {
		case at := <-delivered:
			d := at.Sub(start)
			if got == 0 {
				first = d
			}
			last = max(last, d)
		case m := <-unexpected:
			t.Fatalf("unexpected answer to a parked pull: %s", m)
		case <-time.After(time.Minute):
			t.Fatalf("%d of %d consumers delivered the message within a minute", got, conns)
		}
	}
	t.Logf("publish to first delivery %v, to all %d consumers %v (tick period %v; %d idle heartbeats meanwhile)",
		first.Round(time.Microsecond), conns, last.Round(time.Microsecond), tickPeriod, heartbeats.Load())
}

// TestConsumeAndMessagesIdle leaves Consume() and Messages() consumers idle for 20 s, with
// the clients' default pull settings and with short expiries and heartbeats, and checks that
// no error surfaces and that messages published afterwards arrive.
func TestConsumeAndMessagesIdle(t *testing.T) {
	t.Parallel()
	const idle = 20 * time.Second
	j := startWithDatabase(t, testDatabase(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, js := j.connect(t)
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IDLE", Subjects: []string{"idle.>"}})
	if err != nil {
		t.Fatal(err)
	}

	// Short settings cross several expiries (408, then a new pull) and several windows in
	// which the client would notice two missing heartbeats; the defaults (expiry 30 s,
	// heartbeat 15 s) make it send one pull and see one heartbeat.
	const expiry, heartbeat = 5 * time.Second, 2 * time.Second
	errs := make(chan error, 100)
	type run struct {
		name string
		got  chan string
		stop func()
	}
	var runs []*run
	for _, mode := range []string{"consume", "messages"} {
		for _, short := range []bool{false, true} {
			r := &run{name: mode + "_defaults", got: make(chan string, 100)}
			if short {
				r.name = mode + "_short"
			}
			fail := func(err error) { errs <- fmt.Errorf("%s: %w", r.name, err) }
			c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: r.name})
			if err != nil {
				t.Fatal(err)
			}
			switch mode {
			case "consume":
				opts := []jetstream.PullConsumeOpt{jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) { fail(err) })}
				if short {
					opts = append(opts, jetstream.PullExpiry(expiry), jetstream.PullHeartbeat(heartbeat))
				}
				cc, err := c.Consume(func(m jetstream.Msg) {
					_ = m.Ack()
					r.got <- string(m.Data())
				}, opts...)
				if err != nil {
					t.Fatal(err)
				}
				r.stop = cc.Stop
			case "messages":
				opts := []jetstream.PullMessagesOpt{jetstream.WithMessagesErrOnMissingHeartbeat(true)}
				if short {
					opts = append(opts, jetstream.PullExpiry(expiry), jetstream.PullHeartbeat(heartbeat))
				}
				it, err := c.Messages(opts...)
				if err != nil {
					t.Fatal(err)
				}
				done := make(chan struct{})
				go func() {
					defer close(done)
					for {
						m, err := it.Next()
						if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
							return
						}
						if err != nil {
							fail(err)
							continue
						}
						_ = m.Ack()
						r.got <- string(m.Data())
					}
				}()
				r.stop = func() { it.Stop(); <-done }
			}
			runs = append(runs, r)
		}
	}
	defer func() {
		for _, r := range runs {
			r.stop()
		}
	}()

	// Idling is what is under test: any error while it lasts fails at once.
	select {
	case err := <-errs:
		t.Fatalf("error while idle: %v", err)
	case <-time.After(idle):
	}
	for _, r := range runs {
		select {
		case m := <-r.got:
			t.Errorf("%s: message %q while idle", r.name, m)
		default:
		}
	}
	for i := range 5 {
		if _, err := js.Publish(ctx, "idle.x", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range runs {
		for i := range 5 {
			select {
			case m := <-r.got:
				if m != strconv.Itoa(i) {
					t.Fatalf("%s: got %q, want %d", r.name, m, i)
				}
			case err := <-errs:
				t.Fatal(err)
			case <-time.After(5 * time.Second):
				t.Fatalf("%s: message %d never came after the idle time", r.name, i)
			}
		}
	}
}
