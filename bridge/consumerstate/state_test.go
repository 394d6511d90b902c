package consumerstate

import (
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/internal/clock/clocktest"
)

func setup(t *testing.T, cfg Config) (*State, *clocktest.Fake) {
	t.Helper()
	clk := clocktest.At(time.Unix(1_700_000_000, 0))
	return New(cfg, Pair{}, 1), clk
}

// deliverNew delivers stream sequences from..to as first deliveries, at clk's time.
func deliverNew(s *State, clk *clocktest.Fake, from, to uint64) {
	for q := from; q <= to; q++ {
		s.Deliver(q, 1, clk.Now())
	}
}

func wantFloor(t *testing.T, s *State, consumer, stream uint64) {
	t.Helper()
	if got := s.AckFloor(); got != (Pair{Consumer: consumer, Stream: stream}) {
		t.Fatalf("ack floor = %+v, want {%d %d}", got, consumer, stream)
	}
}

func TestExplicitAckFloor(t *testing.T) {
	s, clk := setup(t, Config{AckPolicy: AckExplicit, AckWait: time.Second})
	deliverNew(s, clk, 1, 5)
	if s.NumAckPending() != 5 {
		t.Fatalf("pending = %d, want 5", s.NumAckPending())
	}
	if moved := s.Ack(2, 2, clk.Now()); moved {
		t.Fatal("acking 2 with 1 pending moved the floor")
	}
	wantFloor(t, s, 0, 0)
	if moved := s.Ack(1, 1, clk.Now()); !moved {
		t.Fatal("acking 1 did not move the floor")
	}
	wantFloor(t, s, 2, 2)
	s.Ack(4, 4, clk.Now())
	s.Ack(3, 3, clk.Now())
	wantFloor(t, s, 4, 4)
	s.Ack(5, 5, clk.Now())
	wantFloor(t, s, 5, 5)
	if s.NumAckPending() != 0 {
		t.Fatalf("pending = %d, want 0", s.NumAckPending())
	}
	if d := s.Delivered(); d != (Pair{5, 5}) {
		t.Fatalf("delivered = %+v", d)
	}
}

func TestAckBeyondDeliveredIgnored(t *testing.T) {
	s, clk := setup(t, Config{AckPolicy: AckAll, AckWait: time.Second})
	deliverNew(s, clk, 1, 3)
	if s.Ack(10, 10, clk.Now()) {
		t.Fatal("an ack beyond what was delivered moved the floor")
	}
	wantFloor(t, s, 0, 0)
}

func TestAckAll(t *testing.T) {
	s, clk := setup(t, Config{AckPolicy: AckAll, AckWait: time.Second})
	deliverNew(s, clk, 1, 10)
	if !s.Ack(5, 5, clk.Now()) {
		t.Fatal("ack all of 5 did not move the floor")
	}
	wantFloor(t, s, 5, 5)
	if s.NumAckPending() != 5 {
		t.Fatalf("pending = %d, want 5", s.NumAckPending())
	}
	if s.Ack(3, 3, clk.Now()) {
		t.Fatal("an ack below the floor moved it")
	}
	s.Ack(10, 10, clk.Now())
	wantFloor(t, s, 10, 10)
	if s.NumAckPending() != 0 {
		t.Fatalf("pending = %d, want 0", s.NumAckPending())
	}
}

// TestAckAllForgedConsumerSeq acks, AckAll, a stream sequence that was skipped (a filtered
// consumer's) with a consumer sequence made up by the sender: the floor must stay below the
// deliveries still pending, whose own acks must then count.
func TestAckAllForgedConsumerSeq(t *testing.T) {
	s, clk := setup(t, Config{AckPolicy: AckAll, AckWait: time.Second})
	for _, q := range []uint64{1, 3, 5} { // 2 and 4 are not for this consumer
		s.Deliver(q, 1, clk.Now())
	}
	if !s.Ack(4, 1000, clk.Now()) {
		t.Fatal("ack all of 4 did not move the floor")
	}
	wantFloor(t, s, 2, 4)
	if !s.Ack(5, 3, clk.Now()) {
		t.Fatal("the ack of the delivery above the forged one was ignored")
	}
	wantFloor(t, s, 3, 5)
	if s.NumAckPending() != 0 {
		t.Fatalf("pending = %d, want 0", s.NumAckPending())
	}
}

