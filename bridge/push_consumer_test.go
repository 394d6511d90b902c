package bridge

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/internal/testwait"
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
func newClockTwin(t *testing.T) (*twin, *clocktest.Fake) {
	t.Helper()
	clock := clocktest.New()
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
	reg := tw.tb.reg
	if d, r, st, h := counterValue(t, reg, "jetgres_push_delivered_total"), counterValue(t, reg, "jetgres_push_flow_control_requests_total"),
		counterValue(t, reg, "jetgres_push_flow_control_stalls_total"), counterValue(t, reg, "jetgres_push_heartbeats_total"); d != n || r != 1 || st != 1 || h < 1 {
		t.Fatalf("metrics: %v delivered, %v flow-control requests, %v stalls, %v heartbeats", d, r, st, h)
	}
}

// TestPushInterest runs on the fake clock: delivery only while the deliver subject has a
// subscriber, resumed where it stopped when one comes back; idle heartbeats while bound;
// and an ephemeral consumer deleted once it had no subscriber for its inactive threshold.
func TestPushInterest(t *testing.T) {
	t.Parallel()
	clock := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = clock }})
	ctx := testContext(t)
	newStream(t, ctx, tb, "IN", "in.>")
	js := legacyJS(t, tb.nc)
	sub, err := tb.nc.SubscribeSync("deliver.in")
	if err != nil {
		t.Fatal(err)
	}
	const hb = 2 * time.Second
	ci, err := js.AddConsumer("IN", &nats.ConsumerConfig{DeliverSubject: "deliver.in", AckPolicy: nats.AckNonePolicy, Heartbeat: hb})
	if err != nil {
		t.Fatal(err)
	}
	if ci.Config.InactiveThreshold != 5*time.Second {
		t.Fatalf("ephemeral inactive threshold %v, want nats-server's 5s", ci.Config.InactiveThreshold)
	}
	seqs := func(msgs []*nats.Msg) []uint64 {
		var out []uint64
		for _, m := range msgs {
			md, err := m.Metadata()
			if err != nil {
				t.Fatalf("not a delivery: %+v", m)
			}
			out = append(out, md.Sequence.Stream)
		}
		return out
	}
	publishN(t, ctx, tb.js, "in.a", 3)
	if got := seqs(nextMsgs(t, sub, 3, 5*time.Second)); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("bound: got %v", got)
	}
	clock.Advance(hb)
	m := nextMsgs(t, sub, 1, 5*time.Second)[0]
	if m.Header.Get("Status") != "100" || m.Header.Get("Nats-Last-Consumer") != "3" || m.Header.Get("Nats-Last-Stream") != "3" {
		t.Fatalf("heartbeat %+v", m.Header)
	}

	if err := sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := tb.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	publishN(t, ctx, tb.js, "in.a", 2)
	clock.Advance(4 * time.Second) // short of the threshold
	if _, err := js.ConsumerInfo("IN", ci.Name); err != nil {
		t.Fatalf("deleted before its inactive threshold: %v", err)
	}
	sub, err = tb.nc.SubscribeSync("deliver.in")
	if err != nil {
		t.Fatal(err)
	}
	if got := seqs(nextMsgs(t, sub, 2, 5*time.Second)); !slices.Equal(got, []uint64{4, 5}) {
		t.Fatalf("bound again: got %v", got)
	}
	clock.Advance(4 * time.Second) // bound all along: no threshold runs
	if _, err := js.ConsumerInfo("IN", ci.Name); err != nil {
		t.Fatalf("deleted while bound: %v", err)
	}

	if err := sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := tb.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, func() error {
		clock.Advance(time.Second)
		if _, err := js.ConsumerInfo("IN", ci.Name); !errors.Is(err, nats.ErrConsumerNotFound) {
			return fmt.Errorf("consumer info: %v", err)
		}
		return nil
	})
}

