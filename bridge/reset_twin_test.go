package bridge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// resetResult is what a client reads from a reset's answer, or its error.
type resetResult struct {
	Err                 string
	ResetSeq            uint64
	Delivered, AckFloor jetstream.SequenceInfo
	NumPending          uint64
	NumAckPending       int
	NumRedelivered      int
}

// reset sends CONSUMER.RESET (seq 0: back to the ack floor) on both sides through nats.go
// and compares the answers. A push consumer delivers again before the answer is read, so
// for one (push) only the reset point and positions are compared, as nats-server reports
// them whatever was delivered since.
func (tw *twin) reset(stream, consumer string, seq uint64, push bool) resetResult {
	tw.t.Helper()
	var got [2]resetResult
	for side, js := range tw.js {
		ctx, cancel := context.WithTimeout(tw.ctx, 5*time.Second)
		var r *jetstream.ConsumerResetResponse
		var err error
		if seq == 0 {
			r, err = js.ResetConsumer(ctx, stream, consumer)
		} else {
			r, err = js.ResetConsumerToSequence(ctx, stream, consumer, seq)
		}
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrConsumerInvalidReset):
			got[side].Err = err.Error()
		case err != nil:
			tw.t.Fatalf("%s: reset %s > %s to %d: %v", sideName[side], stream, consumer, seq, err)
		default:
			got[side] = resetResult{ResetSeq: r.ResetSeq,
				Delivered: jetstream.SequenceInfo{Consumer: r.Delivered.Consumer, Stream: r.Delivered.Stream},
				AckFloor:  jetstream.SequenceInfo{Consumer: r.AckFloor.Consumer, Stream: r.AckFloor.Stream}}
			if !push {
				got[side].NumPending, got[side].NumAckPending, got[side].NumRedelivered = r.NumPending, r.NumAckPending, r.NumRedelivered
			}
		}
	}
	if fmt.Sprint(got[ours]) != fmt.Sprint(got[theirs]) {
		tw.t.Fatalf("reset %s > %s to %d: jetgres %+v, jetstream %+v", stream, consumer, seq, got[ours], got[theirs])
	}
	if got[ours].Err == "" && !push {
		tw.compareAll(fmt.Sprintf("reset %s > %s to %d", consumer, stream, seq))
	}
	return got[ours]
}

// A reset answers as nats-server's, and the consumer delivers again from the reset point
// what it delivered before, with the same delivery counts, on both sides.
func TestConsumerResetPullTwin(t *testing.T) {
	t.Parallel()
	// A reset recounts num_pending in the background on jetgres, as after removals, so the
	// pending token of a delivery right after it may lag; consumer info compares it exactly.
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "RS", Subjects: []string{"rs.>"}})
	for i := range 10 {
		tw.pub(fmt.Sprintf("rs.%d", i%3), []byte{byte(i)})
	}
	cons, _ := tw.consumer("RS", jetstream.ConsumerConfig{Durable: "P", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
	msgs := tw.fetch(cons, 5)
	tw.ack(msgs, 1, 2, 4)

	if r := tw.reset("RS", "P", 0, false); r.ResetSeq != 3 {
		t.Fatalf("reset to the ack floor: reset_seq %d, want 3", r.ResetSeq)
	}
	msgs = tw.fetch(cons, 4)
	if seqs := streamSeqs(t, msgs[ours]); !slices.Equal(seqs, []uint64{3, 4, 5, 6}) {
		t.Fatalf("after a reset to the ack floor: delivered %v, want 3 to 6", seqs)
	}
	tw.ack(msgs, 3, 4, 5, 6)

	// Back before the floor, then forward past what was delivered.
	tw.reset("RS", "P", 2, false)
	tw.fetch(cons, 3)
	tw.reset("RS", "P", 9, false)
	msgs = tw.fetch(cons, 5)
	if seqs := streamSeqs(t, msgs[ours]); !slices.Equal(seqs, []uint64{9, 10}) {
		t.Fatalf("after a reset to 9: delivered %v, want 9 and 10", seqs)
	}

	// Refusals: deliver policies that take no sequence, or not one below their start.
	tw.consumer("RS", jetstream.ConsumerConfig{Durable: "NEW", DeliverPolicy: jetstream.DeliverNewPolicy, AckPolicy: jetstream.AckExplicitPolicy})
	tw.reset("RS", "NEW", 3, false)
	tw.reset("RS", "NEW", 0, false)
	tw.consumer("RS", jetstream.ConsumerConfig{Durable: "FROM", DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: 5, AckPolicy: jetstream.AckExplicitPolicy})
	tw.reset("RS", "FROM", 4, false)
	tw.reset("RS", "FROM", 6, false)
	if _, code := tw.consumer("RS", jetstream.ConsumerConfig{Durable: "LPS", DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy, FilterSubject: "rs.>", AckPolicy: jetstream.AckExplicitPolicy}); code != 0 {
		t.Fatalf("last per subject consumer: err_code %d", code)
	}
	tw.reset("RS", "LPS", 2, false)
	tw.reset("RS", "LPS", 0, false)
	tw.fetch([2]jetstream.Consumer{mustConsumer(t, tw, ours, "RS", "LPS"), mustConsumer(t, tw, theirs, "RS", "LPS")}, 5)

	// A body that is not JSON is refused.
	tw.sameAPI("reset with a bad body", "$JS.API.CONSUMER.RESET.RS.P", "{bad")
}

// mustConsumer looks a pull consumer up on one side.
func mustConsumer(t *testing.T, tw *twin, side int, stream, name string) jetstream.Consumer {
	t.Helper()
	c, err := tw.js[side].Consumer(tw.ctx, stream, name)
	if err != nil {
		t.Fatalf("%s: %v", sideName[side], err)
	}
	return c
}

func streamSeqs(t *testing.T, msgs []jetstream.Msg) []uint64 {
	t.Helper()
	var seqs []uint64
	for _, m := range msgs {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, md.Sequence.Stream)
	}
	return seqs
}

