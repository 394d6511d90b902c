package bridge

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestTickSeesOtherReplicaCommits runs two bridges on one database: a consumer served by
// one learns of messages committed by the other only through its ticker, and a parked pull
// gets them within the ticker's idle back-off. The serving bridge's clock stands still
// unless the test moves it, so only its ticker can deliver, and only when its clock says so.
func TestTickSeesOtherReplicaCommits(t *testing.T) {
	t.Parallel()
	clock := clocktest.New()
	a := setup(t, setupOpts{config: func(c *Config) { c.ReplicaName = "a"; c.Clock = clock }})
	ctx := testContext(t)
	s := newStream(t, ctx, a, "TK", "tk")
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C"})
	if err != nil {
		t.Fatal(err)
	}
	// b loads the stream at start and takes publishes for it; a keeps the consumer's lease.
	b := setup(t, setupOpts{db: a.db, config: func(c *Config) { c.ReplicaName = "b" }})
	testwait.For(t, 30*time.Second, func() error {
		_, err := b.js.Stream(ctx, "TK")
		return err
	})

	for round := 1; round <= 2; round++ {
		got := make(chan []uint64, 1)
		go func() {
			var seqs []uint64
			batch, err := c.Fetch(1, jetstream.FetchMaxWait(time.Minute))
			if err == nil {
				for m := range batch.Messages() {
					md, _ := m.Metadata()
					_ = m.Ack()
					seqs = append(seqs, md.Sequence.Stream)
				}
			}
			got <- seqs
		}()
		testwait.For(t, 30*time.Second, func() error {
			info, err := c.Info(ctx)
			if err != nil || info.NumWaiting != 1 {
				return fmt.Errorf("info %+v, %v", info, err)
			}
			return nil
		})
		// The ticker polls every TickPeriod while parked consumers appear and backs off to
		// TickIdleMaxDefault while nothing moves: moved on a tick period at a time, the clock
		// brings it to the longest wait.
		testwait.For(t, 30*time.Second, func() error {
			if clock.TimerDueIn(TickIdleMaxDefault) {
				return nil
			}
			clock.Advance(TickPeriodDefault)
			return fmt.Errorf("the ticker did not back off to %v", TickIdleMaxDefault)
		})
		if _, err := b.js.Publish(ctx, "tk", nil); err != nil {
			t.Fatal(err)
		}
		// One longest wait of the clock, and no more, brings the commit made elsewhere. The
		// minute only bounds a hang.
		clock.Advance(TickIdleMaxDefault)
		select {
		case seqs := <-got:
			if !slices.Equal(seqs, []uint64{uint64(round)}) {
				t.Fatalf("round %d: got %v", round, seqs)
			}
		case <-time.After(time.Minute):
			t.Fatalf("round %d: the commit made elsewhere did not arrive within the ticker's longest wait", round)
		}
	}
}

// TestReadAheadFromPostgres consumes a backlog that only PostgreSQL holds (the tail cache
// starts empty after a restart), with a filter, in batches: the read-ahead and the
// background reads that top it up must hand out every matching message once, in order.
func TestReadAheadFromPostgres(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "RA", "ra.*")
	const total = 5000
	for i := 1; i <= total; i++ {
		subject := "ra.even"
		if i%2 == 1 {
			subject = "ra.odd"
		}
		if _, err := tb.js.PublishAsync(subject, nil); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 0 {
			<-tb.js.PublishAsyncComplete()
		}
	}
	if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", FilterSubject: "ra.odd"}); err != nil {
		t.Fatal(err)
	}
	db := tb.db
	tb.stop(t)

	tb = setup(t, setupOpts{db: db})
	var c jetstream.Consumer
	testwait.For(t, 5*time.Second, func() error {
		var err error
		c, err = tb.js.Consumer(ctx, "RA", "C")
		return err
	})
	want := uint64(1)
	for want <= total {
		got := fetchSeqs(t, c, 300, 5*time.Second, func(m jetstream.Msg) { _ = m.Ack() })
		if len(got) == 0 {
			t.Fatalf("nothing from sequence %d on", want)
		}
		for _, q := range got {
			if q != want {
				t.Fatalf("got sequence %d, want %d", q, want)
			}
			want += 2
		}
	}
	if reads := counterValue(t, tb.reg, "jetgres_consumer_db_reads_total"); reads < 3 {
		t.Fatalf("%v reads of PostgreSQL for a backlog of %d messages", reads, total)
	}
}

// publishBacklog publishes total messages of data to subject, a thousand at a time.
func publishBacklog(t *testing.T, tb *testBundle, subject string, data []byte, total int) {
	t.Helper()
	for i := 1; i <= total; i++ {
		if _, err := tb.js.PublishAsync(subject, data); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 0 {
			<-tb.js.PublishAsyncComplete()
		}
	}
}

// wantAllInOrder reads total messages from sub and wants stream sequences 1 to total.
func wantAllInOrder(t *testing.T, sub *nats.Subscription, total int) {
	t.Helper()
	for i, m := range nextMsgs(t, sub, total, 30*time.Second) {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if md.Sequence.Stream != uint64(i+1) {
			t.Fatalf("message %d has sequence %d", i+1, md.Sequence.Stream)
		}
	}
}