func TestAckNoneFloorFollowsDelivery(t *testing.T) {
	s, clk := setup(t, Config{AckPolicy: AckNone, MaxAckPending: 1})
	for q := uint64(1); q <= 3; q++ {
		if _, moved := s.Deliver(q, 1, clk.Now()); !moved {
			t.Fatalf("delivering %d did not move the floor", q)
		}
	}
	wantFloor(t, s, 3, 3)
	if s.NumAckPending() != 0 || s.AtMaxAckPending() {
		t.Fatal("ack none keeps pending state")
	}
}

func TestAckWaitExpiryRedeliversLowestFirst(t *testing.T) {
	s, clk := setup(t, Config{AckPolicy: AckExplicit, AckWait: time.Second})
	deliverNew(s, clk, 1, 3)
	clk.Advance(500 * time.Millisecond)
	deliverNew(s, clk, 4, 4)
	if q, _ := s.Expire(clk.Now()); q {
		t.Fatal("expired before the ack wait")
	}
	if want := clk.Now().Add(500 * time.Millisecond); !s.NextDeadline().Equal(want) {
		t.Fatalf("next deadline = %v, want %v", s.NextDeadline(), want)
	}
	clk.Advance(500 * time.Millisecond)
	s.Nak(3, 3, 0, clk.Now()) // already due; a nak keeps it queued once
	if q, _ := s.Expire(clk.Now()); !q {
		t.Fatal("nothing expired after the ack wait")
	}
	var got []uint64
	for {
		seq, dc, ok := s.Redelivery()
		if !ok {
			break
		}
		if dc != 2 {
			t.Fatalf("redelivery of %d has count %d, want 2", seq, dc)
		}
		s.Deliver(seq, dc, clk.Now())
		got = append(got, seq)
	}
	if !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("redelivered %v, want [1 2 3]", got)
	}
	if s.NumRedelivered() != 3 {
		t.Fatalf("redelivered count = %d, want 3", s.NumRedelivered())
	}
	// Acks name the new consumer sequence; the floor uses the first one.
	s.Ack(1, 5, clk.Now())
	wantFloor(t, s, 1, 1)
}

func TestNakOrderAndDelay(t *testing.T) {
	s, clk := setup(t, Config{AckPolicy: AckExplicit, AckWait: time.Minute})
	deliverNew(s, clk, 1, 5)
	s.Nak(4, 4, 0, clk.Now())
	s.Nak(2, 2, 0, clk.Now())
	s.Nak(5, 5, 10*time.Second, clk.Now())
	// A delayed nak is not queued until its delay passes.
	if n := s.NumQueued(); n != 2 {
		t.Fatalf("queued %d, want 2", n)
	}
	seq, _, _ := s.Redelivery()
	if seq != 2 {
		t.Fatalf("first redelivery %d, want 2", seq)
	}
	s.Deliver(2, 2, clk.Now())
	seq, _, _ = s.Redelivery()
	if seq != 4 {
		t.Fatalf("second redelivery %d, want 4", seq)
	}
	s.Deliver(4, 2, clk.Now())
	if _, _, ok := s.Redelivery(); ok {
		t.Fatal("delayed nak redelivered at once")
	}
	clk.Advance(10 * time.Second)
	s.Expire(clk.Now())
	if seq, dc, ok := s.Redelivery(); !ok || seq != 5 || dc != 2 {
		t.Fatalf("after the delay got %d/%d/%v, want 5/2/true", seq, dc, ok)
	}
}

func TestNakOutOfRangeIgnored(t *testing.T) {
	s, clk := setup(t, Config{AckPolicy: AckExplicit, AckWait: time.Minute})
	deliverNew(s, clk, 1, 2)
	s.Ack(1, 1, clk.Now())
	s.Nak(1, 1, 0, clk.Now()) // below the floor
	s.Nak(2, 9, 0, clk.Now()) // beyond what was delivered
	if s.HasRedeliveries() {
		t.Fatal("an out-of-range nak queued a redelivery")
	}
}

func TestProgressExtendsAckWait(t *testing.T) {
	s, clk := setup(t, Config{AckPolicy: AckExplicit, AckWait: time.Second})
	deliverNew(s, clk, 1, 1)
	clk.Advance(900 * time.Millisecond)
	s.Progress(1, clk.Now())
	clk.Advance(900 * time.Millisecond)
	if q, _ := s.Expire(clk.Now()); q {
		t.Fatal("expired although in progress")
	}
	clk.Advance(200 * time.Millisecond)
	if q, _ := s.Expire(clk.Now()); !q {
		t.Fatal("did not expire a second after progress")
	}
}

