package bridge

// Acks for deliveries nobody was sent, compared with what JetStream does with them, and a
// repeated create after a restart: the hostile inputs that need a JetStream twin or a
// restart, apart from those of hostile_test.go.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/nats-io/nats.go/jetstream"
)

// decodeObject decodes a JSON object keeping its numbers exact.
func decodeObject(t *testing.T, s string) map[string]any {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return m
}

// consumerSnap is the state of a consumer that acks change.
type consumerSnap struct {
	Delivered, AckFloor jetstream.SequenceInfo
	AckPending          int
	Redelivered         int
	Pending             uint64
}

func snapConsumer(t *testing.T, ctx context.Context, js jetstream.JetStream, stream, name string) consumerSnap {
	t.Helper()
	c, err := js.Consumer(ctx, stream, name)
	if err != nil {
		t.Fatalf("consumer %s > %s: %v", stream, name, err)
	}
	i := c.CachedInfo()
	strip := func(s jetstream.SequenceInfo) jetstream.SequenceInfo {
		return jetstream.SequenceInfo{Consumer: s.Consumer, Stream: s.Stream}
	}
	return consumerSnap{Delivered: strip(i.Delivered), AckFloor: strip(i.AckFloor), AckPending: i.NumAckPending,
		Redelivered: i.NumRedelivered, Pending: i.NumPending}
}

