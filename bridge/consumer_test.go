package bridge

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/nats-io/nats.go/jetstream"
)

// publishN publishes n messages to subject, numbered from 1 in the payload.
func publishN(t *testing.T, ctx context.Context, js jetstream.JetStream, subject string, n int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		if _, err := js.Publish(ctx, subject, fmt.Appendf(nil, "%d", i)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
}

func newStream(t *testing.T, ctx context.Context, tb *testBundle, name string, subjects ...string) jetstream.Stream {
	t.Helper()
	s, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: subjects})
	if err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
	return s
}

func TestFetchAndAck(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "ORDERS", "orders.>")
	publishN(t, ctx, tb.js, "orders.new", 10)
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C1", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	info := c.CachedInfo()
	if info.Config.AckWait != 30*time.Second || info.Config.MaxAckPending != 1000 || info.Config.MaxWaiting != 512 || info.Config.MaxDeliver != -1 {
		t.Fatalf("defaults not echoed: %+v", info.Config)
	}
	if info.NumPending != 10 {
		t.Fatalf("num_pending = %d, want 10", info.NumPending)
	}
	batch, err := c.Fetch(10, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range batch.Messages() {
		n++
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject() != "orders.new" || string(m.Data()) != fmt.Sprint(n) || md.Sequence.Stream != uint64(n) || md.Sequence.Consumer != uint64(n) || md.NumPending != uint64(10-n) {
			t.Fatalf("message %d: subject %q data %q meta %+v", n, m.Subject(), m.Data(), md)
		}
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatalf("double ack %d: %v", n, err)
		}
	}
	if batch.Error() != nil || n != 10 {
		t.Fatalf("fetched %d, err %v", n, batch.Error())
	}
	info, err = c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.AckFloor.Stream != 10 || info.Delivered.Stream != 10 || info.NumAckPending != 0 || info.NumPending != 0 {
		t.Fatalf("info after acks: %+v", info)
	}
	row, err := tb.db.GetConsumer(ctx, mustStreamID(t, tb, "ORDERS"), "C1")
	if err != nil || row.AckStreamSeq != 10 || row.AckConsumerSeq != 10 {
		t.Fatalf("stored cursor %+v, %v", row, err)
	}
}

// fetchExactly fetches n messages in one Fetch, failing t unless all n come.
func fetchExactly(t *testing.T, c jetstream.Consumer, n int) []jetstream.Msg {
	t.Helper()
	batch, err := c.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	if len(msgs) != n {
		t.Fatalf("fetched %d messages of %d: %v", len(msgs), n, batch.Error())
	}
	return msgs
}

func mustStreamID(t *testing.T, tb *testBundle, name string) int64 {
	t.Helper()
	s := tb.bridge.streams.Lookup(name)
	if s == nil {
		t.Fatalf("no stream %s", name)
	}
	return s.ID()
}

// TestCursorWritesPaced acks messages one by one with plain acks: the floor moves with each,
// but the cursor is written at most once per CursorInterval, and once the acks stop the last
// floor still reaches PostgreSQL.
func TestCursorWritesPaced(t *testing.T) {
	t.Parallel()
	clock := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = clock }})
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "PACED", "paced.>")
	const n = 2000
	publishN(t, ctx, tb.js, "paced.x", n)
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	id := mustStreamID(t, tb, "PACED")
	before := counterValue(t, tb.reg, "jetgres_cursor_writes_total")
	start := clock.Now()
	for got := 0; got < n; {
		batch, err := c.Fetch(100, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			if err := m.Ack(); err != nil {
				t.Fatal(err)
			}
			got++
		}
		if err := batch.Error(); err != nil {
			t.Fatalf("fetch after %d: %v", got, err)
		}
	}
	if err := tb.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// The clock has stood still since the first write, so the last floor waits for it to
	// move; it moves once the consumer has taken every ack, or a floor short of the last
	// would take the write and the last wait for the clock again.
	testwait.For(t, 5*time.Second, func() error {
		info, err := c.Info(ctx)
		if err == nil && info.AckFloor.Stream != n {
			err = fmt.Errorf("ack floor %d, want %d", info.AckFloor.Stream, n)
		}
		return err
	})
	clock.Advance(CursorIntervalDefault)
	testwait.For(t, 5*time.Second, func() error {
		row, err := tb.db.GetConsumer(ctx, id, "C")
		if err == nil && row.AckStreamSeq != n {
			err = fmt.Errorf("stored floor %d, want %d", row.AckStreamSeq, n)
		}
		return err
	})
	elapsed := clock.Now().Sub(start)
	writes := counterValue(t, tb.reg, "jetgres_cursor_writes_total") - before
	if limit := 2 + float64(elapsed/CursorIntervalDefault); writes > limit {
		t.Errorf("%g cursor writes for %d acks in %s, want at most %g", writes, n, elapsed, limit)
	}
}

