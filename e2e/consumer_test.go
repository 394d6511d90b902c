package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/embedded/localpg"
	"github.com/jetgres/jetgres/internal/testwait"
)

// cliTimeout bounds one nats CLI command; benchTimeout one `nats bench` run, whose tens of
// thousands of messages take half a minute on a loaded machine under the race detector.
// Both only guard against a hang: speed is the bench command's business.
const (
	cliTimeout   = 30 * time.Second
	benchTimeout = 5 * time.Minute
)

// testDatabase starts a throwaway PostgreSQL cluster for one test and returns the URL of its
// database, for jetgres's --database-url. The cluster runs without fsync: these tests kill
// jetgres, never the machine. It is stopped when the test ends, after the jetgres started
// later has been (cleanups run last-in first-out).
func testDatabase(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := localpg.Start(ctx, localpg.Config{
		DataDir:  filepath.Join(newDataDir(t), "pg"),
		Settings: map[string]string{"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"},
	})
	if err != nil {
		t.Fatalf("test PostgreSQL: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("stopping the test PostgreSQL: %v", err)
		}
	})
	return c.DSN()
}

// startWithDatabase starts jetgres on dsn, with extra flags.
func startWithDatabase(t *testing.T, dsn string, args ...string) *jetgres {
	t.Helper()
	j := startJetgres(t, options{Args: append([]string{"--database-url", dsn}, args...)})
	failOnRace(t, j)
	return j
}

// failOnRace fails the test if jetgres, built with the race detector when the tests are,
// reports a data race: the process keeps running after one, so nothing else would notice.
// The harness prints jetgres's output for a failed test.
func failOnRace(t testing.TB, j *jetgres) {
	t.Cleanup(func() {
		if strings.Contains(j.logs.String(), "WARNING: DATA RACE") {
			t.Error("jetgres reported a data race")
		}
	})
}

// nats runs the nats CLI against j and returns its combined output, failing the test unless
// it exits 0 within cliTimeout.
func (j *jetgres) nats(t *testing.T, args ...string) string {
	t.Helper()
	return j.natsWithin(t, cliTimeout, args...)
}

// natsWithin is nats with its own bound.
func (j *jetgres) natsWithin(t *testing.T, within time.Duration, args ...string) string {
	t.Helper()
	// Finding the CLI may mean installing it, which must not count against the command.
	natsCLI(t)
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	start := time.Now()
	out, err := j.natsCmd(t, ctx, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("nats %s: %v after %v\n%s", strings.Join(args, " "), err, time.Since(start).Round(time.Millisecond), out)
	}
	return string(out)
}

// connect opens a nats.go connection to j, closed when the test ends.
func (j *jetgres) connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(j.natsURL, nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("connect to %s: %v", j.natsURL, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// publishWindow bounds the asynchronous publishes awaiting their PubAck: nats.go gives up
// on a publish that finds its own limit (4,000) reached for 200 ms, which a busy machine
// can make happen.
const publishWindow = 1000

// publishAll publishes n messages to subject, payload(i) for the i-th, and waits for every
// PubAck, failing the test on any publish error.
func publishAll(t testing.TB, ctx context.Context, js jetstream.JetStream, subject string, n int, payload func(i int) []byte) {
	t.Helper()
	futures := make([]jetstream.PubAckFuture, 0, publishWindow)
	settle := func() {
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			t.Fatalf("PubAcks for %s did not arrive: %v", subject, ctx.Err())
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				t.Fatalf("publish to %s: %v", subject, err)
			}
		}
		futures = futures[:0]
	}
	for i := range n {
		f, err := js.PublishAsync(subject, payload(i))
		if err != nil {
			t.Fatalf("publish %d to %s: %v", i, subject, err)
		}
		if futures = append(futures, f); len(futures) == publishWindow {
			settle()
		}
	}
	settle()
}

// metricValue reads one sample, named with its labels as /metrics prints them, from body.
func metricValue(t *testing.T, body, series string) float64 {
	t.Helper()
	for line := range strings.Lines(body) {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("/metrics: %s: %v", series, err)
			}
			return v
		}
	}
	t.Fatalf("/metrics has no %s", series)
	return 0
}

// wantAll fails the test unless out contains every one of want.
func wantAll(t *testing.T, what, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("%s: no %q in:\n%s", what, w, out)
		}
	}
}

// wantMatch fails the test unless out matches the regular expression re.
func wantMatch(t *testing.T, what, out, re string) {
	t.Helper()
	if !regexp.MustCompile(re).MatchString(out) {
		t.Errorf("%s: no match for %s in:\n%s", what, re, out)
	}
}

