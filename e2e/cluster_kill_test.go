package e2e

// A replica SIGKILLed again and again under publish load: delivery resumes elsewhere before a
// lease passes, and every acknowledged publish is stored once and delivered.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// TestReplicaKillsUnderLoad SIGKILLs the replica serving a durable pull consumer, under
// publish load spread over all three replicas, five times in a row, starting it again after
// each. Publishers retry what was not acknowledged with the same Nats-Msg-Id, wherever they
// can connect. Every round, delivery resumes on another replica before a lease passes; in the end every
// acknowledged publish is stored exactly once, with no gap, and was delivered.
func TestReplicaKillsUnderLoad(t *testing.T) {
	t.Parallel()
	const stream = "KILLS"
	rounds := 5
	dsn := testDatabase(t)
	c := newCluster(t, dsn, 3, "--lease", takeoverLease.String())
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	_, js := c.rep(0).connect(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"kills.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "work", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}

	pubCtx, stopPub := context.WithCancel(ctx)
	defer stopPub()
	var pubWG sync.WaitGroup
	var pubs []*publisher
	for i := range 3 {
		p := newPublisher(fmt.Sprintf("p%d", i+1), stream, fmt.Sprintf("kills.p%d", i+1), 64, 256)
		p.rate.Store(1000)
		p.ackTimeout = 3 * time.Second
		pubs = append(pubs, p)
		pubWG.Go(func() {
			for k := i; pubCtx.Err() == nil; k++ {
				r := c.rep(k % 3)
				if r.hasExited() {
					continue
				}
				if err := p.run(pubCtx, r.natsURL, time.Second); err != nil {
					time.Sleep(50 * time.Millisecond) // a replica starting again
				}
			}
		})
	}

	log := &deliveryLog{counts: make(map[uint64]int)}
	fetchCtx, stopFetch := context.WithCancel(ctx)
	defer stopFetch()
	var fetchWG sync.WaitGroup
	var fetchErrs atomic.Int64 // a Fetch refused at once, while the client reconnects
	for range 2 {
		nc, err := nats.Connect(c.urls(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		fjs, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		cons, err := fjs.Consumer(ctx, stream, "work")
		if err != nil {
			t.Fatal(err)
		}
		fetchWG.Go(func() {
			for fetchCtx.Err() == nil {
				// A pull waiting at the killed replica is lost with it; the client pulls again
				// after the wait plus a second, so a short wait leaves the 2 s bound room on a
				// loaded machine.
				batch, err := cons.Fetch(50, jetstream.FetchMaxWait(250*time.Millisecond))
				if err != nil {
					fetchErrs.Add(1)
					continue
				}
				for m := range batch.Messages() {
					md, err := m.Metadata()
					if err != nil {
						continue
					}
					log.note(md.Sequence.Stream, md.NumDelivered > 1)
					_ = m.Ack()
				}
			}
		})
	}

	var resumes, takeovers []time.Duration
	for round := range rounds {
		before := log.distinct()
		testwait.For(t, time.Minute, func() error {
			if log.distinct() < before+500 {
				return fmt.Errorf("round %d: %d delivered, waiting for 500 more under load", round+1, log.distinct()-before)
			}
			return nil
		})
		victim := c.serving(1)
		if victim < 0 {
			t.Fatalf("round %d: no replica reports serving the consumer", round+1)
		}
		c.rep(victim).kill(t)
		killed := time.Now()
		var taken time.Time
		testwait.For(t, 30*time.Second, func() error {
			if c.serving(1) < 0 {
				return errors.New("no replica serves the consumer yet")
			}
			taken = time.Now()
			return nil
		})
		var resumed time.Time
		testwait.For(t, 30*time.Second, func() error {
			if resumed = log.firstAfter(taken); resumed.IsZero() {
				return errors.New("no delivery since the takeover")
			}
			return nil
		})
		resumes = append(resumes, resumed.Sub(killed))
		takeovers = append(takeovers, taken.Sub(killed))
		c.restart(victim)
	}

	waitAllAcked(t, pubs, 2*time.Minute)
	stopPub()
	pubWG.Wait()
	acked := ackedSeqs(pubs)
	testwait.For(t, 2*time.Minute, func() error {
		if n := log.distinct(); n < len(acked) {
			return fmt.Errorf("%d of %d acknowledged publishes delivered", n, len(acked))
		}
		return nil
	})
	stopFetch()
	fetchWG.Wait()

	_, ajs := c.rep(0).connect(t)
	r := auditStream(t, ctx, ajs, stream, acked)
	log.mu.Lock()
	deliveries, again := len(log.times), log.again
	log.mu.Unlock()
	t.Logf("FIGURES rounds=%d acked=%d stored=%d lost=%d stored_twice=%d deliveries=%d redelivered=%d fetch_refused=%d takeover_seen_after=%v resume_after_sigkill=%v",
		rounds, len(acked), r.msgs, r.lost, r.dupIDs, deliveries, again, fetchErrs.Load(), takeovers, resumes)
	if r.lost != 0 || r.dupIDs != 0 || r.wrongSeq != 0 || r.foreign != 0 {
		t.Errorf("%d acknowledged publishes lost, %d stored twice, %d at another sequence, %d foreign", r.lost, r.dupIDs, r.wrongSeq, r.foreign)
	}
	for i, d := range resumes {
		if d >= takeoverLease {
			t.Errorf("round %d: delivery resumed %v after the SIGKILL, not before the lease of %v", i+1, d, takeoverLease)
		}
	}
}
