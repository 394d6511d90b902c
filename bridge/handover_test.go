package bridge

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// handoverAckWait is the ack wait of the consumers handed over below; the fake clock of the
// replica taking over moves past it in one step.
const handoverAckWait = 10 * time.Second

// crash stops a replica the way a SIGKILL does as far as its consumers' cursors go: no final
// cursor write, so PostgreSQL keeps what the replica last wrote while it delivered. Its
// leases are released, as PostgreSQL ends a dead replica's session.
func (tb *testBundle) crash(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = tb.bridge.Stop(ctx)
	tb.nc.Close()
	_ = tb.link.Close()
	tb.nats.Stop()
}

// delivery is one message as a client saw it.
type delivery struct {
	seq, dc, pending uint64
	msg              jetstream.Msg
}

func fetchDeliveries(t *testing.T, c jetstream.Consumer, n int, wait time.Duration) []delivery {
	t.Helper()
	batch, err := c.Fetch(n, jetstream.FetchMaxWait(wait))
	if err != nil {
		t.Fatal(err)
	}
	var out []delivery
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, delivery{seq: md.Sequence.Stream, dc: md.NumDelivered, pending: md.NumPending, msg: m})
	}
	return out
}

// TestHandoverRedeliversNeverNew: a consumer that one replica delivered without the acks
// arriving, and that another replica then serves (after a graceful stop or a crash of the
// first), delivers nothing as new a second time. What the first replica delivered comes again
// only once its ack wait has run on the new replica's clock, with NumDelivered 2; consumer
// sequences keep increasing; consumer info agrees; a max_deliver 1 consumer never delivers
// those messages again.
func TestHandoverRedeliversNeverNew(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"stop", "crash"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			a := setup(t, setupOpts{config: func(c *Config) { c.ReplicaName = "a" }})
			ctx := testContext(t)
			s := newStream(t, ctx, a, "HO", "ho")
			publishN(t, ctx, a.js, "ho", 30)
			c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy, AckWait: handoverAckWait})
			if err != nil {
				t.Fatal(err)
			}
			once, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "ONCE", AckPolicy: jetstream.AckExplicitPolicy, AckWait: handoverAckWait, MaxDeliver: 1})
			if err != nil {
				t.Fatal(err)
			}
			first := fetchDeliveries(t, c, 20, 5*time.Second)
			if len(first) != 20 {
				t.Fatalf("first replica delivered %d of 20", len(first))
			}
			for _, d := range first[:5] {
				if err := d.msg.DoubleAck(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if got := fetchDeliveries(t, once, 20, 5*time.Second); len(got) != 20 {
				t.Fatalf("first replica delivered %d of 20 to ONCE", len(got))
			}
			lastDseq := uint64(0)
			if md, err := first[19].msg.Metadata(); err == nil {
				lastDseq = md.Sequence.Consumer
			}
			if how == "stop" {
				a.stop(t)
			} else {
				a.crash(t)
			}

			clock := newFakeClock()
			b := setup(t, setupOpts{db: a.db, config: func(c *Config) { c.ReplicaName = "b"; c.Clock = clock }})
			s2, err := b.js.Stream(ctx, "HO")
			if err != nil {
				t.Fatal(err)
			}
			c2, err := s2.Consumer(ctx, "C")
			if err != nil {
				t.Fatal(err)
			}
			seen := make(map[uint64]bool)
			for _, d := range first {
				seen[d.seq] = true
			}
			// Before the ack wait runs out only what the first replica never delivered may
			// come, as new; after a graceful stop that is all of it. After a crash the first
			// replica's durable mark may cover some of it, which then waits for the ack wait.
			fresh := fetchDeliveries(t, c2, 30, time.Second)
			var freshSeqs []uint64
			for _, d := range fresh {
				if seen[d.seq] || d.dc != 1 {
					t.Errorf("before the ack wait: sequence %d delivered with NumDelivered %d (first replica delivered it: %v)", d.seq, d.dc, seen[d.seq])
				}
				md, _ := d.msg.Metadata()
				if md.Sequence.Consumer <= lastDseq {
					t.Errorf("consumer sequence %d after the takeover, the first replica had reached %d", md.Sequence.Consumer, lastDseq)
				}
				seen[d.seq] = true
				freshSeqs = append(freshSeqs, d.seq)
				if err := d.msg.DoubleAck(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if how == "stop" {
				if want := []uint64{21, 22, 23, 24, 25, 26, 27, 28, 29, 30}; !slices.Equal(freshSeqs, want) {
					t.Fatalf("after a graceful handover got %v new, want %v", freshSeqs, want)
				}
				for i, d := range fresh {
					if want := uint64(len(fresh) - 1 - i); d.pending != want {
						t.Errorf("sequence %d: pending %d on its ack subject, want %d", d.seq, d.pending, want)
					}
				}
			}
			info, err := c2.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.AckFloor.Stream != 5 || info.NumAckPending != 30-5-len(fresh) || info.NumRedelivered != 0 || info.Delivered.Consumer < lastDseq || info.Delivered.Stream < 20 {
				t.Errorf("info after the takeover: delivered %+v ack floor %+v ack pending %d redelivered %d, want floor 5, %d ack pending",
					info.Delivered, info.AckFloor, info.NumAckPending, info.NumRedelivered, 30-5-len(fresh))
			}

			clock.Advance(handoverAckWait)
			var again []uint64
			testwait.For(t, 10*time.Second, func() error {
				for _, d := range fetchDeliveries(t, c2, 30, 200*time.Millisecond) {
					if d.dc != 2 {
						t.Errorf("after the ack wait: sequence %d delivered with NumDelivered %d, want 2", d.seq, d.dc)
					}
					again = append(again, d.seq)
					_ = d.msg.Ack()
				}
				if len(again) < 30-5-len(fresh) {
					return fmt.Errorf("redelivered %v", again)
				}
				return nil
			})
			all := slices.Sorted(slices.Values(append(slices.Clone(again), freshSeqs...)))
			for i, seq := range all {
				if seq != uint64(6+i) || len(all) != 25 {
					t.Fatalf("after the ack wait got %v again and %v new before, want 6..30 once each", again, freshSeqs)
				}
			}

			once2, err := s2.Consumer(ctx, "ONCE")
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range fetchDeliveries(t, once2, 30, time.Second) {
				if d.seq <= 20 {
					t.Errorf("max_deliver 1: sequence %d delivered again (NumDelivered %d)", d.seq, d.dc)
				}
			}
		})
	}
}