func TestBackOff(t *testing.T) {
	s, clk := setup(t, Config{AckPolicy: AckExplicit, AckWait: time.Second,
		BackOff: []time.Duration{time.Second, 5 * time.Second}})
	deliverNew(s, clk, 1, 1)
	waits := []time.Duration{time.Second, 5 * time.Second, 5 * time.Second}
	for i, w := range waits {
		clk.Advance(w - time.Millisecond)
		if q, _ := s.Expire(clk.Now()); q {
			t.Fatalf("delivery %d expired before %v", i+1, w)
		}
		clk.Advance(time.Millisecond)
		if q, _ := s.Expire(clk.Now()); !q {
			t.Fatalf("delivery %d did not expire after %v", i+1, w)
		}
		seq, dc, ok := s.Redelivery()
		if !ok || seq != 1 || dc != uint64(i+2) {
			t.Fatalf("redelivery %d: %d/%d/%v", i+1, seq, dc, ok)
		}
		s.Deliver(seq, dc, clk.Now())
	}
}

func TestMaxDeliver(t *testing.T) {
	s, clk := setup(t, Config{AckPolicy: AckExplicit, AckWait: time.Second, MaxDeliver: 2})
	deliverNew(s, clk, 1, 2)
	clk.Advance(time.Second)
	s.Expire(clk.Now())
	seq, dc, _ := s.Redelivery()
	s.Deliver(seq, dc, clk.Now())
	seq, dc, _ = s.Redelivery()
	s.Deliver(seq, dc, clk.Now())
	s.Ack(2, 4, clk.Now())
	clk.Advance(time.Second)
	if _, moved := s.Expire(clk.Now()); !moved {
		t.Fatal("dropping the exhausted message did not move the floor")
	}
	if s.HasRedeliveries() || s.NumAckPending() != 0 {
		t.Fatal("a message went past MaxDeliver")
	}
	wantFloor(t, s, 4, 2)
	if s.NumRedelivered() != 1 {
		t.Fatalf("redelivered = %d, want 1", s.NumRedelivered())
	}
}

func TestMaxDeliverOnNak(t *testing.T) {
	s, clk := setup(t, Config{AckPolicy: AckExplicit, AckWait: time.Minute, MaxDeliver: 1})
	deliverNew(s, clk, 1, 1)
	s.Nak(1, 1, 0, clk.Now())
	if _, _, ok := s.Redelivery(); ok {
		t.Fatal("redelivered beyond MaxDeliver 1")
	}
	if s.NumAckPending() != 0 {
		t.Fatal("exhausted message still pending")
	}
	// As in nats-server, a message that reached MaxDeliver unacknowledged holds the floor
	// below it until an ack finds nothing pending.
	wantFloor(t, s, 0, 0)
	deliverNew(s, clk, 2, 3)
	s.Ack(2, 2, clk.Now())
	wantFloor(t, s, 0, 0)
	s.Ack(3, 3, clk.Now())
	wantFloor(t, s, 3, 3)
}

func TestMaxAckPending(t *testing.T) {
	s, clk := setup(t, Config{AckPolicy: AckExplicit, AckWait: time.Minute, MaxAckPending: 2})
	deliverNew(s, clk, 1, 2)
	if !s.AtMaxAckPending() {
		t.Fatal("not at max ack pending with 2 of 2")
	}
	s.Ack(2, 2, clk.Now())
	if s.AtMaxAckPending() {
		t.Fatal("still at max ack pending after an ack")
	}
}

func TestSkipMovesFloorOnlyWhenIdle(t *testing.T) {
	s, clk := setup(t, Config{AckPolicy: AckExplicit, AckWait: time.Minute})
	if !s.Skip(100) {
		t.Fatal("skipping with nothing pending did not move the floor")
	}
	wantFloor(t, s, 0, 99)
	deliverNew(s, clk, 100, 100)
	if s.Skip(200) {
		t.Fatal("skipping moved the floor past a pending message")
	}
	s.Ack(100, 1, clk.Now())
	wantFloor(t, s, 1, 199)
}

func TestResumeFromFloor(t *testing.T) {
	clk := clocktest.At(time.Unix(0, 0))
	s := New(Config{AckPolicy: AckExplicit, AckWait: time.Second}, Pair{Consumer: 7, Stream: 40}, 0)
	if s.Next() != 41 {
		t.Fatalf("next = %d, want 41", s.Next())
	}
	if dseq, _ := s.Deliver(41, 1, clk.Now()); dseq != 8 {
		t.Fatalf("consumer sequence = %d, want 8", dseq)
	}
}

