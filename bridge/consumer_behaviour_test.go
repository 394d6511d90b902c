package bridge

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/internal/testwait"
)

func fetchSeqs(t *testing.T, c jetstream.Consumer, n int, wait time.Duration, ack func(jetstream.Msg)) []uint64 {
	t.Helper()
	batch, err := c.Fetch(n, jetstream.FetchMaxWait(wait))
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, md.Sequence.Stream)
		if ack != nil {
			ack(m)
		}
	}
	if err := batch.Error(); err != nil {
		t.Fatalf("fetch: %v", err)
	}
	return seqs
}

func TestFetchEmptyConsumer(t *testing.T) {
	t.Parallel()
	// The clock stands still until the test moves it: no expiry, sweep or heartbeat can end
	// a request by itself.
	clock := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = clock }})
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "EMPTY", "empty")
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.FetchNoWait(5)
	if err != nil {
		t.Fatal(err)
	}
	// A no-wait request has no expiry and its client no timer of its own: with the clock
	// still, only the bridge's answer to no_wait ends it. How fast is a benchmark's business;
	// the minute only bounds a hang.
	got := make(chan int, 1)
	go func() {
		n := 0
		for range b.Messages() {
			n++
		}
		got <- n
	}()
	select {
	case n := <-got:
		if n != 0 {
			t.Fatalf("%d messages from an empty stream", n)
		}
	case <-time.After(time.Minute):
		t.Fatal("the no-wait fetch of an empty stream was never answered: it parked")
	}
	if b.Error() != nil {
		t.Fatalf("fetch no wait: %v", b.Error())
	}
	// A request that waits ends when its expiry passes on the bridge's clock.
	wb, err := c.Fetch(5, jetstream.FetchMaxWait(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		n := 0
		for range wb.Messages() {
			n++
		}
		got <- n
	}()
	testwait.For(t, time.Minute, func() error {
		select {
		case n := <-got:
			if n != 0 {
				t.Errorf("%d messages from an empty stream", n)
			}
			if wb.Error() != nil {
				t.Errorf("fetch: %v", wb.Error())
			}
			return nil
		default:
			clock.Advance(100 * time.Millisecond)
			return errors.New("the waiting fetch has not ended")
		}
	})
}

// TestNakTermProgressAndAckWait runs on a fake clock that moves one ack wait per step, so
// that each step's redeliveries are known exactly: a nak's delay, an ack wait restarted by
// progress, a terminated message never again, and MaxDeliver counted to the delivery.
func TestNakTermProgressAndAckWait(t *testing.T) {
	t.Parallel()
	clock := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = clock }})
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "RD", "rd")
	publishN(t, ctx, tb.js, "rd", 4)
	const ackWait = 500 * time.Millisecond
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckWait: ackWait, MaxDeliver: 3})
	if err != nil {
		t.Fatal(err)
	}
	msgs := fetchExactly(t, c, 4)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(msgs[0].Nak())                     // 1: redelivered at once
	must(msgs[1].NakWithDelay(2 * ackWait)) // 2: after two ack waits
	must(msgs[2].Term())                    // 3: never again
	must(msgs[3].InProgress())              // 4: ack wait restarts; then expires
	got := fetchSeqs(t, c, 1, 5*time.Second, nil)
	if !slices.Equal(got, []uint64{1}) {
		t.Fatalf("after nak got %v, want [1]", got)
	}
	// One ack wait on, 1 (delivered twice) and 4 (in progress) expire; two on, 2's delay has
	// passed and 4 expires again, while 1, delivered three times, is done; three on, 2 comes
	// back a third time and 4 is done; four on, 2 is done too.
	for i, want := range [][]uint64{{1, 4}, {2, 4}, {2}} {
		clock.Advance(ackWait)
		if got := fetchSeqs(t, c, len(want), 5*time.Second, nil); !slices.Equal(got, want) {
			t.Fatalf("%d ack waits on: got %v, want %v", i+1, got, want)
		}
	}
	clock.Advance(ackWait)
	testwait.For(t, 5*time.Second, func() error {
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumAckPending != 0 || info.AckFloor.Stream != 4 || info.NumRedelivered == 0 {
			return fmt.Errorf("info %+v", info)
		}
		return nil
	})
	b, err := c.FetchNoWait(4)
	if err != nil {
		t.Fatal(err)
	}
	for m := range b.Messages() {
		md, _ := m.Metadata()
		t.Errorf("delivered beyond MaxDeliver: %+v", md)
	}
	if err := b.Error(); err != nil {
		t.Fatalf("fetch no wait: %v", err)
	}
}

