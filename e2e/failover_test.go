package e2e

// Failover and switchover of a replicated PostgreSQL under load (issue 31): jetgres runs on
// a two-host --database-url with target_session_attrs=read-write, in front of a primary and
// a streaming standby that pgtest.StartPair starts, while publishers send several thousand
// messages a second and a durable consumer acks. Then the primary dies or is shut down and
// the standby is promoted.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

const (
	failoverStream   = "FAILOVER"
	failoverConsumer = "DURABLE"
	failoverPubs     = 4
	// failoverWindow is each publisher's window of unanswered publishes.
	failoverWindow = 256
	// failoverBatch is how many PubAcks each phase of a test waits for.
	failoverBatch = 4000
	// resumeBound is how soon after the promotion publishing must resume.
	resumeBound = time.Second
)

// failoverRun is one test's pair, jetgres, load and what the checks need.
type failoverRun struct {
	t    *testing.T
	pair *pgtest.PrimaryStandby
	j    *jetgres
	js   jetstream.JetStream
	pubs []*onePub
	cons *ackingConsumer

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startFailoverRun starts the pair, jetgres on it, the stream, the durable consumer and the
// load, and waits for failoverBatch PubAcks.
func startFailoverRun(t *testing.T, cfg pgtest.PairConfig) *failoverRun {
	r := &failoverRun{t: t, pair: pgtest.StartPair(t, cfg)}
	r.j = startWithDatabase(t, r.pair.URL())
	_, r.js = r.j.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := r.js.CreateStream(ctx, jetstream.StreamConfig{Name: failoverStream, Subjects: []string{"failover.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.js.CreateConsumer(ctx, failoverStream, jetstream.ConsumerConfig{
		Durable: failoverConsumer, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second,
	}); err != nil {
		t.Fatal(err)
	}
	load, stop := context.WithCancel(context.Background())
	r.cancel = stop
	t.Cleanup(r.stop)
	for i := range failoverPubs {
		p := newOnePub(fmt.Sprintf("p%d", i), fmt.Sprintf("failover.%d", i))
		r.pubs = append(r.pubs, p)
		r.wg.Go(func() {
			if err := p.run(load, r.j.natsURL, failoverWindow, 10*time.Second); err != nil {
				t.Errorf("publisher %s: %v", p.name, err)
			}
		})
	}
	r.cons = &ackingConsumer{stream: failoverStream, name: failoverConsumer}
	r.wg.Go(func() {
		if err := r.cons.run(load, r.j.natsURL); err != nil {
			t.Errorf("consumer: %v", err)
		}
	})
	began := time.Now()
	r.waitAcks(time.Time{}, failoverBatch)
	took := time.Since(began)
	t.Logf("before the fault: %d PubAcks in %v, %.0f msg/s", failoverBatch, took.Round(time.Millisecond), failoverBatch/took.Seconds())
	return r
}

func (r *failoverRun) stop() {
	r.cancel()
	r.wg.Wait()
}

// waitAcks waits for n PubAcks after since.
func (r *failoverRun) waitAcks(since time.Time, n int) {
	r.t.Helper()
	testwait.For(r.t, 2*time.Minute, func() error {
		if got := ackedSince(r.pubs, since); got < n {
			return fmt.Errorf("%d PubAcks since %v, want %d (%+v)", got, since.Format(time.StampMilli), n, totals(r.pubs))
		}
		return nil
	})
}

// promoted waits for publishing to resume after the promotion asked for at asked and found
// done at done, and returns how long after done the first PubAck came to a publish sent
// after asked: negative when it came before pg_promote, which looks every 100 ms, saw the
// promotion done.
func (r *failoverRun) promoted(asked, done time.Time) time.Duration {
	r.t.Helper()
	r.waitAcks(asked, failoverBatch)
	first := firstAckSince(r.pubs, asked)
	r.t.Logf("the promotion took %v (pg_promote); the first PubAck to a publish sent since came %v after it was done",
		done.Sub(asked).Round(time.Millisecond), first.Sub(done).Round(time.Millisecond))
	return first.Sub(done)
}

// finish stops the load, waits for the durable consumer to have been given every message
// the new primary holds, and returns the stream as the database holds it.
func (r *failoverRun) finish() (stored map[uint64]string, last uint64) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	db := rawsql.Open(r.t, r.pair.URL())
	// The publishers stop first; the consumer keeps going until it has everything.
	for _, p := range r.pubs {
		p.stopSending()
	}
	testwait.For(r.t, time.Minute, func() error {
		// Publishes sent before the stop may still be committing: read once every one is
		// answered or given up on, or the stream read would miss what their PubAcks name.
		for _, p := range r.pubs {
			if n := p.outstanding(); n > 0 {
				return fmt.Errorf("publisher %s waits for %d answers", p.name, n)
			}
		}
		var err error
		stored, last, err = storedIDs(ctx, db, failoverStream)
		if err != nil {
			return err
		}
		if missing := missingDeliveries(r.cons, stored); len(missing) > 0 {
			return fmt.Errorf("the durable consumer was not given %d of the %d stored messages, first %v", len(missing), len(stored), missing[0])
		}
		return nil
	})
	r.stop()
	return stored, last
}

// missingDeliveries lists the stored messages the consumer was never given at their
// sequence.
func missingDeliveries(c *ackingConsumer, stored map[uint64]string) []string {
	deliveries, _, _ := c.snapshot()
	given := make(map[uint64]map[string]bool)
	for _, d := range deliveries {
		if given[d.seq] == nil {
			given[d.seq] = make(map[string]bool)
		}
		given[d.seq][d.id] = true
	}
	var missing []string
	for seq, id := range stored {
		if !given[seq][id] {
			missing = append(missing, fmt.Sprintf("%d:%s", seq, id))
		}
	}
	return missing
}

// noticedAt is when jetgres logged that another server serves the database.
func (r *failoverRun) noticedAt() time.Time {
	r.t.Helper()
	for line := range strings.Lines(r.j.logs.String()) {
		if !strings.Contains(line, `msg="PostgreSQL is served by another server`) {
			continue
		}
		if v, ok := strings.CutPrefix(strings.Fields(line)[0], "time="); ok {
			at, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				r.t.Fatalf("the time of %q: %v", line, err)
			}
			return at
		}
	}
	r.t.Fatal("jetgres did not log that another server serves the database")
	return time.Time{}
}

