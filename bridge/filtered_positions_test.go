package bridge

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// A filtered consumer reports the positions JetStream reports: delivered.stream_seq is the
// last message it delivered and ack_floor.stream_seq the last it has acked in order, never
// the stream messages beyond them that the filter skips (nats.c's jsSubscribeSync test and
// `nats consumer report` read them). Every step compares all of both sides' info.
func TestFilteredConsumerPositionsMatchJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "FP", Subjects: []string{"fp.>"}})
	for _, subj := range []string{"fp.a", "fp.b", "fp.a", "fp.b", "fp.b", "fp.a", "fp.a", "fp.b", "fp.b"} {
		tw.pub(subj, []byte("x"))
	}
	cons, _ := tw.consumer("FP", jetstream.ConsumerConfig{Durable: "A", FilterSubject: "fp.a", AckPolicy: jetstream.AckExplicitPolicy})
	first := tw.fetch(cons, 2) // 1 and 3
	tw.ack(first, 3)           // out of order: the floor stays
	tw.ack(first, 1)
	rest := tw.fetch(cons, 5) // 6 and 7, nothing after
	tw.ack(rest, 6)
	tw.ack(rest, 7)
	tw.pub("fp.b", []byte("x")) // more the filter skips
	tw.compareAll("publish past the filter")
	tw.pub("fp.a", []byte("x"))
	tw.ack(tw.fetch(cons, 1), 11)
}

// The positions JetStream reports survive the replica: another replica answering from the
// stored cursor (its owner still serving) and a restarted one that serves the consumer report
// the last message the consumer took, not the messages its filter skipped after it.
func TestFilteredConsumerPositionsSurviveTheReplica(t *testing.T) {
	t.Parallel()
	a := setup(t, setupOpts{config: func(c *Config) { c.ReplicaName = "a" }})
	ctx := testContext(t)
	s := newStream(t, ctx, a, "FR", "fr.>")
	for _, subj := range []string{"fr.a", "fr.b", "fr.a", "fr.b", "fr.b"} {
		if _, err := a.js.Publish(ctx, subj, nil); err != nil {
			t.Fatal(err)
		}
	}
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "A", FilterSubject: "fr.a", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	// A fetch of more than there is scans to the end of the stream, past 4 and 5.
	got := fetchSeqs(t, c, 5, time.Second, func(m jetstream.Msg) {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	})
	if !slices.Equal(got, []uint64{1, 3}) {
		t.Fatalf("fetched %v, want [1 3]", got)
	}
	positions := func(js jetstream.JetStream, who string) {
		t.Helper()
		testwait.For(t, 5*time.Second, func() error {
			c, err := js.Consumer(ctx, "FR", "A")
			if err != nil {
				return err
			}
			info := c.CachedInfo()
			if info.Delivered.Stream != 3 || info.AckFloor.Stream != 3 || info.Delivered.Consumer != 2 || info.AckFloor.Consumer != 2 {
				return fmt.Errorf("%s: delivered %+v, ack floor %+v, want stream 3 and consumer 2 for both", who, info.Delivered, info.AckFloor)
			}
			return nil
		})
	}
	positions(a.js, "the serving replica")

	b := setup(t, setupOpts{db: a.db, config: func(c *Config) { c.ReplicaName = "b" }})
	testwait.For(t, 5*time.Second, func() error {
		_, err := b.js.Stream(ctx, "FR")
		return err
	})
	db := a.db
	a.stop(t)
	positions(b.js, "another replica, after the serving one stopped")
	b.stop(t)
	positions(setup(t, setupOpts{db: db}).js, "a restarted replica")
}