// TestDoubleAckSkipsThePace sets a cursor interval of an hour: once a plain ack has been
// written, the next floor waits out the interval, unless a double ack asks for it. The
// double ack must be answered, and its floor stored, long before.
func TestDoubleAckSkipsThePace(t *testing.T) {
	t.Parallel()
	clock := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.CursorInterval, c.Clock = time.Hour, clock }})
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "HURRY", "hurry.>")
	publishN(t, ctx, tb.js, "hurry.x", 3)
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	id := mustStreamID(t, tb, "HURRY")
	msgs := fetchExactly(t, c, 3)
	// The first floor is written at once (nothing was written before), the second waits.
	if err := msgs[0].Ack(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, func() error {
		row, err := tb.db.GetConsumer(ctx, id, "C")
		if err == nil && row.AckStreamSeq != 1 {
			err = fmt.Errorf("stored floor %d, want 1", row.AckStreamSeq)
		}
		return err
	})
	if err := msgs[1].Ack(); err != nil {
		t.Fatal(err)
	}
	// Let the writer take the second floor and start waiting out the interval; were the
	// double ack to come in the same breath, the writer would find it before waiting. The
	// clock stands still, so the interval never passes by itself.
	testwait.For(t, 5*time.Second, func() error {
		if !clock.TimerDueIn(time.Hour) {
			return errors.New("the cursor writer is not waiting out the interval")
		}
		return nil
	})
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := msgs[2].DoubleAck(dctx); err != nil {
		t.Fatalf("double ack behind a paced write: %v", err)
	}
	if row, err := tb.db.GetConsumer(ctx, id, "C"); err != nil || row.AckStreamSeq != 3 {
		t.Fatalf("stored cursor after the double ack: %+v, %v", row, err)
	}
}

