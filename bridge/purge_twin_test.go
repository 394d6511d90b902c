package bridge

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A purge of some subjects moves the consumers that nats-server moves: one whose filter
// equals or lies inside the purged subject, and one whose filter is wider but covers it
// (its pending deliveries of purged messages go, its ack floor moves). Others stay where
// they are. compareAll compares every consumer's info after each step.
func TestFilteredPurgeMovesConsumersMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "FP", Subjects: []string{"fp.>"}})
	for range 3 {
		for _, subj := range []string{"fp.a", "fp.b", "fp.c.x", "fp.c.y"} {
			tw.pub(subj, []byte(subj))
		}
	}
	// Push consumers deliver up to the end of the stream: ending on a message that theirs
	// match keeps both sides' delivered sequences comparable.
	tw.pub("fp.a", nil)
	pull := map[string]jetstream.ConsumerConfig{
		"eq":    {FilterSubject: "fp.a"},
		"inner": {FilterSubject: "fp.c.x"},
		"all":   {},
		"wide":  {FilterSubject: "fp.>"},
		"other": {FilterSubject: "fp.b"},
		"multi": {FilterSubjects: []string{"fp.a", "fp.b"}},
	}
	cons := map[string][2]jetstream.Consumer{}
	for _, name := range []string{"eq", "inner", "all", "wide", "other", "multi"} {
		cfg := pull[name]
		cfg.Durable, cfg.AckPolicy = name, jetstream.AckExplicitPolicy
		cons[name], _ = tw.consumer("FP", cfg)
		msgs := tw.fetch(cons[name], 2)
		md, _ := msgs[ours][0].Metadata()
		tw.ack(msgs, md.Sequence.Stream)
	}
	// Push consumers that delivered everything and had nothing acknowledged; for one that
	// purges leave alone see "other".
	var subs [2][]*nats.Subscription
	for _, p := range []struct{ name, filter string }{{"peq", "fp.a"}, {"pwide", ""}} {
		for side, js := range tw.js {
			nc := js.Conn()
			sub, err := nc.SubscribeSync("deliver.fp." + p.name)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sub.Unsubscribe() })
			subs[side] = append(subs[side], sub)
			cfg := nats.ConsumerConfig{Durable: p.name, DeliverSubject: "deliver.fp." + p.name, FilterSubject: p.filter, AckPolicy: nats.AckExplicitPolicy, AckWait: time.Minute}
			if _, err := legacyJS(t, nc).AddConsumer("FP", &cfg); err != nil {
				t.Fatalf("%s: %s: %v", sideName[side], p.name, err)
			}
		}
		tw.cons = append(tw.cons, [2]string{"FP", p.name})
	}
	// Both sides' push consumers must have delivered before a purge, not merely agree.
	received := func(want ...int) {
		for side := range subs {
			for k, sub := range subs[side] {
				nextMsgs(t, sub, want[k], 10*time.Second)
			}
		}
	}
	received(4, 13)
	tw.compareAll("push consumers delivered")

	tw.purge("FP", jetstream.WithPurgeSubject("fp.a"))
	tw.purge("FP", jetstream.WithPurgeSubject("fp.c.>"), jetstream.WithPurgeKeep(1))
	tw.purge("FP", jetstream.WithPurgeSubject("fp.b"), jetstream.WithPurgeSequence(6))
	for _, subj := range []string{"fp.a", "fp.b", "fp.c.x", "fp.a"} {
		tw.pub(subj, []byte(subj))
	}
	received(2, 4)
	// Fetching exactly what is pending keeps both sides from scanning past the last match.
	// inner and other would first pass over messages not theirs with nothing pending, which
	// moves jetgres's ack floor (consumerstate's Skip) and not JetStream's: not a purge's
	// doing, and left out here.
	for _, name := range []string{"eq", "all", "wide", "multi"} {
		info, err := cons[name][ours].Info(tw.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending > 0 {
			tw.fetch(cons[name], int(info.NumPending))
		}
	}
}
