package e2e

// Fault tests: what jetgres keeps when things break. Each test logs a FIGURES line with
// the numbers the reliability issue asks for. JETGRES_SOAK=1 runs the long variants.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/bridge"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// TestCrashUnderLoad kills jetgres with SIGKILL while several clients publish
// asynchronously with message ids and a client consumes, then starts it again on the same
// database, in rounds. The publishers retry whatever was not acknowledged with the same id.
// In the end every acknowledged message is in the stream exactly once, at the sequence its
// PubAck named, with no gap; after each restart the consumer resumes right after its
// persisted ack floor; and every acknowledged message was delivered at least once.
func TestCrashUnderLoad(t *testing.T) {
	t.Parallel()
	const (
		stream     = "CRASH"
		publishers = 4
	)
	rounds, loadFor, timeout := 1, 1500*time.Millisecond, 3*time.Minute
	if soak() {
		rounds, loadFor, timeout = 6, 8*time.Second, 15*time.Minute
	}
	dsn := testDatabase(t)
	// The same replica name takes the consumer's lease back at once after a restart.
	args := []string{"--replica-name", "e2e-crash"}
	j := startWithDatabase(t, dsn, args...)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	probe := openProbe(t, dsn, 1)

	_, js := j.connect(t)
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"crash.>"}, Duplicates: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	var pubs []*publisher
	for i := range publishers {
		pubs = append(pubs, newPublisher(fmt.Sprintf("p%d", i), stream, fmt.Sprintf("crash.p%d", i), 128, 256))
	}
	cons := newConsumerClient(stream, "C")

	type roundFigures struct {
		ackedAtKill, idsAtKill int
		floor                  uint64
	}
	var figs []roundFigures
	replayed := 0
	for round := 0; round <= rounds; round++ {
		final := round == rounds
		if round > 0 {
			// Resume after the persisted ack floor.
			_, js := j.connect(t)
			c, err := js.Consumer(ctx, stream, "C")
			if err != nil {
				t.Fatal(err)
			}
			stored, err := storedFloor(ctx, probe, stream, "C")
			if err != nil {
				t.Fatal(err)
			}
			if f := c.CachedInfo().AckFloor.Stream; f != stored {
				t.Fatalf("round %d: ack floor after the restart %d, stored %d", round, f, stored)
			}
			figs[round-1].floor = stored
			replayed += replayAcked(t, ctx, js, pubs, 50)
		}
		loadCtx, stopLoad := context.WithCancel(ctx)
		var wg sync.WaitGroup
		startPublishers(t, loadCtx, &wg, j.natsURL, pubs)
		consumeCtx, stopConsuming := context.WithCancel(ctx)
		var cwg sync.WaitGroup
		cwg.Go(func() {
			// The pause stands for a client's work per batch, so that the consumer is still
			// busy when jetgres is killed.
			if err := cons.run(consumeCtx, j.natsURL, 2*time.Millisecond); err != nil {
				t.Errorf("consumer: %v", err)
			}
		})
		if !final {
			// Kill once load ran for a while and the consumer's floor moved in PostgreSQL.
			startFloor, _ := storedFloor(ctx, probe, stream, "C")
			time.Sleep(loadFor)
			testwait.For(t, time.Minute, func() error {
				f, err := storedFloor(ctx, probe, stream, "C")
				if err != nil {
					return err
				}
				if f <= startFloor {
					return fmt.Errorf("stored ack floor still %d", f)
				}
				return nil
			})
			sum := summarize(pubs)
			j.kill(t)
			figs = append(figs, roundFigures{ackedAtKill: sum.acked, idsAtKill: sum.ids})
			t.Logf("round %d: killed with %d message ids sent, %d acknowledged", round, sum.ids, sum.acked)
			stopLoad()
			stopConsuming()
			wg.Wait()
			cwg.Wait()
			j = startWithDatabase(t, dsn, args...)
			continue
		}
		// The last run: the publishers retry until every id has its PubAck, then stop; the
		// consumer takes everything.
		waitAllAcked(t, pubs, time.Minute)
		stopLoad()
		wg.Wait()
		_, js2 := j.connect(t)
		c2, err := js2.Consumer(ctx, stream, "C")
		if err != nil {
			t.Fatal(err)
		}
		testwait.For(t, time.Minute, func() error {
			info, err := c2.Info(ctx)
			if err != nil {
				return err
			}
			if info.NumPending != 0 || info.NumAckPending != 0 || info.AckFloor.Stream != info.Delivered.Stream {
				return fmt.Errorf("consumer: floor %d, delivered %d, pending %d, ack pending %d",
					info.AckFloor.Stream, info.Delivered.Stream, info.NumPending, info.NumAckPending)
			}
			return nil
		})
		stopConsuming()
		cwg.Wait()
		js = js2
	}

	// Each restart resumed right after the persisted floor.
	cons.mu.Lock()
	roundFirst := cons.roundFirst
	cons.mu.Unlock()
	for r := 1; r < len(roundFirst) && r <= len(figs); r++ {
		if want := figs[r-1].floor + 1; roundFirst[r] != want {
			t.Errorf("round %d: first delivery after the restart was sequence %d, want %d (floor %d + 1)", r, roundFirst[r], want, figs[r-1].floor)
		}
	}

	sum := summarize(pubs)
	if len(sum.conflicts) > 0 {
		t.Errorf("ids acknowledged with two sequences: %v", sum.conflicts[:min(5, len(sum.conflicts))])
	}
	acked := ackedSeqs(pubs)
	a := auditStream(t, ctx, js, stream, acked)
	if a.foreign > 0 {
		t.Errorf("%d messages in the stream without a publisher's id", a.foreign)
	}
	notDelivered := 0
	cons.mu.Lock()
	for id := range acked {
		if cons.delivered[id] == 0 {
			notDelivered++
		}
	}
	cons.mu.Unlock()
	if notDelivered > 0 {
		t.Errorf("%d acknowledged messages were never delivered to the consumer", notDelivered)
	}
	deliveries, distinct, twice := cons.stats()
	t.Logf("FIGURES crash: kills=%d acked=%d lost=%d duplicated_in_stream=%d stream_msgs=%d last_seq=%d "+
		"retried_ids=%d retries_answered_duplicate=%d replayed_acked_ids=%d (all answered duplicate) deliveries=%d distinct_delivered=%d delivered_more_than_once=%d redelivered_by_server=%d never_delivered=%d",
		rounds, sum.acked, a.lost, a.dupIDs, a.msgs, a.lastSeq,
		sum.attempts-sum.ids, sum.dupAcks, replayed, deliveries, distinct, twice, cons.redelivered, notDelivered)
	for r, f := range figs {
		t.Logf("round %d: %d acked of %d sent at the kill; persisted floor %d; first delivery after restart %d", r, f.ackedAtKill, f.idsAtKill, f.floor, roundFirst[r+1])
	}
	if a.lost != 0 || a.dupIDs != 0 || a.wrongSeq != 0 || a.msgs != len(acked) {
		t.Errorf("stream holds %d messages for %d acknowledged ids: %d lost, %d duplicated, %d at another sequence", a.msgs, len(acked), a.lost, a.dupIDs, a.wrongSeq)
	}
}

