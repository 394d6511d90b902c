package bridge

import (
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// TestMirrorBatchesReachConsumersAsCommits has a pull consumer keep up with a mirror while
// its origin takes publishes in rounds: each batch the mirror stores after its last
// sequence reaches the consumer as a commit does, so the consumer is woken, reads it from
// the tail and keeps its pending count, instead of hearing a purge that sends it back to
// PostgreSQL and to a recount on every batch. Every message arrives once, in order, under
// its origin sequence; also through a filtered mirror, whose batches begin after sequences
// it skipped.
func TestMirrorBatchesReachConsumersAsCommits(t *testing.T) {
	for _, filter := range []string{"", "orders.1"} {
		t.Run("filter="+filter, func(t *testing.T) { testMirrorBatchesAsCommits(t, filter) })
	}
}

func testMirrorBatchesAsCommits(t *testing.T, filter string) {
	ctx := testContext(t)
	tb := setup(t)
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	m, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "M", Mirror: &jetstream.StreamSource{Name: "ORDERS", FilterSubject: filter}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := m.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	type delivery struct {
		seq  uint64
		data string
	}
	got := make(chan delivery, 1024)
	cc, err := c.Consume(func(msg jetstream.Msg) {
		md, err := msg.Metadata()
		if err != nil {
			t.Error(err)
			return
		}
		got <- delivery{md.Sequence.Stream, string(msg.Data())}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()

	const rounds, perRound = 12, 25
	var want []delivery
	next := 0
	round := func(r int) {
		for i := range perRound {
			n := r*perRound + i + 1
			subject, data := fmt.Sprintf("orders.%d", i%3), fmt.Sprintf("order %d", n)
			if _, err := tb.js.Publish(ctx, subject, []byte(data)); err != nil {
				t.Fatal(err)
			}
			if filter == "" || subject == filter {
				want = append(want, delivery{uint64(n), data})
			}
		}
		deadline := time.After(30 * time.Second)
		for ; next < len(want); next++ {
			select {
			case d := <-got:
				if d != want[next] {
					t.Fatalf("delivered sequence %d %q, want %d %q", d.seq, d.data, want[next].seq, want[next].data)
				}
			case <-deadline:
				t.Fatalf("round %d: delivered %d of %d", r, next, len(want))
			}
		}
	}
	// The first round settles the consumer: its first pending count and reads.
	round(0)
	recounts := func() float64 {
		return counterValue(t, tb.reg, "jetgres_consumer_pending_recounts_total") +
			counterValue(t, tb.reg, "jetgres_consumer_pending_recounts_deferred_total")
	}
	reads, counts := counterValue(t, tb.reg, "jetgres_consumer_db_reads_total"), recounts()
	for r := 1; r < rounds; r++ {
		round(r)
	}
	dc, dr := recounts()-counts, counterValue(t, tb.reg, "jetgres_consumer_db_reads_total")-reads
	t.Logf("%d rounds: %v recounts, %v reads of PostgreSQL", rounds-1, dc, dr)
	// A tick that finds a batch committed before the copy announced it may still send the
	// consumer to PostgreSQL, as it may for a publish; a purge per batch did it at least
	// once a round, and so did a filtered mirror's skipped sequences taken for rows the
	// tail and the pending count had missed.
	if dc >= rounds-1 {
		t.Errorf("the consumer recounted its pending messages %v times while the mirror copied %d rounds", dc, rounds-1)
	}
	if dr >= rounds-1 {
		t.Errorf("the consumer read PostgreSQL %v times while the mirror copied %d rounds", dr, rounds-1)
	}
	select {
	case d := <-got:
		t.Fatalf("delivered sequence %d %q after the last", d.seq, d.data)
	default:
	}
	last := want[len(want)-1].seq
	testwait.For(t, 10*time.Second, func() error {
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumPending != 0 || info.Delivered.Stream != last {
			return fmt.Errorf("consumer pending %d, delivered through %d, want 0 and %d", info.NumPending, info.Delivered.Stream, last)
		}
		return nil
	})
}

// TestLimitedMirrorBatchesReachConsumersAsCommits is the same with a mirror at its
// max_msgs: each batch takes the oldest messages out, long gone from the tail, and the
// consumer hears of that as of a publish's limits, not as of a purge.
func TestLimitedMirrorBatchesReachConsumersAsCommits(t *testing.T) {
	ctx := testContext(t)
	// A tail of a few rounds: what the limits take is not in it.
	tb := setup(t, setupOpts{config: func(c *Config) { c.TailTotalBytes = 32 << 10 }})
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	const rounds, perRound, maxMsgs = 12, 25, 100
	m, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "M", MaxMsgs: maxMsgs, Mirror: &jetstream.StreamSource{Name: "ORDERS"}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := m.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan uint64, 1024)
	cc, err := c.Consume(func(msg jetstream.Msg) {
		md, err := msg.Metadata()
		if err != nil {
			t.Error(err)
			return
		}
		got <- md.Sequence.Stream
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	data := make([]byte, 512)
	next := uint64(1)
	round := func(r int) {
		for range perRound {
			if _, err := tb.js.Publish(ctx, "orders.x", data); err != nil {
				t.Fatal(err)
			}
		}
		deadline := time.After(30 * time.Second)
		for next <= uint64((r+1)*perRound) {
			select {
			case seq := <-got:
				if seq != next {
					t.Fatalf("delivered sequence %d, want %d", seq, next)
				}
				next++
			case <-deadline:
				t.Fatalf("round %d: delivered up to %d of %d", r, next-1, (r+1)*perRound)
			}
		}
	}
	// The rounds that fill the mirror up to its limit, and one more.
	first := maxMsgs/perRound + 1
	for r := range first {
		round(r)
	}
	reads, counts := counterValue(t, tb.reg, "jetgres_consumer_db_reads_total"), counterValue(t, tb.reg, "jetgres_consumer_pending_recounts_total")
	for r := first; r < rounds; r++ {
		round(r)
	}
	dc, dr := counterValue(t, tb.reg, "jetgres_consumer_pending_recounts_total")-counts, counterValue(t, tb.reg, "jetgres_consumer_db_reads_total")-reads
	t.Logf("%d rounds at the limit: %v recounts, %v reads of PostgreSQL", rounds-first, dc, dr)
	if at := float64(rounds - first); dc >= at || dr >= at {
		t.Errorf("the consumer recounted its pending messages %v times and read PostgreSQL %v times in %d rounds at the limit", dc, dr, rounds-first)
	}
	testwait.For(t, 10*time.Second, func() error {
		info, err := m.Info(ctx)
		if err != nil {
			return err
		}
		if st := info.State; st.Msgs != maxMsgs || st.FirstSeq != rounds*perRound-maxMsgs+1 {
			return fmt.Errorf("mirror holds %d messages from %d, want %d from %d", st.Msgs, st.FirstSeq, maxMsgs, rounds*perRound-maxMsgs+1)
		}
		ci, err := c.Info(ctx)
		if err != nil {
			return err
		}
		if ci.NumPending != 0 || ci.Delivered.Stream != rounds*perRound {
			return fmt.Errorf("consumer pending %d, delivered through %d, want 0 and %d", ci.NumPending, ci.Delivered.Stream, rounds*perRound)
		}
		return nil
	})
}

// TestMirrorConsumerBench measures a pull consumer reading a mirror while the mirror catches
// up with its origin: half of JETGRES_MIRROR_MSGS messages (100,000 unless set) are in the
// origin when the mirror and the consumer are created, the other half is published
// meanwhile. It reports the time until the consumer has them all, and its reads of
// PostgreSQL and recounts. It runs only with JETGRES_MIRROR_BENCH=1:
//
//	JETGRES_MIRROR_BENCH=1 go test -run TestMirrorConsumerBench -v ./bridge/
func TestMirrorConsumerBench(t *testing.T) {
	if os.Getenv("JETGRES_MIRROR_BENCH") != "1" {
		t.Skip("set JETGRES_MIRROR_BENCH=1 to run")
	}
	n := 100_000
	if v := os.Getenv("JETGRES_MIRROR_MSGS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 1 {
			t.Fatalf("JETGRES_MIRROR_MSGS=%q: a number of messages above 1, please", v)
		}
	}
	ctx := testContext(t)
	tb := setup(t)
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 128)
	publishBacklog(t, tb, "orders.x", data, n/2)
	reads, counts := counterValue(t, tb.reg, "jetgres_consumer_db_reads_total"), counterValue(t, tb.reg, "jetgres_consumer_pending_recounts_total")

	start := time.Now()
	m, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "M", Mirror: &jetstream.StreamSource{Name: "ORDERS"}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := m.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	var got atomic.Int64
	done := make(chan struct{})
	cc, err := c.Consume(func(jetstream.Msg) {
		if got.Add(1) == int64(n) {
			close(done)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	publishBacklog(t, tb, "orders.x", data, n-n/2)
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("the consumer read %d of %d messages", got.Load(), n)
	}
	d := time.Since(start)
	t.Logf("a consumer read %d messages of a mirror catching up in %v, %.0f msg/s; %v reads of PostgreSQL, %v recounts",
		n, d.Round(time.Millisecond), float64(n)/d.Seconds(),
		counterValue(t, tb.reg, "jetgres_consumer_db_reads_total")-reads, counterValue(t, tb.reg, "jetgres_consumer_pending_recounts_total")-counts)
}