// TestPushQueueSubscribe: three members of a deliver group share the messages, each message
// going to exactly one of them.
func TestPushQueueSubscribe(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	newStream(t, ctx, tb, "Q", "q.>")
	js := legacyJS(t, tb.nc)
	const n = 300
	var mu sync.Mutex
	got := make([]map[uint64]bool, 3)
	for i := range got {
		got[i] = map[uint64]bool{}
		if _, err := js.QueueSubscribe("q.>", "workers", func(m *nats.Msg) {
			md, err := m.Metadata()
			if err != nil {
				return
			}
			mu.Lock()
			got[i][md.Sequence.Stream] = true
			mu.Unlock()
			_ = m.Ack()
		}, nats.Durable("workers"), nats.ManualAck()); err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
	publishN(t, ctx, tb.js, "q.job", n)
	testwait.For(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		seen := map[uint64]int{}
		for _, g := range got {
			for seq := range g {
				seen[seq]++
			}
		}
		if len(seen) != n {
			return fmt.Errorf("%d of %d messages delivered", len(seen), n)
		}
		for seq, k := range seen {
			if k != 1 {
				t.Fatalf("message %d went to %d members", seq, k)
			}
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	for i, g := range got {
		if len(g) == 0 {
			t.Fatalf("member %d got nothing: %d, %d, %d", i, len(got[0]), len(got[1]), len(got[2]))
		}
	}
	ci, err := js.ConsumerInfo("Q", "workers")
	if err != nil {
		t.Fatal(err)
	}
	if ci.Config.DeliverGroup != "workers" {
		t.Fatalf("deliver group %q", ci.Config.DeliverGroup)
	}
	testwait.For(t, 10*time.Second, func() error {
		ci, err := js.ConsumerInfo("Q", "workers")
		if err != nil || ci.AckFloor.Stream != n {
			return fmt.Errorf("ack floor %+v, %v", ci.AckFloor, err)
		}
		return nil
	})
}

// TestPushChanSubscribe: nats.go's channel subscription, with acks, and redelivery of what
// was not acked after ack_wait on the fake clock.
func TestPushChanSubscribe(t *testing.T) {
	t.Parallel()
	clock := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = clock }})
	ctx := testContext(t)
	newStream(t, ctx, tb, "CH", "ch.>")
	js := legacyJS(t, tb.nc)
	ch := make(chan *nats.Msg, 64)
	sub, err := js.ChanSubscribe("ch.>", ch, nats.Durable("C"), nats.ManualAck(), nats.AckWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	publishN(t, ctx, tb.js, "ch.x", 4)
	recv := func() *nats.Msg {
		t.Helper()
		select {
		case m := <-ch:
			return m
		case <-time.After(10 * time.Second):
			t.Fatal("nothing on the channel")
			return nil
		}
	}
	for i := range 4 {
		m := recv()
		md, _ := m.Metadata()
		if md.Sequence.Stream != uint64(i+1) || md.NumDelivered != 1 {
			t.Fatalf("message %d: %+v", i, md)
		}
		if i%2 == 0 {
			if err := m.AckSync(); err != nil {
				t.Fatal(err)
			}
		}
	}
	clock.Advance(10 * time.Second)
	for _, want := range []uint64{2, 4} {
		md, _ := recv().Metadata()
		if md.Sequence.Stream != want || md.NumDelivered != 2 {
			t.Fatalf("redelivery %+v, want stream sequence %d", md, want)
		}
	}
}

// TestPushResumesAfterRestart: a durable push consumer picks up after its persisted ack
// floor once the process serves it again and its subscriber is back: what was delivered and
// not acked comes again, what was acked does not.
func TestPushResumesAfterRestart(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	newStream(t, ctx, tb, "RP", "rp")
	publishN(t, ctx, tb.js, "rp", 10)
	sub, err := tb.nc.SubscribeSync("deliver.rp")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := legacyJS(t, tb.nc).AddConsumer("RP", &nats.ConsumerConfig{Durable: "D", DeliverSubject: "deliver.rp", AckPolicy: nats.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	for i, m := range nextMsgs(t, sub, 10, 5*time.Second) {
		if i < 4 {
			if err := m.AckSync(); err != nil {
				t.Fatal(err)
			}
		}
	}
	db := tb.db
	tb.stop(t)
	tb2 := setup(t, setupOpts{db: db})
	sub2, err := tb2.nc.SubscribeSync("deliver.rp")
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for _, m := range nextMsgs(t, sub2, 6, 10*time.Second) {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, md.Sequence.Stream)
	}
	if !slices.Equal(got, []uint64{5, 6, 7, 8, 9, 10}) {
		t.Fatalf("after restart got %v", got)
	}
}

// TestPushOrderedChurn creates and drops ordered consumers as clients do on every gap and
// reconnect, and checks that nothing stays behind: consumers served, their rows, the
// interest watcher's set and goroutines all come back down. It does not run in parallel,
// so that the goroutines counted are its own.
func TestPushOrderedChurn(t *testing.T) {
	clock := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = clock }})
	ctx := testContext(t)
	newStream(t, ctx, tb, "CHURN", "churn.>")
	publishN(t, ctx, tb.js, "churn.a", 3)
	js := legacyJS(t, tb.nc)
	id := mustStreamID(t, tb, "CHURN")
	s := tb.bridge.streams.Lookup("CHURN")
	settle := func(what string, want func() error) {
		t.Helper()
		testwait.For(t, 20*time.Second, func() error {
			clock.Advance(time.Second) // an undeleted ephemeral goes at its inactive threshold
			if err := want(); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			return nil
		})
	}
	empty := func() error {
		rows, err := tb.db.Consumers(ctx, id)
		if err != nil {
			return err
		}
		pushers := tb.bridge.cons.PushWatched()
		n := tb.bridge.cons.Served(s)
		if n != 0 || len(rows) != 0 || pushers != 0 {
			return fmt.Errorf("%d consumers served, %d rows, %d push consumers watched", n, len(rows), pushers)
		}
		return nil
	}
	// One round first, so that what starts once per process (pools, the tail) is counted.
	round := func() {
		sub, err := js.SubscribeSync("churn.>", nats.OrderedConsumer())
		if err != nil {
			t.Fatal(err)
		}
		nextMsgs(t, sub, 3, 10*time.Second)
		if err := sub.Unsubscribe(); err != nil {
			t.Fatal(err)
		}
	}
	round()
	settle("after one round", empty)
	base := runtime.NumGoroutine()
	const rounds = 300
	for range rounds {
		round()
	}
	settle(fmt.Sprintf("after %d rounds", rounds), empty)
	settle("goroutines", func() error {
		if n := runtime.NumGoroutine(); n > base+5 {
			return fmt.Errorf("%d goroutines, %d before", n, base)
		}
		return nil
	})
}