// TestDatabaseDown stops PostgreSQL for 10 s under load and starts it again, without
// restarting jetgres. Publishers get errors within the statement timeout, nothing
// acknowledged is lost, /readyz reports the outage and the recovery, the append lane shrinks
// during the fault and grows back after it, and publishing and fetching work again.
func TestDatabaseDown(t *testing.T) {
	t.Parallel()
	const (
		streams     = 24
		stmtTimeout = 2 * time.Second
	)
	downFor, warm, settle, timeout := []time.Duration{10 * time.Second}, 3*time.Second, 8*time.Second, 3*time.Minute
	if soak() {
		// The long outage outlasts the consumer leases (30 s): the process must keep them.
		downFor, warm, settle, timeout = []time.Duration{10 * time.Second, 45 * time.Second, 10 * time.Second, 10 * time.Second}, 10*time.Second, 30*time.Second, 15*time.Minute
	}
	db := startPGServer(t)
	j := startWithDatabase(t, db.dsn(), append(seedAppendLane, "--stmt-timeout", stmtTimeout.String(), "--replica-name", "e2e-dbdown")...)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	_, js := j.connect(t)
	var pubs []*publisher
	for i := range streams {
		name := fmt.Sprintf("DOWN%d", i)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{fmt.Sprintf("down%d.>", i)}, Duplicates: 10 * time.Minute}); err != nil {
			t.Fatal(err)
		}
		p := newPublisher(fmt.Sprintf("d%d", i), name, fmt.Sprintf("down%d.x", i), 256, 128)
		// A publish whose commit got no answer when PostgreSQL stopped, and that cannot be
		// read back before it is up again, is left unanswered: the client retries it with
		// the same id once its own timeout passes, as a JetStream client must.
		p.ackTimeout = 5 * time.Second
		pubs = append(pubs, p)
	}
	s0, err := js.Stream(ctx, "DOWN0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s0.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	cons := newConsumerClient("DOWN0", "C")

	smp := startSampler(j, 100*time.Millisecond)
	t0 := time.Now()
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	startPublishers(t, loadCtx, &wg, j.natsURL, pubs)
	wg.Go(func() {
		if err := cons.run(loadCtx, j.natsURL, 0); err != nil {
			t.Errorf("consumer: %v", err)
		}
	})
	// The loaded publishers' waits include their own clients' queues (up to 128 publishes
	// each, behind a connection shared with their retries) and the CPU the machine gives
	// them: a measure of the client, not of jetgres. A probe with a connection of its own and
	// one publish at a time, on a loaded stream, sees what jetgres makes a publisher wait.
	probe := &probePublisher{}
	wg.Go(func() {
		if err := probe.run(loadCtx, j.natsURL, "down1.probe", stmtTimeout); err != nil {
			t.Errorf("probe publisher: %v", err)
		}
	})

	type outage struct {
		stopAt, downAt, startAt, upAt time.Time
		unready, ready, firstAck      time.Time
		firstDelivery                 time.Time
		errs                          int
	}
	var outs []outage
	time.Sleep(warm)
	for _, down := range downFor {
		var o outage
		o.stopAt = time.Now()
		if err := db.stop(); err != nil {
			t.Fatal(err)
		}
		o.downAt = time.Now()
		testwait.For(t, stmtTimeout+2*time.Second, func() error {
			if code, _, err := j.get("/readyz"); err != nil || code != 503 {
				return fmt.Errorf("/readyz answered %d (%v) with PostgreSQL down", code, err)
			}
			return nil
		})
		o.unready = time.Now()
		time.Sleep(time.Until(o.downAt.Add(down)))
		o.startAt = time.Now()
		if err := db.start(); err != nil {
			t.Fatal(err)
		}
		o.upAt = time.Now()
		// Recovery: /readyz, a PubAck, and a delivery, all without restarting jetgres.
		testwait.For(t, time.Minute, func() error {
			if o.ready.IsZero() {
				if code, _, err := j.get("/readyz"); err == nil && code == 200 {
					o.ready = time.Now()
				}
			}
			if o.firstAck.IsZero() {
				o.firstAck = firstAckAfter(pubs, o.upAt)
			}
			if o.firstDelivery.IsZero() {
				cons.mu.Lock()
				if cons.lastAt.After(o.upAt) {
					o.firstDelivery = cons.lastAt
				}
				cons.mu.Unlock()
			}
			if o.ready.IsZero() || o.firstAck.IsZero() || o.firstDelivery.IsZero() {
				return fmt.Errorf("not recovered: ready %v, PubAck %v, delivery %v", o.ready, o.firstAck, o.firstDelivery)
			}
			return nil
		})
		o.errs = errorsBetween(pubs, o.stopAt, o.upAt)
		if o.errs == 0 {
			t.Errorf("no publisher got an error while PostgreSQL was down")
		}
		outs = append(outs, o)
		time.Sleep(settle)
	}
	if j.hasExited() {
		t.Fatalf("jetgres exited: %v", j.waitErr)
	}
	// Everything sent is acknowledged in the end: the retries got through.
	waitAllAcked(t, pubs, time.Minute)
	stopLoad()
	wg.Wait()
	samples := smp.stop()

	// A sync publish and a fetch through a fresh connection work after the faults.
	_, js2 := j.connect(t)
	if _, err := js2.Publish(ctx, "down0.after", []byte("after"), jetstream.WithMsgID("after-1")); err != nil {
		t.Fatalf("publish after recovery: %v", err)
	}
	c2, err := js2.Consumer(ctx, "DOWN0", "C")
	if err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, func() error {
		b, err := c2.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return err
		}
		for m := range b.Messages() {
			_ = m.Ack()
			if string(m.Data()) == "after" {
				return nil
			}
		}
		return fmt.Errorf("the message published after recovery was not fetched yet")
	})

	sum := summarize(pubs)
	// A publish waiting while PostgreSQL is stopped, and sent before it is started again,
	// waits for the flush in flight on its stream, then for its own, and a flush for a
	// connection and then for its statements, each bounded by the statement timeout. (Once
	// it is back, a loaded machine can make the backlog's transactions time out one after
	// another, each within the timeout, as with a slow database: there only the hang guard
	// below applies.)
	errBound := 4*stmtTimeout + time.Second
	for k, o := range outs {
		if d := probe.longestErrWait(o.stopAt, o.startAt); d > errBound {
			t.Errorf("outage %d: a publish of the probe waited %v for its error, more than %v", k, d, errBound)
		}
	}
	if len(probe.errs) == 0 {
		t.Errorf("the probe publisher got no error while PostgreSQL was down: %d answered", probe.acks)
	}
	// The loaded clients queue on their side too, the more so when the machine is loaded:
	// for them this only guards against a hang.
	hang := 10 * stmtTimeout
	if raceEnabled() {
		hang *= 3
	}
	if d := probe.longestErrWait(t0, time.Now()); d > hang {
		t.Errorf("a publish of the probe waited %v for its error", d)
	}
	for code, d := range sum.maxErrIn {
		if d > hang {
			t.Errorf("a publish waited %v for its error (err_code %d)", d, code)
		}
	}
	if len(sum.conflicts) > 0 {
		t.Errorf("ids acknowledged with two sequences: %v", sum.conflicts[:min(5, len(sum.conflicts))])
	}
	lost, dups, total := 0, 0, 0
	for i := range streams {
		name := fmt.Sprintf("DOWN%d", i)
		a := auditStream(t, ctx, js2, name, ackedFor(pubs, name))
		lost += a.lost
		dups += a.dupIDs
		total += a.msgs
	}
	before := between(samples, t0.Add(time.Second), outs[0].stopAt)
	loBefore, hiBefore := limitRange(before)
	var loDuring, lastAfter float64
	for k, o := range outs {
		during := between(samples, o.downAt, o.upAt)
		lo, _ := limitRange(during)
		if k == 0 {
			loDuring = lo
		}
		// Every append transaction fails without an answer, so the lane falls to its minimum.
		// (On a loaded machine it may be there already, or /metrics may not have answered
		// before the outage.)
		if lo > seedAppendMin || (hiBefore > seedAppendMin && lo >= hiBefore) {
			t.Errorf("outage %d: the append lane limit did not shrink to its minimum %d: %g during the outage, up to %g before", k, seedAppendMin, lo, hiBefore)
		}
		unready := 0
		for _, s := range between(samples, o.unready, o.startAt) {
			if s.ready != 503 {
				unready++
			}
		}
		if unready > 0 {
			t.Errorf("outage %d: /readyz answered other than 503 %d times while PostgreSQL was down", k, unready)
		}
		t.Logf("outage %d: stop took %v, /readyz 503 after %v; start took %v; /readyz 200 after %v, first PubAck after %v, first delivery after %v; %d errors answered; push limit during %g; trace:%s",
			k, o.downAt.Sub(o.stopAt).Round(time.Millisecond), o.unready.Sub(o.downAt).Round(time.Millisecond),
			o.upAt.Sub(o.startAt).Round(time.Millisecond), o.ready.Sub(o.upAt).Round(time.Millisecond),
			o.firstAck.Sub(o.upAt).Round(time.Millisecond), o.firstDelivery.Sub(o.upAt).Round(time.Millisecond), o.errs, lo,
			limitTrace(between(samples, o.stopAt.Add(-2*time.Second), o.upAt.Add(settle)), o.stopAt))
	}
	last := outs[len(outs)-1]
	after := between(samples, last.upAt, time.Now())
	_, hiAfter := limitRange(after)
	if n := len(after); n > 0 {
		lastAfter = after[n-1].pushLimit
	}
	if hiAfter <= loDuring {
		t.Errorf("the append lane limit did not grow back after the outage: %g during, at most %g after", loDuring, hiAfter)
	}
	errCodes := make([]string, 0, len(sum.errs))
	for code, n := range sum.errs {
		errCodes = append(errCodes, fmt.Sprintf("%d:%d (longest wait %v)", code, n, sum.maxErrIn[code].Round(time.Millisecond)))
	}
	o := outs[0]
	t.Logf("FIGURES database-down: outages=%d down_for=%v acked=%d lost=%d duplicated_in_stream=%d stream_msgs=%d retries_answered_duplicate=%d errors=[%s] "+
		"probe_answers=%d probe_errors=%d probe_longest_error_wait=%v (while down %v) recover_readyz=%v recover_puback=%v recover_delivery=%v append_limit_before=%g..%g during_min=%g after_max=%g after_last=%g",
		len(downFor), downFor, sum.acked, lost, dups, total, sum.dupAcks, strings.Join(errCodes, " "), probe.acks+len(probe.errs), len(probe.errs), probe.longestErrWait(t0, time.Now()).Round(time.Millisecond), probe.longestErrWait(o.stopAt, o.startAt).Round(time.Millisecond),
		o.ready.Sub(o.upAt).Round(time.Millisecond), o.firstAck.Sub(o.upAt).Round(time.Millisecond), o.firstDelivery.Sub(o.upAt).Round(time.Millisecond),
		loBefore, hiBefore, loDuring, hiAfter, lastAfter)
}

