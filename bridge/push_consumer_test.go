package bridge

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// legacyJS is nats.go's JetStreamContext on the bundle's connection: js.Subscribe and its
// kin make push consumers.
func legacyJS(t *testing.T, nc *nats.Conn) nats.JetStreamContext {
	t.Helper()
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// nextMsgs reads n messages from a synchronous subscription, failing after within.
func nextMsgs(t *testing.T, sub *nats.Subscription, n int, within time.Duration) []*nats.Msg {
	t.Helper()
	out := make([]*nats.Msg, 0, n)
	deadline := time.Now().Add(within)
	for len(out) < n {
		m, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			t.Fatalf("after %d of %d messages: %v", len(out), n, err)
		}
		out = append(out, m)
	}
	return out
}

func TestPushSubscribeSync(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	newStream(t, ctx, tb, "PS", "ps.>")
	publishN(t, ctx, tb.js, "ps.a", 5)
	js := legacyJS(t, tb.nc)
	sub, err := js.SubscribeSync("ps.>", nats.Durable("D"), nats.AckExplicit())
	if err != nil {
		t.Fatal(err)
	}
	msgs := nextMsgs(t, sub, 5, 5*time.Second)
	for i, m := range msgs {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if string(m.Data) != fmt.Sprint(i+1) || m.Subject != "ps.a" || md.NumPending != uint64(4-i) || md.Sequence.Stream != uint64(i+1) {
			t.Fatalf("message %d: %q %q %+v", i, m.Subject, m.Data, md)
		}
		if err := m.AckSync(); err != nil {
			t.Fatal(err)
		}
	}
	publishN(t, ctx, tb.js, "ps.b", 3)
	nextMsgs(t, sub, 3, 5*time.Second)
}

func TestPushOrderedConsumer(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	newStream(t, ctx, tb, "ORD", "ord.>")
	publishN(t, ctx, tb.js, "ord.x", 50)
	js := legacyJS(t, tb.nc)
	sub, err := js.SubscribeSync("ord.>", nats.OrderedConsumer())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	publishN(t, ctx, tb.js, "ord.y", 50)
	for i, m := range nextMsgs(t, sub, 100, 10*time.Second) {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if md.Sequence.Stream != uint64(i+1) {
			t.Fatalf("message %d has stream sequence %d", i, md.Sequence.Stream)
		}
	}
	ci, err := sub.ConsumerInfo()
	if err != nil {
		t.Fatal(err)
	}
	cfg := ci.Config
	if cfg.AckPolicy != nats.AckNonePolicy || cfg.MaxDeliver != 1 || !cfg.FlowControl || cfg.Heartbeat == 0 || !cfg.MemoryStorage || cfg.Durable != "" {
		t.Fatalf("ordered consumer config %+v", cfg)
	}
}

func TestPushKeyValue(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	kv, err := tb.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "CFG", History: 5})
	if err != nil {
		t.Fatal(err)
	}
	for i, kvp := range [][2]string{{"a", "1"}, {"b", "1"}, {"a", "2"}, {"c", "1"}, {"a", "3"}} {
		if _, err := kv.PutString(ctx, kvp[0], kvp[1]); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	if err := kv.Delete(ctx, "c"); err != nil {
		t.Fatal(err)
	}

	keys, err := kv.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"a", "b"}) {
		t.Fatalf("keys %v", keys)
	}
	hist, err := kv.History(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	var vals []string
	for _, e := range hist {
		vals = append(vals, string(e.Value()))
	}
	if !slices.Equal(vals, []string{"1", "2", "3"}) {
		t.Fatalf("history of a: %v", vals)
	}

	w, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	next := func() jetstream.KeyValueEntry {
		t.Helper()
		select {
		case e := <-w.Updates():
			return e
		case <-time.After(10 * time.Second):
			t.Fatal("no update from the watcher")
			return nil
		}
	}
	var initial []string
	for {
		e := next()
		if e == nil {
			break // the initial values are done
		}
		initial = append(initial, e.Key()+"="+string(e.Value())+"/"+e.Operation().String())
	}
	if !slices.Equal(initial, []string{"b=1/KeyValuePutOp", "a=3/KeyValuePutOp", "c=/KeyValueDeleteOp"}) {
		t.Fatalf("initial values %v", initial)
	}
	if _, err := kv.PutString(ctx, "b", "2"); err != nil {
		t.Fatal(err)
	}
	if e := next(); e == nil || e.Key() != "b" || string(e.Value()) != "2" {
		t.Fatalf("live update %v", e)
	}

	// A watcher of one key on an empty history says so at once.
	w2, err := kv.Watch(ctx, "nothing.here")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w2.Stop() }()
	select {
	case e := <-w2.Updates():
		if e != nil {
			t.Fatalf("watch of an absent key got %v", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no nil marker for an absent key")
	}
}

func TestPushObjectStore(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	obs, err := tb.js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "FILES"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{"one": {7}, "big": bytes.Repeat([]byte("0123456789abcdef"), 128<<10/16+3)}
	for name, data := range want {
		if _, err := obs.PutBytes(ctx, name, data); err != nil {
			t.Fatalf("put %s: %v", name, err)
		}
	}
	for name, data := range want {
		got, err := obs.GetBytes(ctx, name)
		if err != nil {
			t.Fatalf("get %s: %v", name, err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("get %s: %d bytes, want %d", name, len(got), len(data))
		}
	}
	list, err := obs.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, info := range list {
		names = append(names, info.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"big", "one"}) {
		t.Fatalf("list %v", names)
	}
}

// newClockTwin is newTwin with jetgres on a fake clock; the reference keeps real time.
func newClockTwin(t *testing.T) (*twin, *fakeClock) {
	t.Helper()
	clock := newFakeClock()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = clock }})
	return &twin{t: t, ctx: testContext(t), tb: tb, js: [2]jetstream.JetStream{tb.js, startJetStream(t)}}, clock
}