func TestAckAllFloor(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "AA", "aa")
	publishN(t, ctx, tb.js, "aa", 10)
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckAllPolicy})
	if err != nil {
		t.Fatal(err)
	}
	msgs := fetchExactly(t, c, 10)
	if err := msgs[6].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.AckFloor.Stream != 7 || info.NumAckPending != 3 {
		t.Fatalf("after acking 7: floor %+v pending %d", info.AckFloor, info.NumAckPending)
	}
}

func TestMaxAckPending(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "MAP", "map")
	publishN(t, ctx, tb.js, "map", 10)
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", MaxAckPending: 3})
	if err != nil {
		t.Fatal(err)
	}
	var held []jetstream.Msg
	got := fetchSeqs(t, c, 10, time.Second, func(m jetstream.Msg) { held = append(held, m) })
	if len(got) != 3 {
		t.Fatalf("got %v with max ack pending 3", got)
	}
	for _, m := range held {
		_ = m.Ack()
	}
	got = fetchSeqs(t, c, 10, time.Second, nil)
	if !slices.Equal(got, []uint64{4, 5, 6}) {
		t.Fatalf("after acks got %v", got)
	}
}

func TestTwoClientsShareDurable(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "SH", "sh")
	const total = 500
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C"})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for i := 1; i <= total; i++ {
			if _, err := tb.js.Publish(ctx, "sh", nil); err != nil {
				return
			}
		}
	}()
	var mu sync.Mutex
	seen := map[uint64]int{}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			deadline := time.Now().Add(20 * time.Second)
			for time.Now().Before(deadline) {
				mu.Lock()
				done := len(seen) == total
				mu.Unlock()
				if done {
					return
				}
				b, err := c.Fetch(50, jetstream.FetchMaxWait(300*time.Millisecond))
				if err != nil {
					return
				}
				for m := range b.Messages() {
					md, _ := m.Metadata()
					_ = m.Ack()
					mu.Lock()
					seen[md.Sequence.Stream]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(seen) != total {
		t.Fatalf("saw %d distinct of %d", len(seen), total)
	}
	for q, n := range seen {
		if n != 1 {
			t.Fatalf("sequence %d delivered %d times", q, n)
		}
	}
}

func TestFiltersAndDeliverPolicies(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "F", "f.>")
	// seq 1..6: f.a, f.b, f.a, f.c, f.b, f.a
	for _, subj := range []string{"f.a", "f.b", "f.a", "f.c", "f.b", "f.a"} {
		if _, err := tb.js.Publish(ctx, subj, []byte(subj)); err != nil {
			t.Fatal(err)
		}
	}
	mid := time.Now()
	time.Sleep(5 * time.Millisecond) // the next message's store time must be after mid
	if _, err := tb.js.Publish(ctx, "f.c", nil); err != nil {
		t.Fatal(err)
	}
	startTime := mid
	cases := []struct {
		cfg  jetstream.ConsumerConfig
		want []uint64
	}{
		{jetstream.ConsumerConfig{FilterSubject: "f.a"}, []uint64{1, 3, 6}},
		{jetstream.ConsumerConfig{FilterSubjects: []string{"f.b", "f.c"}}, []uint64{2, 4, 5, 7}},
		{jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverLastPolicy}, []uint64{7}},
		{jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverLastPolicy, FilterSubject: "f.b"}, []uint64{5}},
		{jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy}, nil},
		{jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: 5}, []uint64{5, 6, 7}},
		{jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &startTime}, []uint64{7}},
		{jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy, FilterSubject: "f.>"}, []uint64{5, 6, 7}},
	}
	for i, tc := range cases {
		tc.cfg.Durable = fmt.Sprintf("C%d", i)
		c, err := s.CreateOrUpdateConsumer(ctx, tc.cfg)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if np := c.CachedInfo().NumPending; np != uint64(len(tc.want)) {
			t.Errorf("case %d: num_pending %d, want %d", i, np, len(tc.want))
		}
		got := fetchSeqs(t, c, 10, 300*time.Millisecond, func(m jetstream.Msg) { _ = m.Ack() })
		if !slices.Equal(got, tc.want) {
			t.Errorf("case %d (%+v): got %v, want %v", i, tc.cfg, got, tc.want)
		}
	}
}

