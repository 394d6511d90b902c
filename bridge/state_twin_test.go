package bridge

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The state a client reads of streams and consumers, side by side with JetStream, in the
// cases where jetgres once answered differently. compareAll, which every twin step calls,
// does the comparing.

// A stream that never held a message starts at sequence 0, also once consumers came and
// went.
func TestEmptyStreamStateMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "E", Subjects: []string{"e.>"}})
	tw.consumer("E", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	tw.consumer("E", jetstream.ConsumerConfig{Durable: "n", DeliverPolicy: jetstream.DeliverNewPolicy, AckPolicy: jetstream.AckExplicitPolicy})
	tw.deleteConsumer("E", "c")
	tw.deleteConsumer("E", "n")
	tw.createStream(jetstream.StreamConfig{Name: "EI", Subjects: []string{"ei.>"}, Retention: jetstream.InterestPolicy})
	tw.consumer("EI", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	tw.deleteConsumer("EI", "c")
	tw.pub("e.a", nil)
	tw.purge("E")
}

// num_subjects counts the subjects of the messages left, after deletes, purges and limits.
func TestNumSubjectsMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "NS", Subjects: []string{"ns.>"}, MaxMsgsPerSubject: 2})
	for _, subj := range []string{"ns.a", "ns.b", "ns.a", "ns.c.x", "ns.a", "ns.d"} {
		tw.pub(subj, []byte("x"))
	}
	tw.deleteMsg("NS", 4) // the only ns.c.x
	tw.purge("NS", jetstream.WithPurgeSubject("ns.b"))
	for side, js := range tw.js {
		s, err := js.Stream(tw.ctx, "NS")
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(tw.ctx, jetstream.WithSubjectFilter("ns.a"))
		if err != nil {
			t.Fatal(err)
		}
		if info.State.NumSubjects != 2 {
			t.Errorf("%s: num_subjects %d with a subjects filter, want 2", sideName[side], info.State.NumSubjects)
		}
	}
	tw.purge("NS")
}

// A new consumer that starts past the first message has acknowledged nothing yet: its ack
// floor is 0 until an ack moves it, whatever its deliver policy.
func TestNewConsumerAckFloorMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "AF", Subjects: []string{"af.*"}})
	for i := range 6 {
		tw.pub(fmt.Sprintf("af.%d", i%2), nil)
	}
	for _, cfg := range []jetstream.ConsumerConfig{
		{Durable: "new", DeliverPolicy: jetstream.DeliverNewPolicy},
		{Durable: "last", DeliverPolicy: jetstream.DeliverLastPolicy},
		{Durable: "seq", DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: 4},
		{Durable: "lps", DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy, FilterSubject: "af.*"},
	} {
		cfg.AckPolicy = jetstream.AckExplicitPolicy
		cons, _ := tw.consumer("AF", cfg)
		msgs := tw.fetch(cons, 1)
		tw.pub("af.0", nil)
		if len(msgs[ours]) > 0 {
			md, _ := msgs[ours][0].Metadata()
			tw.ack(msgs, md.Sequence.Stream)
		}
	}
}

// A purge moves the consumers' delivered and ack floor stream sequences up to the purge
// point, as JetStream does.
func TestPurgeMovesConsumersMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "PC", Subjects: []string{"pc.*"}})
	tw.pubN("pc.a", 5, 4)
	cons, _ := tw.consumer("PC", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	tw.ack(tw.fetch(cons, 2), 1)
	tw.purge("PC", jetstream.WithPurgeSequence(4))
	tw.fetch(cons, 1)
	tw.pubN("pc.b", 3, 4)
	tw.purge("PC")
	tw.pubN("pc.a", 2, 4)
	tw.ack(tw.fetch(cons, 5), 9, 10)
}

// A message that reached max_deliver without an ack holds the ack floor where it was.
func TestMaxDeliverHoldsAckFloorMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "MD", Subjects: []string{"md"}})
	tw.pubN("md", 4, 4)
	cons, _ := tw.consumer("MD", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 2})
	for range 2 {
		msgs := tw.fetch(cons, 1)
		for side := range msgs {
			if err := msgs[side][0].Nak(); err != nil {
				t.Fatal(err)
			}
		}
		tw.compareAll("nak")
	}
	tw.ack(tw.fetch(cons, 3), 2, 3, 4)
}