// check makes the checks every case shares on the stream the database holds: its sequences
// are dense; no publish answered as failed was stored; an acknowledged publish is stored
// once, at the sequence of its PubAck, unless lossy allows it to be gone; every message a
// new consumer reads, and every delivery to the durable consumer, is what the database holds
// at that sequence. Where the database lost messages (lossy), jetgres may have delivered
// them before it could know, from the primary's death until it reached the new primary: then
// only the deliveries after that count, and those before are logged. It returns how many
// acknowledged publishes are gone.
func (r *failoverRun) check(stored map[uint64]string, last uint64, lossy bool) (lost int) {
	t := r.t
	t.Helper()
	var since time.Time
	if lossy {
		since = r.noticedAt()
	}
	for seq := uint64(1); seq <= last; seq++ {
		if _, ok := stored[seq]; !ok {
			t.Errorf("sequence %d of %d is not stored: the sequences are not dense", seq, last)
			break
		}
	}
	seqOf := make(map[string][]uint64, len(stored))
	for seq, id := range stored {
		seqOf[id] = append(seqOf[id], seq)
	}
	answers := allAnswers(r.pubs)
	failedStored := 0
	for id, a := range answers {
		seqs := seqOf[id]
		switch {
		case a.failed != "" && len(seqs) > 0:
			failedStored++
			if failedStored <= 5 {
				t.Errorf("%s was answered %q but is stored at %v", id, a.failed, seqs)
			}
		case a.failed != "":
		case len(seqs) == 0 && lossy:
			lost++
		case len(seqs) != 1 || seqs[0] != a.seq:
			t.Errorf("%s was acknowledged with sequence %d but is stored at %v", id, a.seq, seqs)
		}
	}
	for id, seqs := range seqOf {
		if len(seqs) > 1 {
			t.Errorf("%s is stored %d times, at %v", id, len(seqs), seqs)
		}
	}
	if failedStored > 0 {
		t.Errorf("%d publishes answered as failed were stored", failedStored)
	}
	deliveries, floor, regressions := r.cons.snapshot()
	wrong, before := 0, 0
	for _, d := range deliveries {
		switch {
		case stored[d.seq] == d.id:
		case d.at.Before(since):
			before++
		default:
			if wrong++; wrong <= 5 {
				t.Errorf("the durable consumer was given %s at sequence %d at %s; the database holds %q there",
					d.id, d.seq, d.at.Format(time.StampMilli), stored[d.seq])
			}
		}
	}
	if lossy {
		t.Logf("jetgres noticed the new primary at %s; before, the durable consumer was given %d messages that it lacks (while the old primary held them, or before jetgres reached the new one)",
			since.Format(time.StampMilli), before)
	}
	if !lossy && len(regressions) > 0 {
		t.Errorf("the durable consumer was given %d messages again whose acks were confirmed, first: %s", len(regressions), regressions[0])
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fresh, err := readAll(ctx, r.js, failoverStream, last)
	if err != nil {
		t.Errorf("reading the stream through a new consumer: %v", err)
	}
	for seq := uint64(1); seq <= last; seq++ {
		if fresh[seq] != stored[seq] {
			t.Errorf("a new consumer was given %q at sequence %d; the database holds %q", fresh[seq], seq, stored[seq])
			break
		}
	}
	// Gets answer from the stream's get index and tail where they can: the last messages,
	// which a rewind gave to others, and a sample of the rest.
	s, err := r.js.Stream(ctx, failoverStream)
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= last; seq++ {
		if seq%97 != 0 && seq+50 < last {
			continue
		}
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Errorf("get of sequence %d: %v", seq, err)
			break
		}
		if string(m.Data) != stored[seq] {
			t.Errorf("a get of sequence %d answered %q; the database holds %q", seq, m.Data, stored[seq])
			break
		}
	}
	tot := totals(r.pubs)
	t.Logf("published %d (and %d refused by the client, its window full): %d acknowledged, %d answered as failed, %d unanswered; stored %d (last sequence %d); "+
		"acknowledged and gone: %d; durable consumer: %d deliveries, confirmed floor %d",
		tot.sent, tot.unsent, tot.acked, tot.failed, tot.timedOut, len(stored), last, lost, len(deliveries), floor)
	return lost
}