func TestConsumerAdmin(t *testing.T) {
	t.Parallel()
	clock := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = clock }})
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "ADMC", "admc")
	for _, n := range []string{"B", "A", "C"} {
		if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: n}); err != nil {
			t.Fatal(err)
		}
	}
	var names []string
	for n := range s.ConsumerNames(ctx).Name() {
		names = append(names, n)
	}
	if !slices.Equal(names, []string{"A", "B", "C"}) {
		t.Fatalf("names %v", names)
	}
	n := 0
	for range s.ListConsumers(ctx).Info() {
		n++
	}
	if n != 3 {
		t.Fatalf("listed %d", n)
	}
	if _, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "A", AckWait: time.Minute}); !errors.Is(err, jetstream.ErrConsumerExists) {
		t.Fatalf("create with a different config: %v", err)
	}
	if _, err := s.UpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "Z"}); !errors.Is(err, jetstream.ErrConsumerDoesNotExist) {
		t.Fatalf("update of a missing consumer: %v", err)
	}
	if c, err := s.UpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "A", AckWait: time.Minute}); err != nil || c.CachedInfo().Config.AckWait != time.Minute {
		t.Fatalf("update: %v", err)
	}
	if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "P", DeliverSubject: "push.*"}); err == nil {
		t.Fatal("push consumer with a wildcard deliver subject accepted")
	}
	if err := s.DeleteConsumer(ctx, "B"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Consumer(ctx, "B"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("info after delete: %v", err)
	}
	if err := s.DeleteConsumer(ctx, "B"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	eph, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{InactiveThreshold: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	name := eph.CachedInfo().Name
	clock.Advance(300 * time.Millisecond)
	testwait.For(t, 10*time.Second, func() error {
		if _, err := s.Consumer(ctx, name); !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("ephemeral still there: %v", err)
		}
		return nil
	})
}

func TestParkedPullWokenByPublish(t *testing.T) {
	t.Parallel()
	// The clock stands still: no tick, interest sweep or expiry can end the parked pull.
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = clocktest.New() }})
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "PK", "pk")
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C"})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan int, 1)
	go func() {
		n := 0
		if b, err := c.Fetch(1, jetstream.FetchMaxWait(time.Minute)); err == nil {
			for range b.Messages() {
				n++
			}
		}
		got <- n
	}()
	testwait.For(t, 30*time.Second, func() error {
		info, err := c.Info(ctx)
		if err != nil || info.NumWaiting != 1 {
			return fmt.Errorf("waiting %v %v", info, err)
		}
		return nil
	})
	publishN(t, ctx, tb.js, "pk", 1)
	// Only the publish can wake the pull. How fast it wakes is a benchmark's business.
	if n := <-got; n != 1 {
		t.Fatalf("the parked pull ended with %d messages: the publish did not wake it", n)
	}
}

