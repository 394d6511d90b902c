package bridge

import (
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// Interest and workqueue retention side by side with JetStream.

func TestRetentionWorkQueue(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "WQ", Subjects: []string{"wq.*"}, Retention: jetstream.WorkQueuePolicy})
	// Messages wait for a consumer.
	tw.pubN("wq.a", 4, 10)
	tw.pubN("wq.b", 6, 10)
	tw.want("WQ", 10, 1, 10, 0)
	if _, code := tw.consumer("WQ", jetstream.ConsumerConfig{Durable: "none", AckPolicy: jetstream.AckNonePolicy}); code == 0 {
		t.Fatal("an ack-none consumer on a work queue was accepted")
	}
	cons, _ := tw.consumer("WQ", jetstream.ConsumerConfig{Durable: "w", AckPolicy: jetstream.AckExplicitPolicy})
	first := tw.fetch(cons, 6)
	// Acked in and out of order: the first sequence moves past the front, the rest leave
	// holes.
	tw.ack(first, 1, 2, 3, 5)
	tw.want("WQ", 6, 4, 10, 1)
	tw.ack(first, 4)
	tw.want("WQ", 5, 6, 10, 0)
	second := tw.fetch(cons, 10)
	tw.ack(second, 7, 8, 10)
	tw.want("WQ", 2, 6, 10, 3)
	tw.ack(first, 6)
	tw.ack(second, 9)
	tw.want("WQ", 0, 11, 10, 0)
	tw.pub("wq.b", nil)
	tw.ack(tw.fetch(cons, 1), 11)
	tw.want("WQ", 0, 12, 11, 0)
}

func TestRetentionWorkQueueFilters(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "WQF", Subjects: []string{"wqf.>"}, Retention: jetstream.WorkQueuePolicy})
	a, _ := tw.consumer("WQF", jetstream.ConsumerConfig{Durable: "a", FilterSubject: "wqf.a.*", AckPolicy: jetstream.AckExplicitPolicy})
	for i := range 12 {
		tw.pub([]string{"wqf.a.1", "wqf.b", "wqf.a.2", "wqf.c"}[i%4], nil)
	}
	// Only a's messages go; b's and c's wait, so a's acks leave holes behind them.
	tw.ack(tw.fetch(a, 6), 1, 3, 5, 7, 9, 11)
	tw.want("WQF", 6, 2, 12, 5)
	b, _ := tw.consumer("WQF", jetstream.ConsumerConfig{Durable: "b", FilterSubject: "wqf.b", AckPolicy: jetstream.AckExplicitPolicy})
	tw.ack(tw.fetch(b, 3), 2, 10)
	tw.want("WQF", 4, 4, 12, 5)

	// nats-server's rules for consumers sharing a work queue, checked on the same sequence of
	// consumers as the reference holds.
	s := tw.tb.bridge.streams.Lookup("WQF")
	for _, c := range []jetstream.ConsumerConfig{
		{Durable: "all", AckPolicy: jetstream.AckExplicitPolicy},
		{Durable: "a2", FilterSubject: "wqf.a.1", AckPolicy: jetstream.AckExplicitPolicy},
		{Durable: "wide", FilterSubject: "wqf.>", AckPolicy: jetstream.AckExplicitPolicy},
		{Durable: "c", FilterSubject: "wqf.c", AckPolicy: jetstream.AckExplicitPolicy},
		{Durable: "a", FilterSubjects: []string{"wqf.a.*", "wqf.d"}, AckPolicy: jetstream.AckExplicitPolicy},
		{Durable: "a", AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: "wqf.b"},
	} {
		_, err := tw.js[theirs].CreateOrUpdateConsumer(tw.ctx, "WQF", c)
		want := errCode(t, theirs, err)
		var got jetstream.ErrorCode
		cfg := server.ConsumerConfig{Durable: c.Durable, FilterSubject: c.FilterSubject, FilterSubjects: c.FilterSubjects}
		refused, rerr := tw.tb.bridge.retention.WorkQueueConflict(tw.ctx, s, c.Durable, &cfg)
		if rerr != nil {
			t.Fatal(rerr)
		}
		if refused != nil {
			got = jetstream.ErrorCode(refused.ErrCode)
		}
		if got != want {
			t.Fatalf("consumer %s filters %q %q: jetgres err_code %d, jetstream %d", c.Durable, c.FilterSubject, c.FilterSubjects, got, want)
		}
		if want == 0 && c.Durable != "a" {
			if _, err := tw.js[ours].CreateOrUpdateConsumer(tw.ctx, "WQF", c); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestRetentionInterest(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "IN", Subjects: []string{"in.*"}, Retention: jetstream.InterestPolicy})
	// Without consumers nothing is kept, but sequences are taken.
	tw.pubN("in.a", 3, 10)
	tw.want("IN", 0, 4, 3, 0)
	a, _ := tw.consumer("IN", jetstream.ConsumerConfig{Durable: "a", FilterSubject: "in.a", AckPolicy: jetstream.AckExplicitPolicy})
	all, _ := tw.consumer("IN", jetstream.ConsumerConfig{Durable: "all", AckPolicy: jetstream.AckExplicitPolicy})
	for _, subj := range []string{"in.a", "in.b", "in.a", "in.b", "in.a", "in.c"} {
		tw.pub(subj, []byte(subj))
	}
	tw.want("IN", 6, 4, 9, 0)
	// A message goes once every consumer whose filter matches it has acknowledged it.
	tw.ack(tw.fetch(a, 3), 4, 8)
	tw.want("IN", 6, 4, 9, 0)
	allMsgs := tw.fetch(all, 6)
	tw.ack(allMsgs, 4, 5, 6, 7)
	tw.want("IN", 3, 6, 9, 1)
	// Deleting a consumer removes what only it still needed.
	tw.deleteConsumer("IN", "all")
	tw.settle("IN", func(st jetstream.StreamState) bool { return st.Consumers == 1 && st.Msgs == 1 })
	tw.want("IN", 1, 6, 9, 3)
	// A subject no consumer wants is not kept.
	tw.pub("in.z", nil)
	tw.want("IN", 1, 6, 10, 4)
	tw.deleteConsumer("IN", "a")
	tw.settle("IN", func(st jetstream.StreamState) bool { return st.Consumers == 0 && st.Msgs == 0 })
	tw.want("IN", 0, 11, 10, 0)
}

func TestRetentionInterestAckNone(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "INN", Subjects: []string{"inn"}, Retention: jetstream.InterestPolicy})
	c, _ := tw.consumer("INN", jetstream.ConsumerConfig{Durable: "n", AckPolicy: jetstream.AckNonePolicy})
	tw.pubN("inn", 5, 10)
	tw.fetch(c, 3)
	tw.settle("INN", func(st jetstream.StreamState) bool { return st.Msgs == 2 })
	tw.want("INN", 2, 4, 5, 0)
}

func TestRetentionChangeToInterest(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	cfg := jetstream.StreamConfig{Name: "CH", Subjects: []string{"ch"}}
	tw.createStream(cfg)
	tw.pubN("ch", 4, 10)
	cfg.Retention = jetstream.InterestPolicy
	tw.updateStream(cfg)
	tw.want("CH", 0, 5, 4, 0)
	cfg.Retention = jetstream.WorkQueuePolicy
	for side, js := range tw.js {
		if _, err := js.UpdateStream(tw.ctx, cfg); errCode(t, side, err) != jetstream.ErrorCode(server.JSStreamInvalidConfigF) {
			t.Fatalf("%s: changing to workqueue: %v", sideName[side], err)
		}
	}
}
