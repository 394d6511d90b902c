package bridge

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/internal/testwait"
)

// replayStream starts a bridge on a fake clock and stores r.1 to r.4 on it with gaps of 2 s,
// 5 s and none, as a replay original consumer must deliver them again.
func replayStream(t *testing.T) (*testBundle, *clocktest.Fake, context.Context) {
	t.Helper()
	clock := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = clock }})
	ctx := testContext(t)
	newStream(t, ctx, tb, "R", "r.>")
	for i, gap := range []time.Duration{0, 2 * time.Second, 5 * time.Second, 0} {
		clock.Advance(gap)
		if _, err := tb.js.Publish(ctx, fmt.Sprintf("r.%d", i+1), nil); err != nil {
			t.Fatal(err)
		}
	}
	return tb, clock, ctx
}

// expectPaced checks that deliveries of consumer R > name come out as the messages were
// stored: the first at once, the second only once the clock has moved 2 s, the third and
// fourth 5 s after that.
func expectPaced(t *testing.T, tb *testBundle, name string, clock *clocktest.Fake, got <-chan uint64) {
	t.Helper()
	receive := func(want uint64) {
		t.Helper()
		select {
		case seq := <-got:
			if seq != want {
				t.Fatalf("delivered %d, want %d", seq, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%d was not delivered", want)
		}
	}
	nothingYet := func(gap time.Duration) {
		t.Helper()
		due := clock.Now().Add(gap)
		testwait.For(t, 10*time.Second, func() error {
			c := tb.bridge.cons.Inspect("R", name)
			if c == nil {
				return errors.New("the consumer is not served here")
			}
			at := c.ReplayAt()
			if !at.Equal(due) {
				return fmt.Errorf("the consumer holds the next message until %v, want %v", at, due)
			}
			return nil
		})
		select {
		case seq := <-got:
			t.Fatalf("%d was delivered before its time", seq)
		default:
		}
	}
	receive(1)
	nothingYet(2 * time.Second)
	clock.Advance(2 * time.Second)
	receive(2)
	nothingYet(5 * time.Second)
	clock.Advance(5 * time.Second)
	receive(3)
	receive(4)
}

// A pull consumer with replay_policy original delivers a backlog at the pace it was stored,
// and what is stored after it caught up at once, on the bridge's clock.
func TestReplayOriginalPull(t *testing.T) {
	t.Parallel()
	tb, clock, ctx := replayStream(t)
	c, err := tb.js.CreateOrUpdateConsumer(ctx, "R", jetstream.ConsumerConfig{Durable: "P", ReplayPolicy: jetstream.ReplayOriginalPolicy, AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan uint64, 8)
	fetched := make(chan error, 1)
	go func() {
		batch, err := c.Fetch(4, jetstream.FetchMaxWait(time.Minute))
		if err != nil {
			fetched <- err
			return
		}
		for m := range batch.Messages() {
			md, _ := m.Metadata()
			got <- md.Sequence.Stream
		}
		fetched <- batch.Error()
	}()
	expectPaced(t, tb, "P", clock, got)
	if err := <-fetched; err != nil {
		t.Fatal(err)
	}
	// Caught up: a message stored an hour after the last goes out at once.
	clock.Advance(time.Hour)
	if _, err := tb.js.Publish(ctx, "r.5", nil); err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for m := range batch.Messages() {
		md, _ := m.Metadata()
		seqs = append(seqs, md.Sequence.Stream)
	}
	if len(seqs) != 1 || seqs[0] != 5 {
		t.Fatalf("delivered %v after catching up, want [5] (%v)", seqs, batch.Error())
	}
}

// A push consumer with replay_policy original paces its deliveries the same way.
func TestReplayOriginalPush(t *testing.T) {
	t.Parallel()
	tb, clock, ctx := replayStream(t)
	sub, err := tb.nc.SubscribeSync("replay.out")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tb.js.CreateOrUpdateConsumer(ctx, "R", jetstream.ConsumerConfig{Durable: "Q", DeliverSubject: "replay.out",
		ReplayPolicy: jetstream.ReplayOriginalPolicy, AckPolicy: jetstream.AckNonePolicy}); err != nil {
		t.Fatal(err)
	}
	got := make(chan uint64, 8)
	go func() {
		for {
			m, err := sub.NextMsg(time.Minute)
			if errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrBadSubscription) || err != nil {
				return
			}
			if md, err := m.Metadata(); err == nil {
				got <- md.Sequence.Stream
			}
		}
	}()
	expectPaced(t, tb, "Q", clock, got)
}

// JetStream and jetgres take the same replay original consumer and deliver a backlog stored
// in quick succession (its gaps are milliseconds at most) the same way, with the same info.
func TestReplayOriginalMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "RO", Subjects: []string{"ro.>"}})
	tw.pubN("ro.a", 3, 8)
	cons, _ := tw.consumer("RO", jetstream.ConsumerConfig{Durable: "O", ReplayPolicy: jetstream.ReplayOriginalPolicy, AckPolicy: jetstream.AckExplicitPolicy})
	tw.ack(tw.fetch(cons, 3), 1, 2, 3)
}