// TestConsumeWithHeartbeats keeps a Consume idle across several heartbeats and a pull
// expiry, on a fake clock advanced one heartbeat at a time, and watches the pull answers
// from a second connection: the client must see no error, and messages published afterwards
// must arrive in order.
func TestConsumeWithHeartbeats(t *testing.T) {
	t.Parallel()
	clock := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = clock }})
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "CO", "co")
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C"})
	if err != nil {
		t.Fatal(err)
	}
	obs, err := nats.Connect(tb.nats.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	answers, err := obs.SubscribeSync("_INBOX.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.Flush(); err != nil {
		t.Fatal(err)
	}
	waiting := func(n int) {
		t.Helper()
		testwait.For(t, 5*time.Second, func() error {
			info, err := c.Info(ctx)
			if err == nil && info.NumWaiting != n {
				err = fmt.Errorf("%d pull requests waiting, want %d", info.NumWaiting, n)
			}
			return err
		})
	}
	// The client watches for heartbeats on its own, in real time, missing two of them: with
	// the fake clock the steps come much faster, and long intervals keep that watch quiet.
	const hb, expiry = 5 * time.Second, 20 * time.Second
	got := make(chan uint64, 100)
	errs := make(chan error, 10)
	cc, err := c.Consume(func(m jetstream.Msg) {
		md, _ := m.Metadata()
		_ = m.Ack()
		got <- md.Sequence.Stream
	}, jetstream.PullExpiry(expiry), jetstream.PullHeartbeat(hb),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	waiting(1)
	for i := 1; i <= 6; i++ {
		clock.Advance(hb)
		want := "100 Idle Heartbeat"
		if time.Duration(i)*hb == expiry {
			want = "408 Request Timeout"
		}
		var status string
		for status == "" {
			m, err := answers.NextMsg(5 * time.Second)
			if err != nil {
				t.Fatalf("%v on: no pull answer: %v", time.Duration(i)*hb, err)
			}
			status = statusLine(m)
		}
		if status != want {
			t.Fatalf("%v on: %q, want %q", time.Duration(i)*hb, status, want)
		}
		waiting(1) // after the expiry, the client's next request
	}
	select {
	case err := <-errs:
		t.Fatalf("consume error while idle: %v", err)
	default:
	}
	publishN(t, ctx, tb.js, "co", 5)
	for i := uint64(1); i <= 5; i++ {
		select {
		case q := <-got:
			if q != i {
				t.Fatalf("got %d, want %d", q, i)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("message %d never came", i)
		}
	}
}

func TestResumeAfterRestart(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "RS", "rs")
	publishN(t, ctx, tb.js, "rs", 10)
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C"})
	if err != nil {
		t.Fatal(err)
	}
	fetchSeqs(t, c, 4, 2*time.Second, func(m jetstream.Msg) {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	})
	fetchSeqs(t, c, 2, 2*time.Second, nil) // delivered, never acked
	db := tb.db
	tb.stop(t)
	tb2 := setup(t, setupOpts{db: db})
	s2, err := tb2.js.Stream(ctx, "RS")
	if err != nil {
		t.Fatal(err)
	}
	c2, err := s2.Consumer(ctx, "C")
	if err != nil {
		t.Fatal(err)
	}
	got := fetchSeqs(t, c2, 10, time.Second, func(m jetstream.Msg) { _ = m.Ack() })
	if !slices.Equal(got, []uint64{5, 6, 7, 8, 9, 10}) {
		t.Fatalf("after restart got %v", got)
	}
}

// nats.go's ordered consumer (ephemeral pull consumers it recreates as needed) reads a
// stream in order with Fetch and with Consume, new messages included, as from JetStream.
func TestOrderedConsumerMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "OC", Subjects: []string{"oc.>"}})
	tw.pubN("oc.a", 5, 8)
	var fetched, consumed [2][]uint64
	for side, js := range tw.js {
		s, err := js.Stream(tw.ctx, "OC")
		if err != nil {
			t.Fatal(err)
		}
		oc, err := s.OrderedConsumer(tw.ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"oc.a"}})
		if err != nil {
			t.Fatalf("%s: %v", sideName[side], err)
		}
		b, err := oc.Fetch(10, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatalf("%s: fetch: %v", sideName[side], err)
		}
		for m := range b.Messages() {
			md, _ := m.Metadata()
			fetched[side] = append(fetched[side], md.Sequence.Stream)
		}
		oc, err = s.OrderedConsumer(tw.ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverLastPolicy})
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan uint64, 16)
		cc, err := oc.Consume(func(m jetstream.Msg) {
			md, _ := m.Metadata()
			got <- md.Sequence.Stream
		})
		if err != nil {
			t.Fatalf("%s: consume: %v", sideName[side], err)
		}
		for _, subj := range []string{"oc.b", "oc.a"} {
			if _, err := js.Publish(tw.ctx, subj, nil); err != nil {
				t.Fatal(err)
			}
		}
		for len(consumed[side]) < 3 {
			select {
			case seq := <-got:
				consumed[side] = append(consumed[side], seq)
			case <-time.After(5 * time.Second):
				t.Fatalf("%s: consumed only %v", sideName[side], consumed[side])
			}
		}
		cc.Stop()
	}
	if !slices.Equal(fetched[ours], fetched[theirs]) || !slices.Equal(consumed[ours], consumed[theirs]) {
		t.Errorf("ordered consumers: jetgres fetched %v and consumed %v, JetStream %v and %v",
			fetched[ours], consumed[ours], fetched[theirs], consumed[theirs])
	}
}