// series finds the series of the metric called name in reg: the only one when label is
// "", else the one whose label has value.
func series(t testing.TB, reg *prometheus.Registry, name, label, value string) (*dto.Metric, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" && len(mf.GetMetric()) == 1 {
				return m, true
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m, true
				}
			}
		}
	}
	return nil, false
}

// counterValue reads a counter without labels from reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	m, ok := series(t, reg, name, "", "")
	if !ok {
		t.Fatalf("no counter %s", name)
	}
	return m.GetCounter().GetValue()
}

// gaugeValue reads a gauge without labels from reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	m, ok := series(t, reg, name, "", "")
	if !ok {
		t.Fatalf("no gauge %s", name)
	}
	return m.GetGauge().GetValue()
}

// reasonCount reads the reason series of a counter labelled by reason from reg, 0 before
// the first.
func reasonCount(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	return labelCount(t, reg, name, "reason", reason)
}

// labelCount reads the series of a counter whose label is value from reg, 0 before the
// first.
func labelCount(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	m, _ := series(t, reg, name, label, value)
	return m.GetCounter().GetValue()
}

// TestCatchUpSwitchesToTail drains, with a push consumer, a backlog of which the tail
// cache holds only the newest messages: the read-ahead reads PostgreSQL up to where the
// cache starts and no further, and every message from there on comes from the cache.
func TestCatchUpSwitchesToTail(t *testing.T) {
	t.Parallel()
	const total = 3000
	data := make([]byte, 100)
	msgSize := int((&pg.Message{Subject: "cu.x", Data: data}).Size())
	tb := setup(t, setupOpts{config: func(c *Config) { c.TailTotalBytes = 300 * msgSize }})
	ctx := testContext(t)
	newStream(t, ctx, tb, "CU", "cu.>")
	publishBacklog(t, tb, "cu.x", data, total)
	s := tb.bridge.streams.Lookup("CU")
	tail := s.Tail()
	start := tail.Start()
	if start <= ReadAheadMsgs || start > total {
		t.Fatalf("the tail starts at %d: the test wants a backlog well behind it", start)
	}
	sub, err := legacyJS(t, tb.nc).SubscribeSync("cu.>", nats.AckNone(), nats.DeliverAll())
	if err != nil {
		t.Fatal(err)
	}
	wantAllInOrder(t, sub, total)
	if got := tail.Start(); got != start {
		t.Fatalf("the tail moved from %d to %d with nothing published", start, got)
	}
	hits := counterValue(t, tb.reg, "jetgres_tail_cache_hits_total")
	if want := float64(total - start + 1); hits != want {
		t.Fatalf("%v deliveries from the tail cache, want the %v it holds", hits, want)
	}
}

// TestCatchUpSharesReads starts two push consumers at the start of a backlog behind the
// tail cache while the pop lane's only permit is held: the second joins the first one's
// read of PostgreSQL rather than read the same rows again, and both get every message.
func TestCatchUpSharesReads(t *testing.T) {
	t.Parallel()
	const total = 3000
	data := make([]byte, 100)
	msgSize := int((&pg.Message{Subject: "sr.x", Data: data}).Size())
	pop, err := flow.NewLane("pop", flow.Options{Init: 1, Min: 1, Max: 1, Alpha: flow.AlphaDefault, Beta: flow.BetaDefault})
	if err != nil {
		t.Fatal(err)
	}
	tb := setup(t, setupOpts{config: func(c *Config) {
		c.TailTotalBytes = 300 * msgSize
		c.Pop = pop
	}})
	ctx := testContext(t)
	newStream(t, ctx, tb, "SR", "sr.>")
	publishBacklog(t, tb, "sr.x", data, total)
	permit, err := pop.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	js := legacyJS(t, tb.nc)
	var subs []*nats.Subscription
	for range 2 {
		sub, err := js.SubscribeSync("sr.>", nats.AckNone(), nats.DeliverAll())
		if err != nil {
			permit.Abandon()
			t.Fatal(err)
		}
		subs = append(subs, sub)
	}
	// Both consumers went to PostgreSQL, where the first waits for the permit.
	testwait.For(t, 10*time.Second, func() error {
		if n := counterValue(t, tb.reg, "jetgres_tail_cache_misses_total"); n < 2 {
			return fmt.Errorf("%v consumers behind the tail", n)
		}
		return nil
	})
	permit.Abandon()
	for _, sub := range subs {
		wantAllInOrder(t, sub, total)
	}
	if shared := counterValue(t, tb.reg, "jetgres_consumer_db_reads_shared_total"); shared < 1 {
		t.Fatalf("%v reads shared by consumers at the same position", shared)
	}
	t.Logf("%v reads of PostgreSQL, %v shared", counterValue(t, tb.reg, "jetgres_consumer_db_reads_total"), counterValue(t, tb.reg, "jetgres_consumer_db_reads_shared_total"))
}