func TestTermAndGone(t *testing.T) {
	s, clk := setup(t, Config{AckPolicy: AckExplicit, AckWait: time.Minute})
	deliverNew(s, clk, 1, 3)
	s.Nak(1, 1, 0, clk.Now())
	if !s.Gone(1) {
		t.Fatal("a gone first message did not move the floor")
	}
	if s.HasRedeliveries() {
		t.Fatal("a gone message stayed queued")
	}
	wantFloor(t, s, 1, 1)
}

func TestCompactionKeepsStateBounded(t *testing.T) {
	s, clk := setup(t, Config{AckPolicy: AckExplicit, AckWait: time.Minute})
	s.Deliver(1, 1, clk.Now()) // stays pending and holds the floor down
	for q := uint64(2); q <= 10_000; q++ {
		s.Deliver(q, 1, clk.Now())
		s.Ack(q, q, clk.Now())
	}
	if n := s.order.len(); n > 2*len(s.pending)+1024 {
		t.Fatalf("pending queue holds %d entries for %d pending", n, len(s.pending))
	}
	for range 10_000 {
		s.Progress(1, clk.Now())
	}
	if n := s.deadlines.len(); n > 2*len(s.pending)+1024 {
		t.Fatalf("deadline queue holds %d entries for %d pending", n, len(s.pending))
	}
	s.Ack(1, 1, clk.Now())
	wantFloor(t, s, 10_000, 10_000)
}

// A first delivery below ones already made (a deliver-last-per-subject start, say) holds the
// floor down like any other, and PendingSeqs still comes out in order.
func TestOutOfOrderFirstDelivery(t *testing.T) {
	s, clk := setup(t, Config{AckPolicy: AckExplicit, AckWait: time.Second})
	s.Deliver(5, 1, clk.Now())
	s.Deliver(6, 1, clk.Now())
	s.Deliver(3, 1, clk.Now())
	if got := s.PendingSeqs(); !slices.Equal(got, []uint64{3, 5, 6}) {
		t.Fatalf("pending %v, want [3 5 6]", got)
	}
	s.Ack(5, 1, clk.Now())
	s.Ack(6, 2, clk.Now())
	wantFloor(t, s, 2, 2)
	if !s.Ack(3, 3, clk.Now()) {
		t.Fatal("acking the lowest pending did not move the floor")
	}
	wantFloor(t, s, 3, 6)
}

// Deadlines come out earliest first, whatever order they were set in, and only the latest
// deadline of a delivery counts.
func TestDeadlinesEarliestFirst(t *testing.T) {
	s, clk := setup(t, Config{AckPolicy: AckExplicit, AckWait: 10 * time.Second})
	deliverNew(s, clk, 1, 3)               // 1, 2, 3 expire at +10s
	s.Nak(1, 1, 30*time.Second, clk.Now()) // 1 at +30s
	s.Nak(3, 3, 5*time.Second, clk.Now())  // 3 at +5s
	clk.Advance(4 * time.Second)           //
	s.Progress(2, clk.Now())               // 2 at +14s
	if got, want := s.NextDeadline(), clk.Now().Add(time.Second); !got.Equal(want) {
		t.Fatalf("next deadline %v, want %v (3's)", got, want)
	}
	clk.Advance(2 * time.Second) // +6s: 3 expires
	if queued, _ := s.Expire(clk.Now()); !queued {
		t.Fatal("3 not queued")
	}
	if got, want := s.NextDeadline(), clk.Now().Add(8*time.Second); !got.Equal(want) {
		t.Fatalf("next deadline %v, want %v (2's, restarted at +4s)", got, want)
	}
	clk.Advance(24 * time.Second) // +30s: 2 and 1 expire
	s.Expire(clk.Now())
	for _, want := range []uint64{1, 2, 3} {
		seq, _, ok := s.Redelivery()
		if !ok || seq != want {
			t.Fatalf("redelivery %d %v, want %d", seq, ok, want)
		}
		s.Deliver(seq, 2, clk.Now())
	}
	if got, want := s.NextDeadline(), clk.Now().Add(10*time.Second); !got.Equal(want) {
		t.Fatalf("next deadline after redelivery %v, want %v", got, want)
	}
}