// TestNatsCLIStreamsAndConsumers drives streams and a pull consumer with the unmodified
// nats CLI, as the README's quick start does.
func TestNatsCLIStreamsAndConsumers(t *testing.T) {
	t.Parallel()
	j := startWithDatabase(t, testDatabase(t))

	out := j.nats(t, "stream", "add", "ORDERS", "--subjects", "orders.>", "--defaults")
	wantAll(t, "stream add", out, "Stream ORDERS was created", "orders.>")
	j.nats(t, "pub", "orders.new", "hi {{Count}}", "--count", "10")

	// A publish without a reply is stored without an answer, so the CLI exits before the
	// last of them commit: wait until all ten are there.
	testwait.For(t, 10*time.Second, func() error {
		out = j.nats(t, "stream", "info", "ORDERS")
		if !regexp.MustCompile(`Messages: 10\b`).MatchString(out) {
			return fmt.Errorf("stream info shows fewer than 10 messages:\n%s", out)
		}
		return nil
	})
	wantMatch(t, "stream info", out, `First Sequence: 1\b`)
	wantMatch(t, "stream info", out, `Last Sequence: 10\b`)
	out = j.nats(t, "stream", "ls")
	wantAll(t, "stream ls", out, "ORDERS")

	out = j.nats(t, "consumer", "add", "ORDERS", "C1", "--pull", "--defaults")
	wantAll(t, "consumer add", out, "C1", "Pull Mode: true")

	out = j.nats(t, "consumer", "next", "ORDERS", "C1", "--count", "5")
	for i := 1; i <= 5; i++ {
		wantMatch(t, "consumer next", out, fmt.Sprintf(`subj: orders\.new / tries: 1 / cons seq: %d / str seq: %d / pending: %d\b`, i, i, 10-i))
		wantAll(t, "consumer next", out, fmt.Sprintf("hi %d\n", i))
	}
	if n := strings.Count(out, "Acknowledged message"); n != 5 {
		t.Errorf("consumer next acknowledged %d messages, want 5:\n%s", n, out)
	}

	// The CLI's acks are fire-and-forget: the floor moves a moment after it exits.
	testwait.For(t, 10*time.Second, func() error {
		out = j.nats(t, "consumer", "info", "ORDERS", "C1")
		for _, re := range []string{
			`Last Delivered Message: Consumer sequence: 5 Stream sequence: 5\b`,
			`Acknowledgment Floor: Consumer sequence: 5 Stream sequence: 5\b`,
			`Outstanding Acks: 0 out of maximum 1,000\b`,
			`Unprocessed Messages: 5\b`,
			`Redelivered Messages: 0\b`,
		} {
			if !regexp.MustCompile(re).MatchString(out) {
				return fmt.Errorf("consumer info has no match for %s:\n%s", re, out)
			}
		}
		return nil
	})
	out = j.nats(t, "consumer", "ls", "ORDERS")
	wantAll(t, "consumer ls", out, "C1")
	j.nats(t, "consumer", "rm", "ORDERS", "C1", "-f")
	out = j.nats(t, "consumer", "ls", "ORDERS")
	if strings.Contains(out, "C1") {
		t.Errorf("consumer ls after rm still lists C1:\n%s", out)
	}

	out = j.nats(t, "req", "orders.new", "hi")
	wantMatch(t, "req", out, `\{"stream":"ORDERS",\s*"seq":11\}`)
	out = j.nats(t, "stream", "get", "ORDERS", "3")
	wantAll(t, "stream get", out, "orders.new", "hi 3")
	out = j.nats(t, "stream", "purge", "ORDERS", "-f")
	wantMatch(t, "stream purge", out, `Messages: 0\b`)
	wantMatch(t, "stream purge", out, `First Sequence: 12\b`)
	j.nats(t, "stream", "rm", "ORDERS", "-f")
	out = j.nats(t, "stream", "ls")
	if strings.Contains(out, "ORDERS") {
		t.Errorf("stream ls after rm still lists ORDERS:\n%s", out)
	}
}