// A push consumer that a reset sends back redelivers from its ack floor, as the first
// delivery of each message again.
func TestConsumerResetPushTwin(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "RP", Subjects: []string{"rp.>"}})
	for i := range 6 {
		tw.pub("rp.x", []byte{byte(i)})
	}
	var subs [2]*nats.Subscription
	for side, js := range tw.js {
		sub, err := js.Conn().SubscribeSync("deliver.rp")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		subs[side] = sub
		cfg := nats.ConsumerConfig{Durable: "PUSH", DeliverSubject: "deliver.rp", AckPolicy: nats.AckExplicitPolicy, AckWait: time.Minute}
		if _, err := legacyJS(t, js.Conn()).AddConsumer("RP", &cfg); err != nil {
			t.Fatalf("%s: %v", sideName[side], err)
		}
	}
	tw.cons = append(tw.cons, [2]string{"RP", "PUSH"})
	// deliveries reads n deliveries on both sides, acks those at the stream sequences in
	// ack, and compares the stream sequences and delivery counts.
	deliveries := func(what string, n int, ack ...uint64) {
		t.Helper()
		var got [2][]string
		for side, sub := range subs {
			for _, m := range nextMsgs(t, sub, n, 10*time.Second) {
				md, err := m.Metadata()
				if err != nil {
					t.Fatal(err)
				}
				got[side] = append(got[side], fmt.Sprintf("%d/%d/%d", md.Sequence.Stream, md.Sequence.Consumer, md.NumDelivered))
				if slices.Contains(ack, md.Sequence.Stream) {
					if err := m.AckSync(); err != nil {
						t.Fatalf("%s: ack: %v", sideName[side], err)
					}
				}
			}
		}
		if !slices.Equal(got[ours], got[theirs]) {
			t.Fatalf("%s: jetgres delivered %v, jetstream %v", what, got[ours], got[theirs])
		}
		tw.compareAll(what)
	}
	deliveries("first deliveries", 6, 1, 2)
	if r := tw.reset("RP", "PUSH", 0, true); r.ResetSeq != 3 {
		t.Fatalf("reset: reset_seq %d, want 3", r.ResetSeq)
	}
	deliveries("after the reset", 4, 3, 4, 5, 6)
	tw.reset("RP", "PUSH", 5, true)
	deliveries("after a reset to 5", 2)
}

// nats-server's consumer answers its reset subject itself, so a reset of a consumer or
// stream that does not exist goes unanswered there, and the client waits out its timeout;
// jetgres, which listens on all of $JS.API, answers at once with no responders.
func TestConsumerResetMissing(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	newStream(t, ctx, tb, "RM", "rm.>")
	for _, c := range [][2]string{{"RM", "MISSING"}, {"NOSUCH", "C"}} {
		if _, err := tb.js.ResetConsumer(ctx, c[0], c[1]); !errors.Is(err, nats.ErrNoResponders) {
			t.Errorf("reset of %s > %s: %v, want no responders", c[0], c[1], err)
		}
	}
}

// With two replicas behind one NATS server, a reset that reaches the replica not serving
// the consumer is forwarded to the one that does, which resets it: every reset is answered
// once and the consumer delivers again from the reset point.
func TestConsumerResetWithReplicas(t *testing.T) {
	t.Parallel()
	a := setup(t, setupOpts{config: func(c *Config) { c.ReplicaName = "a" }})
	ctx := testContext(t)
	s := newStream(t, ctx, a, "RR", "rr.>")
	publishN(t, ctx, a.js, "rr.x", 4)
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, setupOpts{db: a.db, nats: a.nats, config: func(c *Config) { c.ReplicaName = "b" }})
	testwait.For(t, 5*time.Second, func() error {
		_, err := b.js.Stream(ctx, "RR")
		return err
	})
	// The API's queue group picks either replica: enough resets reach both.
	for i := range 8 {
		md := fetchOne(t, c)
		if md.Sequence.Stream != 1 || md.NumDelivered != 1 {
			t.Fatalf("reset %d: delivered %d for the %d. time, want 1 for the first", i, md.Sequence.Stream, md.NumDelivered)
		}
		r, err := b.js.ResetConsumer(ctx, "RR", "C")
		if err != nil {
			t.Fatalf("reset %d: %v", i, err)
		}
		if r.ResetSeq != 1 || r.Delivered.Stream != 0 || r.NumPending != 4 {
			t.Fatalf("reset %d: reset_seq %d, delivered %d, num_pending %d; want 1, 0 and 4", i, r.ResetSeq, r.Delivered.Stream, r.NumPending)
		}
	}
}

// On an interest stream, the messages a reset moves a consumer past lose its interest and
// go, as in nats-server; a reset back to the ack floor keeps them.
func TestConsumerResetInterestTwin(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "RI", Subjects: []string{"ri.>"}, Retention: jetstream.InterestPolicy})
	cons, _ := tw.consumer("RI", jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
	for i := range 5 {
		tw.pub("ri.x", []byte{byte(i)})
	}
	tw.fetch(cons, 2)
	tw.reset("RI", "C", 0, false)
	tw.settle("RI", func(st jetstream.StreamState) bool { return st.Msgs == 5 })
	tw.reset("RI", "C", 4, false)
	tw.settle("RI", func(st jetstream.StreamState) bool { return st.Msgs == 2 && st.FirstSeq == 4 })
	msgs := tw.fetch(cons, 5)
	tw.ack(msgs, 4, 5)
	tw.settle("RI", func(st jetstream.StreamState) bool { return st.Msgs == 0 })
}