// TestRecreatedConsumerKeepsItsOwnCursor deletes a consumer whose last floor waits out the
// cursor interval, with every ack lane permit taken so that any write it still makes comes
// late, and creates one of the same name: the old consumer's floor must not reach the new
// one's row, or the new consumer would skip messages it never delivered.
func TestRecreatedConsumerKeepsItsOwnCursor(t *testing.T) {
	t.Parallel()
	var lane *flow.Lane
	tb := setup(t, setupOpts{config: func(c *Config) {
		c.CursorInterval = time.Hour
		lane = c.Ack
	}})
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "AGAIN", "again.>")
	publishN(t, ctx, tb.js, "again.x", 3)
	cfg := jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy}
	c, err := s.CreateOrUpdateConsumer(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	id := mustStreamID(t, tb, "AGAIN")
	msgs := fetchExactly(t, c, 2)
	if err := msgs[0].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	if err := msgs[1].Ack(); err != nil {
		t.Fatal(err)
	}
	old := tb.bridge.cons.Inspect("AGAIN", "C")
	if old == nil {
		t.Fatal("consumer C is not served")
	}
	// Wherever the writer now is with floor 2 (waiting out the interval, or about to), its
	// write, if any, has to come after the permits below are taken.
	testwait.For(t, 5*time.Second, func() error {
		if want, inflight := old.CursorWrite(); want != 2 || !inflight {
			return fmt.Errorf("cursor writer wants floor %d (in flight %v), want floor 2 in flight", want, inflight)
		}
		return nil
	})
	var held []*flow.Permit
	for {
		p, ok := lane.TryAcquire()
		if !ok {
			break
		}
		held = append(held, p)
	}
	if err := s.DeleteConsumer(ctx, "C"); err != nil {
		t.Fatal(err)
	}
	c, err = s.CreateOrUpdateConsumer(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range held {
		p.Abandon()
	}
	// The old writer ends after any write it was still to make, so once it has ended the
	// new row shows whether that write reached it.
	testwait.For(t, 5*time.Second, func() error {
		if _, inflight := old.CursorWrite(); inflight {
			return errors.New("the deleted consumer's cursor writer still runs")
		}
		return nil
	})
	if row, err := tb.db.GetConsumer(ctx, id, "C"); err != nil || row.AckStreamSeq != 0 {
		t.Fatalf("the new consumer's stored ack floor: %d, %v; want 0", row.AckStreamSeq, err)
	}
	m, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if md, err := m.Metadata(); err != nil || md.Sequence.Stream != 1 {
		t.Fatalf("the new consumer's first delivery: %+v, %v; want sequence 1", md, err)
	}
}

// TestDoubleAckAboveAPendingDelivery double-acks a filtered consumer's second delivery while
// its first is still pending: the ack moves the floor over the other subject's messages
// below the first delivery, but not to the acked one, and must be answered all the same.
func TestDoubleAckAboveAPendingDelivery(t *testing.T) {
	t.Parallel()
	tb := setup(t, setupOpts{})
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "GAPACK", "gap.>")
	for _, subj := range []string{"gap.other", "gap.other", "gap.mine", "gap.other", "gap.mine"} {
		if _, err := tb.js.Publish(ctx, subj, nil); err != nil {
			t.Fatal(err)
		}
	}
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C",
		AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: "gap.mine"})
	if err != nil {
		t.Fatal(err)
	}
	msgs := fetchExactly(t, c, 2)
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := msgs[1].DoubleAck(dctx); err != nil {
		t.Fatalf("double ack above a pending delivery: %v", err)
	}
	if err := msgs[0].DoubleAck(dctx); err != nil {
		t.Fatalf("double ack of the pending delivery: %v", err)
	}
	row, err := tb.db.GetConsumer(ctx, mustStreamID(t, tb, "GAPACK"), "C")
	if err != nil || row.AckStreamSeq != 5 {
		t.Fatalf("stored cursor after both double acks: %+v, %v", row, err)
	}
}

// Creates that race for the last places under max_consumers, on every API worker at once,
// never leave the stream with more consumers than it allows: PostgreSQL counts them under
// the stream's lock as it stores each one. The others get JetStream's 10026.
func TestMaxConsumersHoldsUnderConcurrentCreates(t *testing.T) {
	t.Parallel()
	tb := setup(t, setupOpts{})
	ctx := testContext(t)
	const limit, tries = 3, 16
	s, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "MC", Subjects: []string{"mc.>"}, MaxConsumers: limit})
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, tries)
	for i := range tries {
		go func() {
			_, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: fmt.Sprintf("D%d", i), AckPolicy: jetstream.AckExplicitPolicy})
			errs <- err
		}()
	}
	created := 0
	for range tries {
		err := <-errs
		var apiErr *jetstream.APIError
		switch {
		case err == nil:
			created++
		case errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeMaximumConsumersLimit:
		default:
			t.Fatalf("a create failed otherwise than on the limit: %v", err)
		}
	}
	rows, err := tb.db.Consumers(ctx, tb.bridge.streams.Lookup("MC").ID())
	if err != nil {
		t.Fatal(err)
	}
	if created != limit || len(rows) != limit {
		t.Fatalf("%d creates succeeded and %d consumers are stored, want %d of each", created, len(rows), limit)
	}
}