// TestNatsBenchFetch runs `nats bench js pub` and then `nats bench js fetch` with every ack
// mode. Each fetch run creates the durable consumer nats-bench anew (the CLI creates it with
// the ack mode asked for, and an ack policy cannot be updated), so it is removed in between.
func TestNatsBenchFetch(t *testing.T) {
	t.Parallel()
	msgs := 200_000
	if raceEnabled() {
		// The race detector slows jetgres (built with it too) several times over.
		msgs = 50_000
	}
	j := startWithDatabase(t, testDatabase(t))
	count := strconv.Itoa(msgs)
	start := time.Now()
	out := j.natsWithin(t, benchTimeout, "bench", "js", "pub", "async", "bench.x", "--create", "--msgs", count, "--size", "128", "--no-progress")
	wantAll(t, "bench js pub", out, "msgs/sec")
	t.Logf("bench js pub async: %d messages in %v: %s", msgs, time.Since(start).Round(time.Millisecond), benchSummary(out))
	out = j.nats(t, "stream", "info", "benchstream", "--json")
	var si server.StreamInfo
	if err := json.Unmarshal([]byte(out), &si); err != nil || si.State.Msgs != uint64(msgs) {
		t.Fatalf("benchstream after the bench publish: %d messages (%v)\n%s", si.State.Msgs, err, out)
	}

	runs := []struct {
		name string
		args []string
		msgs int
	}{
		{"explicit", []string{"--acks", "explicit"}, msgs},
		{"all", []string{"--acks", "all"}, msgs},
		{"none", []string{"--acks", "none"}, msgs},
		// A double ack waits for its cursor write to commit, one message at a time: a few
		// thousand a second, so fewer of them.
		{"doubleack", []string{"--acks", "explicit", "--doubleack"}, msgs / 10},
	}
	for _, r := range runs {
		start := time.Now()
		args := append([]string{"bench", "js", "fetch", "--msgs", strconv.Itoa(r.msgs), "--batch", "500", "--no-progress"}, r.args...)
		out := j.natsWithin(t, benchTimeout, args...)
		wantAll(t, "bench js fetch "+r.name, out, "msgs/sec")
		t.Logf("bench js fetch %s: %d messages in %v: %s", r.name, r.msgs, time.Since(start).Round(time.Millisecond), benchSummary(out))

		// Plain acks are fire-and-forget: the last ones may land after the CLI exits.
		testwait.For(t, time.Minute, func() error {
			var ci server.ConsumerInfo
			if err := json.Unmarshal([]byte(j.nats(t, "consumer", "info", "benchstream", "nats-bench", "--json")), &ci); err != nil {
				return err
			}
			if ci.Delivered.Stream != uint64(r.msgs) {
				return fmt.Errorf("%s: delivered through %d, want %d", r.name, ci.Delivered.Stream, r.msgs)
			}
			if r.name != "none" && ci.AckFloor.Stream != uint64(r.msgs) {
				return fmt.Errorf("%s: ack floor %d, want %d", r.name, ci.AckFloor.Stream, r.msgs)
			}
			return nil
		})
		j.nats(t, "consumer", "rm", "benchstream", "nats-bench", "-f")
	}
}

// benchSummary is the line of a nats bench report with the rate.
func benchSummary(out string) string {
	for line := range strings.Lines(out) {
		if strings.Contains(line, "msgs/sec") {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

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
	if busyMax > 1 || busySamples > samples/10 {
		t.Errorf("parked pulls keep jetgres's backends busy: at most %d busy, busy in %d of %d samples", busyMax, busySamples, samples)
	}
	if acquiredSamples > samples/10 || popPermitSamples > samples/10 || waitingMin != conns*perConn {
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

// A key-value bucket through the unmodified CLI: buckets are streams with allow_direct, and
// the CLI reads keys with direct gets. (Watching, history and key listing are ordered push
// consumers: TestPushNatsCLIKeyValue.)
func TestNatsCLIKeyValue(t *testing.T) {
	t.Parallel()
	j := startWithDatabase(t, testDatabase(t))
	wantAll(t, "kv add", j.nats(t, "kv", "add", "CFG"), "KV_CFG")
	j.nats(t, "kv", "put", "CFG", "color", "red")
	j.nats(t, "kv", "put", "CFG", "color", "blue")
	wantAll(t, "kv get", j.nats(t, "kv", "get", "CFG", "color"), "blue", "revision: 2")
	if out := j.nats(t, "kv", "get", "CFG", "color", "--raw"); strings.TrimSpace(out) != "blue" {
		t.Errorf("kv get --raw printed %q, want blue", out)
	}
	j.nats(t, "kv", "create", "CFG", "size", "L")
	wantAll(t, "kv update", j.nats(t, "kv", "update", "CFG", "size", "XL", "3"), "XL")
	j.nats(t, "kv", "del", "CFG", "color", "-f")
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	out, err := j.natsCmd(t, ctx, "kv", "get", "CFG", "color").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "key not found") {
		t.Errorf("kv get of a deleted key: %v\n%s", err, out)
	}
}