// BenchmarkWakeWithManyPending is what a consumer's state costs it on every wake (the next
// deadline, expired deliveries) and per delivery and ack, with 100,000 deliveries pending
// against 100. Lookups miss the cache more in a larger map, so the ratio is a small number
// (1.8 here); a scan of everything pending on every wake made it 720.
func BenchmarkWakeWithManyPending(b *testing.B) {
	perWake := func(pending int) time.Duration {
		clk := clocktest.At(time.Unix(1_700_000_000, 0))
		s := New(Config{AckPolicy: AckExplicit, AckWait: time.Minute}, Pair{}, 1)
		deliverNew(s, clk, 1, uint64(pending))
		const wakes = 20_000
		next := uint64(pending) + 1
		t0 := time.Now()
		for range wakes {
			s.Deliver(next, 1, clk.Now())
			s.Ack(next-uint64(pending), next-uint64(pending), clk.Now())
			next++
			clk.Advance(time.Microsecond)
			s.Expire(clk.Now())
			s.NextDeadline()
		}
		return time.Since(t0) / wakes
	}
	var ratios []float64
	for b.Loop() {
		ratios = append(ratios, float64(perWake(100_000))/float64(perWake(100)))
	}
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "100k/100")
}

// What Skip passes (messages a filter leaves out) moves the scan and the floor, not what
// Shown reports: that stays at the last message taken until an ack moves the floor in order,
// as nats-server's positions do.
func TestShownIgnoresSkips(t *testing.T) {
	s, clk := setup(t, Config{AckPolicy: AckExplicit, AckWait: time.Minute})
	wantShown := func(step string, delivered, floor Pair) {
		t.Helper()
		if d, f := s.Shown(); d != delivered || f != floor {
			t.Fatalf("%s: shown delivered %+v, floor %+v, want %+v and %+v", step, d, f, delivered, floor)
		}
	}
	s.Deliver(1, 1, clk.Now())
	s.Deliver(3, 1, clk.Now())
	s.Ack(3, 2, clk.Now())
	s.Ack(1, 1, clk.Now())
	wantShown("both acked", Pair{2, 3}, Pair{2, 3})
	s.Skip(6) // 4 and 5 are not for this consumer
	wantFloor(t, s, 2, 5)
	wantShown("after a skip", Pair{2, 3}, Pair{2, 3})
	s.Deliver(6, 1, clk.Now())
	s.Deliver(7, 1, clk.Now())
	s.Skip(10)
	wantShown("6 and 7 delivered", Pair{4, 7}, Pair{2, 3})
	s.Ack(7, 4, clk.Now()) // out of order: no floor moves
	wantShown("7 acked", Pair{4, 7}, Pair{2, 3})
	s.Ack(6, 3, clk.Now())
	wantFloor(t, s, 4, 9)
	wantShown("all acked", Pair{4, 7}, Pair{4, 7})
}

// The flow_control ack policy acks as AckAll and, with no ack wait, never redelivers.
func TestAckFlowControlPolicy(t *testing.T) {
	cfg := ConfigOf(&server.ConsumerConfig{AckPolicy: server.AckFlowControl, FlowControl: true, MaxAckPending: 4})
	if cfg.AckPolicy != AckAll || cfg.AckWait != 0 {
		t.Fatalf("config %+v", cfg)
	}
	s, clk := setup(t, cfg)
	deliverNew(s, clk, 1, 4)
	if !s.AtMaxAckPending() {
		t.Fatal("4 pending of 4 is not at max_ack_pending")
	}
	if !s.NextDeadline().IsZero() {
		t.Fatalf("next deadline %v, want none", s.NextDeadline())
	}
	clk.Advance(time.Hour)
	if queued, _ := s.Expire(clk.Now()); queued || s.HasRedeliveries() {
		t.Fatal("a delivery without ack wait expired")
	}
	s.Progress(2, clk.Now())
	if !s.NextDeadline().IsZero() {
		t.Fatal("progress gave a delivery without ack wait a deadline")
	}
	if !s.Ack(3, 3, clk.Now()) {
		t.Fatal("an answer naming 3 did not move the floor")
	}
	wantFloor(t, s, 3, 3)
	if s.NumAckPending() != 1 || s.AtMaxAckPending() {
		t.Fatalf("pending = %d after the floor moved to 3", s.NumAckPending())
	}
	// An answer past what was delivered acks all that was, and no further.
	if !s.Ack(9, 9, clk.Now()) {
		t.Fatal("an answer past what was delivered did not move the floor")
	}
	wantFloor(t, s, 4, 4)
	if s.NumAckPending() != 0 || s.Next() != 5 {
		t.Fatalf("pending = %d, next %d after acking past delivery", s.NumAckPending(), s.Next())
	}
}