// TestPushPendingTwin compares the ack replies of push consumers with JetStream's, the
// pending count above all: a key-value watcher's last-per-subject start, a filtered
// consumer, and a headers-only one, with messages published while they deliver.
func TestPushPendingTwin(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "PT", Subjects: []string{"pt.>"}, MaxMsgsPerSubject: 10})
	for i, subj := range []string{"pt.a", "pt.b", "pt.a", "pt.c", "pt.a", "pt.b", "pt.d.x", "pt.a"} {
		tw.pub(subj, fmt.Appendf(nil, "v%d", i))
	}
	cases := []struct {
		name    string
		cfg     nats.ConsumerConfig
		initial int // messages for it when it starts: earlier cases published more
		more    int // messages published after
	}{
		{"lps", nats.ConsumerConfig{DeliverPolicy: nats.DeliverLastPerSubjectPolicy, FilterSubject: "pt.>", AckPolicy: nats.AckNonePolicy}, 4, 3},
		{"filtered", nats.ConsumerConfig{FilterSubjects: []string{"pt.a", "pt.d.>"}, AckPolicy: nats.AckExplicitPolicy}, 8, 3},
		{"headers", nats.ConsumerConfig{HeadersOnly: true, AckPolicy: nats.AckAllPolicy}, 14, 2},
	}
	for _, tc := range cases {
		var got [2][]pushEvent
		var subs [2]*nats.Subscription
		for side, js := range tw.js {
			nc := js.Conn()
			sub, err := nc.SubscribeSync("deliver.pt." + tc.name)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sub.Unsubscribe() }()
			subs[side] = sub
			cfg := tc.cfg
			cfg.Durable, cfg.DeliverSubject = tc.name, "deliver.pt."+tc.name
			if _, err := legacyJS(t, nc).AddConsumer("PT", &cfg); err != nil {
				t.Fatalf("%s: %s: %v", sideName[side], tc.name, err)
			}
		}
		for side, sub := range subs {
			var fc string
			for _, m := range nextMsgs(t, sub, tc.initial, 5*time.Second) {
				e := readPush(t, m, &fc)
				if tc.cfg.HeadersOnly {
					e.hdr = m.Header.Get("Nats-Msg-Size") + "/" + strconv.Itoa(len(m.Data))
				}
				got[side] = append(got[side], e)
			}
		}
		for i := range tc.more {
			tw.pub("pt.a", fmt.Appendf(nil, "more%d", i))
			for side, sub := range subs {
				var fc string
				got[side] = append(got[side], readPush(t, nextMsgs(t, sub, 1, 5*time.Second)[0], &fc))
			}
		}
		for side, sub := range subs {
			if m, err := sub.NextMsg(50 * time.Millisecond); err == nil {
				t.Fatalf("%s: %s: more than expected: %+v", sideName[side], tc.name, m)
			}
		}
		if !slices.Equal(got[ours], got[theirs]) {
			t.Fatalf("%s: jetgres sent\n%v\njetstream sent\n%v", tc.name, got[ours], got[theirs])
		}
	}
}

// TestPushRateLimit paces a consumer's deliveries on the fake clock: a burst, then one
// message's worth of time per message.
func TestPushRateLimit(t *testing.T) {
	t.Parallel()
	clock := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = clock }})
	ctx := testContext(t)
	newStream(t, ctx, tb, "RL", "rl")
	const size = 512 << 10 // two fill the 1 MiB burst
	for range 5 {
		if _, err := tb.js.Publish(ctx, "rl", make([]byte, size)); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := tb.nc.SubscribeSync("deliver.rl")
	if err != nil {
		t.Fatal(err)
	}
	// 8 Mbit/s: a message of half a MiB takes half a second.
	if _, err := legacyJS(t, tb.nc).AddConsumer("RL", &nats.ConsumerConfig{Durable: "D", DeliverSubject: "deliver.rl", AckPolicy: nats.AckNonePolicy, RateLimit: 8 << 20}); err != nil {
		t.Fatal(err)
	}
	nextMsgs(t, sub, 2, 5*time.Second) // the burst
	for i := 3; i <= 5; i++ {
		if m, err := sub.NextMsg(100 * time.Millisecond); err == nil {
			t.Fatalf("message %d before its time: %v", i, m.Reply)
		}
		clock.Advance(time.Second / 2)
		nextMsgs(t, sub, 1, 5*time.Second)
	}
}