// A consumer that delivers the last message of each subject counts only those as pending,
// in its info and in each delivery's ack reply.
func TestLastPerSubjectPendingMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.exactPending = true
	tw.createStream(jetstream.StreamConfig{Name: "LP", Subjects: []string{"lp.*"}})
	tw.pubN("lp.a", 10, 4)
	cons, _ := tw.consumer("LP", jetstream.ConsumerConfig{Durable: "one", DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy, FilterSubject: "lp.*", AckPolicy: jetstream.AckExplicitPolicy})
	tw.ack(tw.fetch(cons, 2), 10)
	for i := range 9 {
		tw.pub(fmt.Sprintf("lp.%c", 'b'+i%3), nil)
	}
	many, _ := tw.consumer("LP", jetstream.ConsumerConfig{Durable: "many", DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy, FilterSubject: "lp.*", AckPolicy: jetstream.AckExplicitPolicy})
	tw.fetch(many, 2)
	tw.pub("lp.a", nil)
	tw.fetch(many, 5)
	tw.fetch(cons, 20)
}

// A pull request that waits on a paused consumer ends, at its expiry, with JetStream's
// 408 Request Timeout and what it still wanted.
func TestPausedPullTimesOutMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "PP", Subjects: []string{"pp"}})
	tw.pubN("pp", 2, 4)
	later := time.Now().Add(time.Hour)
	tw.consumer("PP", jetstream.ConsumerConfig{Durable: "p", AckPolicy: jetstream.AckExplicitPolicy, PauseUntil: &later})
	var got [2]string
	for side, js := range tw.js {
		nc := js.Conn()
		inbox := nc.NewInbox()
		sub, err := nc.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := json.Marshal(map[string]any{"batch": 3, "max_bytes": 1000, "expires": (300 * time.Millisecond).Nanoseconds()})
		if err := nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT.PP.p", inbox, req); err != nil {
			t.Fatal(err)
		}
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("%s: no answer to a pull request on a paused consumer: %v", sideName[side], err)
		}
		got[side] = statusText(m)
		_ = sub.Unsubscribe()
	}
	if got[ours] != got[theirs] {
		t.Errorf("pull request on a paused consumer:\n jetgres   %s\n JetStream %s", got[ours], got[theirs])
	}
	tw.compareAll("paused pull")
}

func statusText(m *nats.Msg) string {
	return fmt.Sprintf("%s %s pending msgs %s bytes %s data %q", m.Header.Get("Status"), m.Header.Get("Description"),
		m.Header.Get("Nats-Pending-Messages"), m.Header.Get("Nats-Pending-Bytes"), m.Data)
}

// A purge of a stream that never held a message moves its first sequence as it would move a
// stream's that did: JetStream reports first_seq 1 after a plain purge or one that keeps
// messages, the purge's sequence after one up to a sequence, and the next publish takes it.
func TestPurgeNeverUsedStreamMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "PF", Subjects: []string{"pf.>"}})
	tw.purge("PF")
	tw.pub("pf.a", nil)
	tw.createStream(jetstream.StreamConfig{Name: "PK", Subjects: []string{"pk.>"}})
	tw.purge("PK", jetstream.WithPurgeKeep(3))
	tw.pub("pk.a", nil)
	tw.createStream(jetstream.StreamConfig{Name: "PS", Subjects: []string{"ps.>"}})
	tw.purge("PS", jetstream.WithPurgeSequence(5))
	tw.pub("ps.a", nil)
	tw.createStream(jetstream.StreamConfig{Name: "PU", Subjects: []string{"pu.>"}})
	tw.purge("PU", jetstream.WithPurgeSubject("pu.a"))
	tw.createStream(jetstream.StreamConfig{Name: "PT", Subjects: []string{"pt.>"}})
	tw.purge("PT", jetstream.WithPurgeSubject("pt.a"), jetstream.WithPurgeSequence(4))
	tw.pub("pt.b", nil)
	tw.createStream(jetstream.StreamConfig{Name: "PI", Subjects: []string{"pi.>"}, Retention: jetstream.InterestPolicy})
	tw.consumer("PI", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	tw.deleteConsumer("PI", "c")
	tw.pub("pi.a", nil)
}

// TestStreamStateBytes checks the byte accounting with headers, which JetStream counts with
// their own length prefix.
func TestStreamStateBytes(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "HB", Subjects: []string{"hb.*"}})
	for side, js := range tw.js {
		msg := nats.NewMsg("hb.h")
		msg.Header.Set("Trace", "abc")
		msg.Data = bytes.Repeat([]byte("z"), 20)
		if _, err := js.PublishMsg(tw.ctx, msg); err != nil {
			t.Fatalf("%s: %v", sideName[side], err)
		}
	}
	tw.pub("hb.p", []byte("plain"))
	tw.state("HB")
}