// holdStreamLocks locks every stream's state row in one transaction for d: every push
// transaction then waits on the lock until its statement timeout. It returns when the
// locks are taken; the transaction ends (rolls back) after d.
func holdStreamLocks(t testing.TB, ctx context.Context, probe *rawsql.Pool, d time.Duration) <-chan error {
	t.Helper()
	locked := make(chan int, 1)
	done := make(chan error, 1)
	go func() {
		done <- probe.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error {
			var n int
			if err := q.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM jetgres.stream_state FOR UPDATE) l`).Scan(&n); err != nil {
				return err
			}
			locked <- n
			return q.Exec(ctx, `SELECT pg_sleep($1)`, d.Seconds())
		})
	}()
	select {
	case n := <-locked:
		t.Logf("holding the row locks of %d streams for %v", n, d)
	case err := <-done:
		t.Fatalf("locking the stream rows: %v", err)
	}
	return done
}

// seedAppendLane gives the append lane the seed's band, for the tests that watch its limit fall
// during a fault and grow back after it: the default band keeps the limit at its minimum
// whenever the database is the bottleneck, as it is on a small machine, where a fall and a
// recovery cannot show. seedAppendMin is its minimum.
var seedAppendLane = []string{"--append-limit-init", "16", "--append-limit-min", fmt.Sprint(seedAppendMin),
	"--append-vegas-alpha", "3", "--append-vegas-beta", "6"}

const seedAppendMin = 4

// TestSlowDatabase makes PostgreSQL slow on purpose, by holding the row lock of every
// stream's state for a while: every append transaction then waits on the lock until its
// statement timeout. Load arrives while it is slow: every client publishes as fast as it
// may, with up to 16 MiB unanswered. The append lane limit falls, the intake sheds load with
// 503/10023 (counted as intake_full) instead of growing, and the process's resident memory
// stays bounded. Once the lock goes, everything sent is stored, once. Each intake holds
// 1 MiB, little against what its client has unanswered: every timed-out transaction empties
// it, and it must fill again within a statement timeout however loaded the machine is.
//
// A lane moves only while it is driven (at most one permit idle), and a stream has at most
// one transaction in flight, so there are as many streams as the lane's 16 initial permits.
// The estimate of queued work can never exceed the limit, so timeouts shrink the limit to
// about the Vegas beta (6), not below. The lane is at rest before the fault: any load at all
// moves the limit, to where the database (not the fault) puts it.
func TestSlowDatabase(t *testing.T) {
	t.Parallel()
	const (
		streams     = 16
		intakeBytes = 1 << 20
		stmtTimeout = 2 * time.Second
		payload     = 2048
		maxPending  = 8192
	)
	lockFor, settle, timeout := 10*time.Second, time.Second, 3*time.Minute
	if soak() {
		lockFor, settle, timeout = 120*time.Second, 10*time.Second, 15*time.Minute
	}
	dsn := testDatabase(t)
	j := startWithDatabase(t, dsn, append(seedAppendLane, "--intake-bytes", fmt.Sprint(intakeBytes), "--stmt-timeout", stmtTimeout.String())...)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	probe := openProbe(t, dsn, 2)

	_, js := j.connect(t)
	var pubs []*publisher
	for i := range streams {
		name := fmt.Sprintf("SLOW%d", i)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{fmt.Sprintf("slow%d.>", i)}, Duplicates: 10 * time.Minute}); err != nil {
			t.Fatal(err)
		}
		pubs = append(pubs, newPublisher(fmt.Sprintf("s%d", i), name, fmt.Sprintf("slow%d.x", i), payload, maxPending))
	}
	// Publishing works before the fault: one message a stream, one at a time (which also
	// creates each stream's storage).
	for i := range streams {
		if _, err := js.Publish(ctx, fmt.Sprintf("slow%d.first", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	rssIdle, err := vmRSS(j.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	smp := startSampler(j, 100*time.Millisecond)
	t0 := time.Now()
	time.Sleep(time.Second)

	lockAt := time.Now()
	released := holdStreamLocks(t, ctx, probe, lockFor)
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	startPublishers(t, loadCtx, &wg, j.natsURL, pubs)
	if err := <-released; err != nil {
		t.Fatalf("holding the stream locks: %v", err)
	}
	unlockAt := time.Now()
	// The burst ends with the fault; the clients wait for the answers still due, without
	// retrying what failed (that would only prolong the test), and publishing works again.
	stopPublishing(pubs)
	var recovered time.Time
	testwait.For(t, time.Minute, func() error {
		if recovered = firstAckAfter(pubs, unlockAt); recovered.IsZero() {
			return errors.New("no PubAck since the lock was released")
		}
		return nil
	})
	// A publish to every stream then succeeds, once its stream's backlog is stored. The
	// backlog goes in transactions of up to 8,192 messages a stream, which on a loaded
	// machine (other test packages run beside this one) can themselves pass the 2 s statement
	// timeout; the publish caught in one is refused, as retryable, and sent again, as a
	// client would.
	for i := range streams {
		testwait.For(t, time.Minute, func() error {
			if _, err := js.Publish(ctx, fmt.Sprintf("slow%d.after", i), nil); err != nil {
				return fmt.Errorf("publish after the lock was released: %w", err)
			}
			return nil
		})
	}
	allAnsweredAt := time.Now()
	time.Sleep(settle)
	stopLoad()
	wg.Wait()
	samples := smp.stop()
	if j.hasExited() {
		t.Fatalf("jetgres exited: %v", j.waitErr)
	}

	before := between(samples, t0, lockAt)
	during := between(samples, lockAt, unlockAt)
	after := between(samples, unlockAt, time.Now())
	loBefore, hiBefore := limitRange(before)
	// The limit steps down as transactions time out, a round every statement timeout, and
	// those begun during the fault end up to one timeout after it: on a loaded machine fewer
	// rounds fit in the fault itself, so the last one counts too.
	loDuring, _ := limitRange(between(samples, lockAt, unlockAt.Add(stmtTimeout)))
	_, hiAfter := limitRange(after)
	// The limit moves only while the lane is driven (at most one permit idle). A machine too
	// loaded for the clients to keep all the streams' transactions in flight at once never
	// drives it, and then the limit rightly stays where it was. Once a sample sees the lane
	// driven, the first of those transactions to time out sees it so too and shrinks the
	// limit.
	driven := false
	for _, s := range between(samples, lockAt, unlockAt.Add(stmtTimeout)) {
		driven = driven || (s.pushLimit > 0 && s.pushIn >= s.pushLimit-1)
	}
	if driven && loDuring >= loBefore {
		t.Errorf("the append lane limit did not fall although the lane was driven: %g..%g before, down to %g while the database was slow", loBefore, hiBefore, loDuring)
	}
	rejAt := func(ss []processSample) float64 {
		if len(ss) == 0 {
			return 0
		}
		return ss[len(ss)-1].rejected["intake_full"]
	}
	batchesAt := func(ss []processSample) (over256, over1024 float64) {
		if len(ss) == 0 {
			return 0, 0
		}
		return ss[len(ss)-1].over256, ss[len(ss)-1].over1024
	}
	// A flush takes its stream's whole intake, and an intake holds at most intakeBytes/payload
	// (512) of these messages: no flush may take more than 1,024 of them. Only a flush that
	// took more than half an intake shows a client offering at the rate that fills one
	// within a statement timeout, and as many of them as there are streams that the clients
	// kept that rate up; a machine too loaded for that (both sides under the race
	// detector beside other test packages) sheds nothing, and rightly so.
	big, _ := batchesAt(during)
	bigBefore, _ := batchesAt(before)
	filled := big-bigBefore >= streams
	if _, huge := batchesAt(samples); huge > 0 {
		t.Errorf("%g flushes took more than 1,024 messages from an intake bounded at %d bytes (%d messages)", huge, intakeBytes, intakeBytes/payload)
	}
	shed := rejAt(during) - rejAt(before)
	if filled && shed <= 0 {
		t.Errorf("no publish was rejected with intake_full while the database was slow")
	}
	sum := summarize(pubs)
	if filled && sum.errs[10023] == 0 {
		t.Errorf("no publisher was answered 503/10023 while the database was slow: %v", sum.errs)
	}
	if !driven || !filled {
		t.Logf("the clients did not keep up with the fault: lane driven %v, %g flushes took more than half an intake", driven, big-bigBefore)
	}
	// In jetgres a publish waits for its stream's transaction in flight, then for a permit
	// (one of the transactions in flight ends), then for its own: each bounded by the
	// statement timeout. Under the burst it also queues in its client and in the NATS server
	// (which stalls fast producers), so the clients see longer waits, the more so when both
	// sides run with the race detector; this only guards against a hang.
	hang := 10 * stmtTimeout
	if raceEnabled() {
		hang *= 3
	}
	for code, d := range sum.maxErrIn {
		if d > hang {
			t.Errorf("a publish waited %v for its error (err_code %d)", d, code)
		}
	}
	// Resident memory: the idle process, plus per stream the intake (--intake-bytes), the
	// batch in flight (taken from the intake, so as much again) and the tail cache, twice over
	// for the garbage collector's headroom, plus slack for connections and buffers.
	peak := peakRSS(during)
	perStream := int64(2*intakeBytes + bridge.TailBytesDefault)
	grow := 2*streams*perStream + 128<<20
	if raceEnabled() {
		grow *= 3 // the race detector's shadow memory
	}
	bound := rssIdle + grow
	if peak > bound {
		t.Errorf("resident memory peaked at %s while the database was slow, above the bound %s (%s idle)", mib(peak), mib(bound), mib(rssIdle))
	}
	// And it levels off once the intakes are full: the last third of the slow spell holds
	// little more than the middle one. (The first seconds fill the intakes.) Under the race
	// detector resident memory also counts shadow memory for every address the heap ever
	// touched, which keeps growing as the garbage collector moves the heap around, so there
	// only the bound above applies.
	third := lockFor / 3
	middle := peakRSS(between(samples, lockAt.Add(third), lockAt.Add(2*third)))
	last := peakRSS(between(samples, lockAt.Add(2*third), unlockAt))
	if !raceEnabled() && last > middle+middle/10+32<<20 {
		t.Errorf("resident memory kept growing while the database was slow: %s in the middle third, %s in the last", mib(middle), mib(last))
	}
	// Once the lock is gone everything sent is stored, once.
	lost, dups, total := 0, 0, 0
	for i := range streams {
		name := fmt.Sprintf("SLOW%d", i)
		a := auditStream(t, ctx, js, name, ackedFor(pubs, name))
		lost += a.lost
		dups += a.dupIDs
		total += a.msgs
	}
	errCodes := make([]string, 0, len(sum.errs))
	for code, n := range sum.errs {
		errCodes = append(errCodes, fmt.Sprintf("%d:%d (longest wait %v)", code, n, sum.maxErrIn[code].Round(time.Millisecond)))
	}
	t.Logf("push limit trace:%s", limitTrace(samples, lockAt))
	t.Logf("RSS trace:%s", rssTrace(samples, lockAt))
	t.Logf("FIGURES slow-database: lock_for=%v intake_bytes=%d streams=%d first_puback_after_unlock=%v sync_publish_ok_after_unlock=%v leaf_replies_refused=%g acked=%d lost=%d duplicated_in_stream=%d stream_msgs=%d retries_answered_duplicate=%d errors=[%s] intake_full_rejected_during=%g flushes_over_half_an_intake=%g lane_driven=%v "+
		"rss_idle=%s rss_peak_slow=%s (middle third %s, last third %s) rss_bound=%s append_limit_before=%g..%g during_min=%g after_max=%g",
		lockFor, intakeBytes, streams, recovered.Sub(unlockAt).Round(time.Millisecond), allAnsweredAt.Sub(unlockAt).Round(time.Millisecond), samples[len(samples)-1].leafSlow, sum.acked, lost, dups, total, sum.dupAcks, strings.Join(errCodes, " "), shed, big-bigBefore, driven,
		mib(rssIdle), mib(peak), mib(middle), mib(last), mib(bound), loBefore, hiBefore, loDuring, hiAfter)
}