// forgedAcks plays the same acks on jetgres and on JetStream: acks a client was never sent,
// built by editing the reply subject of a message it did get, for another consumer, another
// stream, sequences never delivered, and nonsense. An ack subject is a capability, so
// nats-server acts on a forged one that names a real delivery; jetgres must do the same,
// and no more.
func forgedAcks(t *testing.T, ctx context.Context, js jetstream.JetStream) (map[string]consumerSnap, []uint64) {
	t.Helper()
	nc := js.Conn()
	for _, name := range []string{"F", "G"} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}}); err != nil {
			t.Fatal(err)
		}
		// x and y alternate, so that a consumer filtered on x skips every other sequence.
		for i := range 6 {
			if _, err := js.Publish(ctx, strings.ToLower(name)+"."+[]string{"x", "y"}[i%2], nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	consumers := []struct {
		stream, name string
		ack          jetstream.AckPolicy
		filter       string
	}{
		{"F", "A", jetstream.AckExplicitPolicy, ""}, {"F", "B", jetstream.AckExplicitPolicy, ""},
		{"F", "AA", jetstream.AckAllPolicy, "f.x"}, {"G", "A", jetstream.AckExplicitPolicy, ""},
	}
	replies := map[string][]string{} // stream/consumer: reply subjects of the first three deliveries
	for _, c := range consumers {
		cons, err := js.CreateOrUpdateConsumer(ctx, c.stream, jetstream.ConsumerConfig{Durable: c.name, AckPolicy: c.ack, AckWait: time.Minute, FilterSubject: c.filter})
		if err != nil {
			t.Fatal(err)
		}
		b, err := cons.Fetch(3, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			replies[c.stream+"/"+c.name] = append(replies[c.stream+"/"+c.name], m.Reply())
		}
		if n := len(replies[c.stream+"/"+c.name]); n != 3 {
			t.Fatalf("%s > %s: fetched %d, want 3", c.stream, c.name, n)
		}
	}
	// $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>
	forge := func(reply string, edit map[int]string) string {
		tok := strings.Split(reply, ".")
		for i, v := range edit {
			tok[i] = v
		}
		return strings.Join(tok, ".")
	}
	send := func(subject, body string) {
		t.Helper()
		if err := nc.Publish(subject, []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	a := replies["F/A"]
	// Sequence 2 acked through a subject built from A's delivery but naming B: the
	// delivery exists, so the ack counts.
	if _, err := nc.Request(forge(a[1], map[int]string{3: "B"}), []byte("+ACK"), 5*time.Second); err != nil {
		t.Fatalf("forged ack with a reply: %v", err)
	}
	send(forge(a[0], map[int]string{3: "B", 5: "5", 6: "5"}), "+ACK")            // B never got 5
	send(forge(a[0], map[int]string{3: "B", 5: "99", 6: "99"}), "+ACK")          // past the stream
	send(forge(a[0], map[int]string{3: "Z"}), "+ACK")                            // no such consumer
	send(forge(a[0], map[int]string{2: "NOPE"}), "+ACK")                         // no such stream
	send(forge(a[0], map[int]string{2: "G"}), "-NAK {bad json")                  // G's A: a nak of 1
	send(forge(a[2], map[int]string{3: "B"}), "-NAK soon")                       // an unreadable delay: a plain nak of 3 for B
	send(forge(a[1], map[int]string{2: "G"}), "-NAK -5s")                        // a negative delay for G's A
	send(forge(a[0], map[int]string{5: "18446744073709551615"}), "+TERM reason") // huge sequence
	send(forge(a[0], map[int]string{6: "0"}), "-NAK")                            // consumer sequence 0
	send(forge(a[0], nil)+".extra.tokens", "+ACK")                               // neither layout
	send(forge(a[0], map[int]string{4: "x"}), "+ACK")                            // not a number
	send(a[0], "+ACK")                                                           // A acks 1 ...
	send(a[0], "+ACK")                                                           // ... twice
	send(a[0], "+ACK")                                                           // ... three times
	// AA (filtered on f.x) got 1, 3 and 5; 4 was never for it. An AckAll of 4 with a made-up
	// consumer sequence acks 1 and 3.
	send(forge(replies["F/AA"][1], map[int]string{5: "4", 6: "1000"}), "+ACK")
	// JetStream works through a consumer's acks on a queue of its own, after the publishes
	// return. A progress request on a delivery still pending is answered once the acks
	// before it on that queue are done, so the states compared below are settled ones.
	for _, barrier := range []string{
		forge(a[0], map[int]string{3: "B"}), a[2], replies["F/AA"][2], forge(a[2], map[int]string{2: "G"}),
	} {
		if _, err := nc.Request(barrier, []byte("+WPI"), 5*time.Second); err != nil {
			t.Fatalf("progress on %s: %v", barrier, err)
		}
	}
	// B's next fetch redelivers 3, nak'ed above, then continues with 4.
	b, err := js.Consumer(ctx, "F", "B")
	if err != nil {
		t.Fatal(err)
	}
	var next []uint64
	batch, err := b.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		next = append(next, md.Sequence.Stream)
	}
	snaps := map[string]consumerSnap{}
	for _, c := range consumers {
		snaps[c.stream+"/"+c.name] = snapConsumer(t, ctx, js, c.stream, c.name)
	}
	return snaps, next
}

func TestForgedAcks(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	probe := newProber(t, ctx, tb)
	ref := startJetStream(t)
	want, wantNext := forgedAcks(t, ctx, ref)
	got, gotNext := forgedAcks(t, ctx, tb.js)
	if !slices.Equal(gotNext, wantNext) {
		t.Errorf("B fetched %v after the forged acks, JetStream %v", gotNext, wantNext)
	}
	for k, w := range want {
		g := got[k]
		if k == "F/AA" {
			// nats-server takes the made-up consumer sequence for its floor (processAckMsg),
			// above the delivery of 5 still pending, and then reports a floor of 0 for a
			// moment. jetgres puts the floor at 4, below that delivery: its ack must count.
			w.AckFloor = jetstream.SequenceInfo{Consumer: 2, Stream: 4}
		}
		if g != w {
			t.Errorf("%s after forged acks:\n jetgres   %+v\n JetStream %+v", k, g, w)
		}
		if g.AckFloor.Stream > g.Delivered.Stream || g.AckFloor.Consumer > g.Delivered.Consumer {
			t.Errorf("%s: ack floor %+v above delivered %+v", k, g.AckFloor, g.Delivered)
		}
	}
	// The delivery of 5 to AA, consumer sequence 3, is still acked by its own subject.
	aa, err := tb.js.Consumer(ctx, "F", "AA")
	if err != nil {
		t.Fatal(err)
	}
	b, err := aa.FetchNoWait(1)
	if err != nil {
		t.Fatal(err)
	}
	for m := range b.Messages() {
		t.Fatalf("AA redelivered %s after the forged AckAll", m.Reply())
	}
	if _, err := tb.nc.Request("$JS.ACK.F.AA.1.5.3.0.0", []byte("+ACK"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, func() error {
		// The floor stops at the last message AA took, 5, which JetStream reports as
		// delivered too: 6 was never for AA. (JetStream's own floor stays where the forged
		// AckAll left it.)
		if s := snapConsumer(t, ctx, tb.js, "F", "AA"); s.AckFloor != (jetstream.SequenceInfo{Consumer: 3, Stream: 5}) || s.AckPending != 0 {
			return fmt.Errorf("AA after acking 5: %+v", s)
		}
		return nil
	})
	probe.check("forged acks")
}

// TestRepeatedCreateAfterRestart repeats a create with empty lists in it once the consumer
// has been read back from PostgreSQL, where empty lists are stored as nothing: the repeat
// must still be the same configuration, not "consumer already exists".
func TestRepeatedCreateAfterRestart(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	newStream(t, ctx, tb, "R", "r.>")
	body := `{"stream_name":"R","action":"create","config":{"durable_name":"C","ack_policy":"explicit","backoff":[],"filter_subjects":[],"metadata":{}}}`
	wantAPIOK(t, tb.nc, "$JS.API.CONSUMER.CREATE.R.C", body)
	wantAPIOK(t, tb.nc, "$JS.API.CONSUMER.CREATE.R.C", body)
	tb.stop(t)
	tb = setup(t, setupOpts{db: tb.db})
	testwait.For(t, 5*time.Second, func() error {
		if r, raw := apiRequest(t, tb.nc, "$JS.API.CONSUMER.CREATE.R.C", []byte(body)); r.Error != nil {
			return fmt.Errorf("repeated create after a restart: %s", raw)
		}
		return nil
	})
}