// changeMetrics logs what jetgres counted of the server change and of its consumers'
// fencing, checks that it noticed the change, and returns the metrics.
func (r *failoverRun) changeMetrics() map[string]float64 {
	r.t.Helper()
	m, err := r.j.metrics()
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Logf("server changes %v, rewinds %v, rewound sequences %v, consumer fencings %v",
		m["jetgres_database_server_changes_total"], m["jetgres_database_rewinds_total"],
		m["jetgres_database_rewound_messages_total"], m["jetgres_consumer_fencings_total"])
	if m["jetgres_database_server_changes_total"] < 1 {
		r.t.Error("jetgres did not notice that another server serves the database")
	}
	return m
}

// noRewind checks that jetgres reported no loss where a synchronous standby lost nothing.
func (r *failoverRun) noRewind() {
	r.t.Helper()
	if m := r.changeMetrics(); m["jetgres_database_rewinds_total"] != 0 {
		r.t.Errorf("jetgres_database_rewinds_total = %v after a synchronous standby's promotion, want 0", m["jetgres_database_rewinds_total"])
	}
}

// TestFailoverSynchronousStandby (a): the primary is killed with SIGKILL under load and
// its synchronous standby promoted. Nothing acknowledged is lost, and publishing resumes
// within resumeBound of the promotion.
func TestFailoverSynchronousStandby(t *testing.T) {
	promoteSynchronous(t, (*pgtest.PrimaryStandby).KillPrimary)
}

// TestSwitchoverSynchronousStandby (b): a planned switchover under load, the primary shut
// down (fast) and the standby promoted.
func TestSwitchoverSynchronousStandby(t *testing.T) {
	promoteSynchronous(t, (*pgtest.PrimaryStandby).StopPrimary)
}

// promoteSynchronous ends the primary of a synchronous pair under load with stop, promotes
// the standby, and checks that nothing acknowledged was lost, nothing was rewound, and
// publishing resumed within resumeBound of the promotion.
func promoteSynchronous(t *testing.T, stop func(*pgtest.PrimaryStandby)) {
	r := startFailoverRun(t, pgtest.PairConfig{Synchronous: true})
	stop(r.pair)
	gap := r.promoted(r.pair.Promote())
	stored, last := r.finish()
	r.check(stored, last, false)
	r.noRewind()
	if gap > resumeBound {
		t.Errorf("publishing resumed %v after the promotion, want within %v", gap, resumeBound)
	}
}

// TestFailoverAsynchronousStandbyBehind (c): an asynchronous standby stops receiving, the
// primary commits (and jetgres acknowledges) more, then dies, and the standby is promoted
// without those commits. jetgres must say what the new primary lacks, and serve only what
// it holds: the lost sequences go to new messages, which every consumer is given.
func TestFailoverAsynchronousStandbyBehind(t *testing.T) {
	r := startFailoverRun(t, pgtest.PairConfig{})
	r.pair.DetachStandby()
	r.waitAcks(time.Now(), failoverBatch)
	r.pair.KillPrimary()
	r.promoted(r.pair.Promote())
	stored, last := r.finish()
	lost := r.check(stored, last, true)
	if lost == 0 {
		t.Fatal("no acknowledged publish was lost: the test did not make the new primary behind")
	}
	logs := r.j.logs.String()
	if !strings.Contains(logs, "the database is behind what this process saw") {
		t.Error("jetgres did not log that the new primary is behind")
	}
	m := r.changeMetrics()
	if m["jetgres_database_rewinds_total"] < 1 {
		t.Errorf("jetgres_database_rewinds_total = %v, want at least 1", m["jetgres_database_rewinds_total"])
	}
	if m["jetgres_database_rewound_messages_total"] < 1 {
		t.Errorf("jetgres_database_rewound_messages_total = %v, want at least 1", m["jetgres_database_rewound_messages_total"])
	}
}