// pushEvent is what a raw subscription to a deliver subject saw, with what differs between
// servers by design (timestamps, random ids) left out.
type pushEvent struct {
	kind    string // "msg", "fc", "hb"
	subject string
	ack     string // the ack reply without its timestamp token
	pending string
	hdr     string // a status message's headers, the stalled subject's random id left out
}

func (e pushEvent) String() string {
	return fmt.Sprintf("%s %s %s pending=%s %s", e.kind, e.subject, e.ack, e.pending, e.hdr)
}

// readPush turns a raw delivery into a pushEvent; fc is the last flow-control reply seen,
// which a stalled heartbeat must name.
func readPush(t *testing.T, m *nats.Msg, fc *string) pushEvent {
	t.Helper()
	switch {
	case m.Header.Get("Status") == "100" && m.Header.Get("Description") == "FlowControl Request":
		if !strings.HasPrefix(m.Reply, "$JS.FC.") || len(m.Data) != 0 {
			t.Fatalf("flow control request %+v", m)
		}
		*fc = m.Reply
		return pushEvent{kind: "fc", ack: m.Reply[:strings.LastIndexByte(m.Reply, '.')]}
	case m.Header.Get("Status") == "100":
		if m.Reply != "" || len(m.Data) != 0 {
			t.Fatalf("heartbeat %+v", m)
		}
		stalled := m.Header.Get("Nats-Consumer-Stalled")
		if stalled != "" && stalled != *fc {
			t.Fatalf("stalled on %q, the request owed is %q", stalled, *fc)
		}
		return pushEvent{kind: "hb", hdr: fmt.Sprintf("%s consumer=%s stream=%s stalled=%v", m.Header.Get("Description"),
			m.Header.Get("Nats-Last-Consumer"), m.Header.Get("Nats-Last-Stream"), stalled != "")}
	}
	tok := strings.Split(m.Reply, ".")
	if len(tok) != 9 || tok[0] != "$JS" || tok[1] != "ACK" {
		t.Fatalf("delivery with reply %q", m.Reply)
	}
	return pushEvent{kind: "msg", subject: m.Subject, ack: strings.Join(tok[:7], "."), pending: tok[8]}
}

// TestPushFlowControlTwin compares, on a raw subscription, everything a flow-controlled
// push consumer with heartbeats sends: deliveries and their ack replies (pending counts
// included), the flow-control request and where it comes, the stall while it is owed,
// the heartbeat naming it, and the rest after the answer.
func TestPushFlowControlTwin(t *testing.T) {
	t.Parallel()
	tw, clock := newClockTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "FC", Subjects: []string{"fc.>"}})
	const n, size = 30, 100 << 10
	tw.pubN("fc.x", n, size)
	const hb = time.Second
	var subs [2]*nats.Subscription
	var fc [2]string
	var got [2][]pushEvent
	for side, js := range tw.js {
		nc := js.Conn()
		sub, err := nc.SubscribeSync("deliver.fc")
		if err != nil {
			t.Fatal(err)
		}
		subs[side] = sub
		if _, err := legacyJS(t, nc).AddConsumer("FC", &nats.ConsumerConfig{Durable: "D", DeliverSubject: "deliver.fc",
			AckPolicy: nats.AckExplicitPolicy, FlowControl: true, Heartbeat: hb}); err != nil {
			t.Fatalf("%s: add consumer: %v", sideName[side], err)
		}
	}
	// Up to the stall: 21 messages of 100 KiB pass the 2 MiB first window, the request
	// goes out once 1 MiB is passed.
	for side, sub := range subs {
		for len(got[side]) < 22 {
			m, err := sub.NextMsg(10 * time.Second)
			if err != nil {
				t.Fatalf("%s after %v: %v", sideName[side], got[side], err)
			}
			if e := readPush(t, m, &fc[side]); e.kind != "hb" {
				got[side] = append(got[side], e)
			}
		}
	}
	// Stalled: nothing but heartbeats, which name the request owed.
	clock.Advance(hb)
	for side, sub := range subs {
		for {
			m, err := sub.NextMsg(5 * time.Second)
			if err != nil {
				t.Fatalf("%s: no heartbeat while stalled: %v", sideName[side], err)
			}
			e := readPush(t, m, &fc[side])
			if e.kind != "hb" {
				t.Fatalf("%s delivered %v while stalled", sideName[side], e)
			}
			if strings.HasSuffix(e.hdr, "stalled=true") {
				got[side] = append(got[side], e)
				break
			}
		}
	}
	for side, js := range tw.js {
		if err := js.Conn().Publish(fc[side], nil); err != nil {
			t.Fatal(err)
		}
	}
	for side, sub := range subs {
		for len(got[side]) < 23+n-21 {
			m, err := sub.NextMsg(10 * time.Second)
			if err != nil {
				t.Fatalf("%s: after the answer: %v", sideName[side], err)
			}
			if e := readPush(t, m, &fc[side]); e.kind != "hb" {
				got[side] = append(got[side], e)
			}
		}
	}
	if !slices.Equal(got[ours], got[theirs]) {
		t.Fatalf("jetgres sent\n%v\njetstream sent\n%v", got[ours], got[theirs])
	}
	if got[ours][11].kind != "fc" {
		t.Fatalf("flow control request not after the 11th message: %v", got[ours])
	}
}
