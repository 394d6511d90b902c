package e2e

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/jetgres/jetgres/internal/jstwin"
	"github.com/jetgres/jetgres/internal/testwait"
)

// natsServer is one server a push consumer test drives through its client URL: jetgres, or
// a real nats-server with JetStream, whose answers are what jetgres's must be.
type natsServer struct {
	name string
	url  string
}

// startJetStream starts the reference: nats-server with JetStream on file storage.
func startJetStream(t *testing.T) natsServer {
	t.Helper()
	s, err := jstwin.Start(jstwin.Config{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return natsServer{name: "jetstream", url: s.ClientURL()}
}

// onBoth runs test side by side against a real JetStream and against jetgres, each on a
// server of its own, so that a test is known to be right before it judges jetgres.
func onBoth(t *testing.T, test func(t *testing.T, s natsServer)) {
	t.Run("jetstream", func(t *testing.T) {
		t.Parallel()
		test(t, startJetStream(t))
	})
	t.Run("jetgres", func(t *testing.T) {
		t.Parallel()
		j := startWithDatabase(t, testDatabase(t))
		test(t, natsServer{name: "jetgres", url: j.natsURL})
	})
}

// connectURL opens a plain nats.go connection, closed when the test ends.
func connectURL(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.MaxReconnects(0)}, opts...)...)
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// apiRequest sends a JetStream API request and decodes its answer into resp, when given.
func apiRequest(t testing.TB, nc *nats.Conn, subject, body string, resp any) {
	t.Helper()
	m, err := nc.Request(subject, []byte(body), 10*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", subject, err)
	}
	if resp != nil {
		if err := json.Unmarshal(m.Data, resp); err != nil {
			t.Fatalf("%s: answer %q: %v", subject, m.Data, err)
		}
	}
}

// orderedCreates are the consumer creates that clients send for an ordered push consumer,
// the shape key-value watch, history and key listing, object reads and every language's
// ordered subscribe are built on. In each, STREAM, FILTER, DELIVER and NAME stand for the
// stream, the filter subject, the client's deliver inbox and a name the client makes up.
//
// What the clients send:
//   - nats.go v1.55 (and natscli v0.5.0, which builds on nats.go v1.53.1) captured on the wire:
//     `nats kv watch`, `kv ls`, `kv compact` and jetstream KeyValue.Watch/Keys/ListKeys send
//     deliver_policy last_per_subject (ls and Keys add headers_only); `kv history`, `object
//     get` and ObjectStore.Get deliver_policy all; `object ls` and `object watch`
//     last_per_subject and all on the metadata subjects; the legacy js.Subscribe with
//     nats.OrderedConsumer() all. Every one: ack none, ack_wait 22 h, max_deliver 1,
//     replay instant, flow_control, idle_heartbeat 5 s, num_replicas 1, mem_storage, an
//     _INBOX deliver subject, on $JS.API.CONSUMER.CREATE.<stream>.<8 random chars>.<filter>
//     with no name in the body and no action. (`kv revert` reads with direct gets; `consumer
//     add --target X --deliver-group G` sends a durable with name, deliver_subject,
//     deliver_group, max_deliver -1, num_replicas 0, a zero pause_until and action "";
//     plain js.Subscribe sends ack explicit and num_replicas 0; `consumer sub` creates
//     nothing and subscribes to the deliver subject, in the deliver group if there is one.)
//     The jetstream package's OrderedConsumer is a pull consumer (name <nuid>_<n>,
//     inactive_threshold 5 min) and is not among these.
//   - nats.py (js.subscribe(ordered_consumer=True), which KeyValue.watch, keys and history
//     use, with inactive_threshold 5 min): the same fields, on the legacy unnamed
//     $JS.API.CONSUMER.CREATE.<stream>.
//   - nats.c (js_Subscribe with Ordered, kvStore_Watch): the same with ack_wait 24 h, on
//     the unnamed subject too.
//   - nats.java (ordered push subscribe, KeyValue watch): the same with a client-made name
//     in the body and on the subject, and action "create".
//   - nats.js (orderedConsumer(), the kv watch of its push-based releases): the same with a
//     name, action "".
//
// The Python, C, Java and JavaScript bodies are written from those clients' config builders
// (their sources), not captured; the field values are theirs.
var orderedCreates = []struct {
	client, subject, body string
	// lastPerSubject and headersOnly say what the body asks for, to know what to expect.
	lastPerSubject, headersOnly bool
}{
	{"nats.go kv watch", "$JS.API.CONSUMER.CREATE.STREAM.NAME.FILTER",
		`{"stream_name":"STREAM","config":{"deliver_policy":"last_per_subject","ack_policy":"none","ack_wait":79200000000000,"max_deliver":1,"filter_subject":"FILTER","replay_policy":"instant","flow_control":true,"idle_heartbeat":5000000000,"deliver_subject":"DELIVER","num_replicas":1,"mem_storage":true}}`,
		true, false},
	{"nats.go kv ls", "$JS.API.CONSUMER.CREATE.STREAM.NAME.FILTER",
		`{"stream_name":"STREAM","config":{"deliver_policy":"last_per_subject","ack_policy":"none","ack_wait":79200000000000,"max_deliver":1,"filter_subject":"FILTER","replay_policy":"instant","flow_control":true,"idle_heartbeat":5000000000,"headers_only":true,"deliver_subject":"DELIVER","num_replicas":1,"mem_storage":true}}`,
		true, true},
	{"nats.go kv history, object get, ordered subscribe", "$JS.API.CONSUMER.CREATE.STREAM.NAME.FILTER",
		`{"stream_name":"STREAM","config":{"deliver_policy":"all","ack_policy":"none","ack_wait":79200000000000,"max_deliver":1,"filter_subject":"FILTER","replay_policy":"instant","flow_control":true,"idle_heartbeat":5000000000,"deliver_subject":"DELIVER","num_replicas":1,"mem_storage":true}}`,
		false, false},
	{"nats.py kv watch", "$JS.API.CONSUMER.CREATE.STREAM",
		`{"stream_name":"STREAM","config":{"deliver_policy":"last_per_subject","ack_policy":"none","ack_wait":79200000000000,"max_deliver":1,"filter_subject":"FILTER","replay_policy":"instant","flow_control":true,"idle_heartbeat":5000000000,"inactive_threshold":300000000000,"deliver_subject":"DELIVER","num_replicas":1,"mem_storage":true}}`,
		true, false},
	{"nats.c ordered subscribe", "$JS.API.CONSUMER.CREATE.STREAM",
		`{"stream_name":"STREAM","config":{"deliver_subject":"DELIVER","deliver_policy":"all","ack_policy":"none","ack_wait":86400000000000,"max_deliver":1,"filter_subject":"FILTER","replay_policy":"instant","flow_control":true,"idle_heartbeat":5000000000,"num_replicas":1,"mem_storage":true}}`,
		false, false},
	{"nats.java kv watch", "$JS.API.CONSUMER.CREATE.STREAM.NAME.FILTER",
		`{"stream_name":"STREAM","config":{"name":"NAME","deliver_subject":"DELIVER","deliver_policy":"last_per_subject","ack_policy":"none","ack_wait":79200000000000,"max_deliver":1,"filter_subject":"FILTER","replay_policy":"instant","flow_control":true,"idle_heartbeat":5000000000,"num_replicas":1,"mem_storage":true},"action":"create"}`,
		true, false},
	{"nats.js ordered subscribe", "$JS.API.CONSUMER.CREATE.STREAM.NAME.FILTER",
		`{"stream_name":"STREAM","config":{"name":"NAME","deliver_subject":"DELIVER","deliver_policy":"all","ack_policy":"none","ack_wait":79200000000000,"max_deliver":1,"filter_subject":"FILTER","flow_control":true,"idle_heartbeat":5000000000,"mem_storage":true,"num_replicas":1},"action":""}`,
		false, false},
}

// pushedMsg is one message on a deliver subject, as a client's subscription hands it over.
type pushedMsg struct {
	at time.Time
	m  *nats.Msg
}

// inbox collects everything a deliver subject receives.
type inbox struct {
	mu  sync.Mutex
	all []pushedMsg
}

func (b *inbox) add(m *nats.Msg) {
	b.mu.Lock()
	b.all = append(b.all, pushedMsg{time.Now(), m})
	b.mu.Unlock()
}

// split returns the messages with data or a reply (stored messages) and the status
// messages (headers only, a Status header), in arrival order.
func (b *inbox) split() (msgs, statuses []*nats.Msg) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, d := range b.all {
		if d.m.Header.Get("Status") != "" && len(d.m.Data) == 0 {
			statuses = append(statuses, d.m)
		} else {
			msgs = append(msgs, d.m)
		}
	}
	return msgs, statuses
}

// TestPushWireOrderedConsumers sends each client's ordered consumer create as raw JSON and
// reads the answer and the deliveries the way those clients do: the config echoed back,
// the pending count on every ack reply (a key-value watcher's "initial values done" is the
// delivery whose pending is 0), idle heartbeats with the last consumer and stream
// sequences (an ordered consumer's gap check), a live update, and the delete.
func TestPushWireOrderedConsumers(t *testing.T) {
	t.Parallel()
	onBoth(t, func(t *testing.T, s natsServer) {
		nc := connectURL(t, s.url)
		for i := range orderedCreates {
			stream, filter := fmt.Sprintf("WIRE%d", i), fmt.Sprintf("wire%d.>", i)
			apiRequest(t, nc, "$JS.API.STREAM.CREATE."+stream, fmt.Sprintf(`{"name":%q,"subjects":[%q]}`, stream, filter), nil)
			for _, kv := range [][2]string{{"a", "a1"}, {"b", "b1"}, {"a", "a2"}} {
				if _, err := nc.Request(fmt.Sprintf("wire%d.%s", i, kv[0]), []byte(kv[1]), 10*time.Second); err != nil {
					t.Fatal(err)
				}
			}
		}
		for i, c := range orderedCreates {
			t.Run(c.client, func(t *testing.T) {
				t.Parallel()
				checkOrderedCreate(t, nc, i, c.client, c.subject, c.body, c.lastPerSubject, c.headersOnly)
			})
		}
	})
}

func checkOrderedCreate(t *testing.T, nc *nats.Conn, i int, client, subjectT, bodyT string, lastPerSubject, headersOnly bool) {
	stream, filter := fmt.Sprintf("WIRE%d", i), fmt.Sprintf("wire%d.>", i)
	deliver, name := nats.NewInbox(), fmt.Sprintf("ORD%d", i)
	fill := strings.NewReplacer("STREAM", stream, "FILTER", filter, "DELIVER", deliver, "NAME", name)
	got := &inbox{}
	sub, err := nc.Subscribe(deliver, got.add)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	var created server.JSApiConsumerCreateResponse
	apiRequest(t, nc, fill.Replace(subjectT), fill.Replace(bodyT), &created)
	if created.Error != nil {
		t.Errorf("%s: create refused: %+v", client, created.Error)
		return
	}
	ci := created.ConsumerInfo
	cfg := ci.Config
	// The fields every ordered consumer relies on, as the clients read them back.
	want := []string{"mem_storage", "flow_control", "ack none", "max_deliver 1", "heartbeat 5s", "deliver subject", "filter", "replicas"}
	have := []bool{cfg.MemoryStorage, cfg.FlowControl, cfg.AckPolicy == server.AckNone, cfg.MaxDeliver == 1,
		cfg.Heartbeat == 5*time.Second, cfg.DeliverSubject == deliver, cfg.FilterSubject == filter, cfg.Replicas == 1}
	for k := range want {
		if !have[k] {
			t.Errorf("%s: created consumer's config lacks %s: %+v", client, want[k], cfg)
		}
	}
	if cfg.HeadersOnly != headersOnly {
		t.Errorf("%s: headers_only %t, want %t", client, cfg.HeadersOnly, headersOnly)
	}
	if !ci.PushBound {
		t.Errorf("%s: push_bound false although the deliver subject has a subscriber", client)
	}
	if strings.Contains(bodyT, `"name"`) && ci.Name != name {
		t.Errorf("%s: consumer named %q, want the client's %q", client, ci.Name, name)
	}

	// The stream holds a1 (seq 1), b1 (2), a2 (3).
	type want1 struct {
		seq     uint64
		data    string
		pending uint64
	}
	initial := []want1{{1, "a1", 2}, {2, "b1", 1}, {3, "a2", 0}}
	if lastPerSubject {
		initial = []want1{{2, "b1", 1}, {3, "a2", 0}}
	}
	// The create answer reports the consumer as created, as nats-server's does, though
	// delivery may have begun before it was written: clients that count initial values from
	// num_pending alone (nats.js) rely on it.
	if ci.NumPending != uint64(len(initial)) || ci.Delivered.Consumer != 0 {
		t.Errorf("%s: num_pending %d and %d delivered at create, want %d and 0", client, ci.NumPending, ci.Delivered.Consumer, len(initial))
	}
	checkDelivered := func(ws []want1) {
		t.Helper()
		testwait.For(t, 10*time.Second, func() error {
			if msgs, _ := got.split(); len(msgs) < len(ws) {
				return fmt.Errorf("%s: %d of %d deliveries", client, len(msgs), len(ws))
			}
			return nil
		})
		msgs, _ := got.split()
		if len(msgs) != len(ws) {
			t.Fatalf("%s: %d deliveries, want %d", client, len(msgs), len(ws))
		}
		for k, w := range ws {
			m := msgs[k]
			md, err := m.Metadata()
			if err != nil {
				t.Fatalf("%s: delivery %d: reply %q: %v", client, k+1, m.Reply, err)
			}
			if md.Stream != stream || md.Consumer != ci.Name || md.Sequence.Stream != w.seq ||
				md.Sequence.Consumer != uint64(k+1) || md.NumDelivered != 1 || md.NumPending != w.pending {
				t.Errorf("%s: delivery %d: reply %q, want stream seq %d, consumer seq %d, pending %d", client, k+1, m.Reply, w.seq, k+1, w.pending)
			}
			data := w.data
			if headersOnly {
				data = ""
				if size := m.Header.Get("Nats-Msg-Size"); size != strconv.Itoa(len(w.data)) {
					t.Errorf("%s: delivery %d: Nats-Msg-Size %q, want %d", client, k+1, size, len(w.data))
				}
			}
			if string(m.Data) != data {
				t.Errorf("%s: delivery %d: data %q, want %q", client, k+1, m.Data, data)
			}
		}
	}
	checkDelivered(initial)

	// Idle now: a heartbeat within twice its interval, naming the last delivery.
	var hb *nats.Msg
	testwait.For(t, 12*time.Second, func() error {
		_, sts := got.split()
		for _, st := range sts {
			if st.Header.Get("Description") == "Idle Heartbeat" {
				hb = st
				return nil
			}
		}
		return fmt.Errorf("%s: no idle heartbeat among %d status messages", client, len(sts))
	})
	if hb.Header.Get("Status") != "100" || hb.Reply != "" ||
		hb.Header.Get("Nats-Last-Consumer") != strconv.Itoa(len(initial)) || hb.Header.Get("Nats-Last-Stream") != "3" ||
		hb.Header.Get("Nats-Consumer-Stalled") != "" {
		t.Errorf("%s: idle heartbeat %v reply %q, want status 100, Nats-Last-Consumer %d, Nats-Last-Stream 3, no reply",
			client, hb.Header, hb.Reply, len(initial))
	}

	// A live update arrives with pending 0.
	if _, err := nc.Request(fmt.Sprintf("wire%d.c", i), []byte("c1"), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	checkDelivered(append(initial, want1{4, "c1", 0}))

	var deleted server.JSApiConsumerDeleteResponse
	apiRequest(t, nc, fmt.Sprintf("$JS.API.CONSUMER.DELETE.%s.%s", stream, ci.Name), "", &deleted)
	if deleted.Error != nil || !deleted.Success {
		t.Errorf("%s: delete: %+v", client, deleted.Error)
	}
}

// TestPushFlowControl delivers more than the flow-control window to a subscriber that does
// not answer: delivery pauses with a bounded amount delivered, the idle heartbeats say the
// consumer is stalled on the unanswered request, and answering it (as nats.go does, to the
// Nats-Consumer-Stalled subject) resumes delivery, in order, to the end.
func TestPushFlowControl(t *testing.T) {
	t.Parallel()
	const (
		total = 64
		size  = 64 << 10
		// JetStream's first window is 2 MiB: it asks for flow control past half of it and
		// stops past all of it.
		window = 2 << 20
	)
	onBoth(t, func(t *testing.T, s natsServer) {
		nc := connectURL(t, s.url)
		apiRequest(t, nc, "$JS.API.STREAM.CREATE.FC", `{"name":"FC","subjects":["fc.>"]}`, nil)
		payload := make([]byte, size)
		for i := range total {
			copy(payload, strconv.Itoa(i))
			if _, err := nc.Request("fc.x", payload, 10*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		deliver := nats.NewInbox()
		got := &inbox{}
		sub, err := nc.Subscribe(deliver, got.add)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		if err := sub.SetPendingLimits(-1, -1); err != nil {
			t.Fatal(err)
		}
		c := orderedCreates[2]
		fill := strings.NewReplacer("STREAM", "FC", "FILTER", "fc.>", "DELIVER", deliver, "NAME", "FCORD")
		var created server.JSApiConsumerCreateResponse
		apiRequest(t, nc, fill.Replace(c.subject), fill.Replace(c.body), &created)
		if created.Error != nil {
			t.Fatalf("create: %+v", created.Error)
		}
		name := created.ConsumerInfo.Name

		// Unanswered: a flow-control request, then a stall that a heartbeat reports.
		var stalledOn string
		testwait.For(t, 15*time.Second, func() error {
			_, sts := got.split()
			for _, st := range sts {
				if st.Header.Get("Description") == "Idle Heartbeat" && st.Header.Get("Nats-Consumer-Stalled") != "" {
					stalledOn = st.Header.Get("Nats-Consumer-Stalled")
					return nil
				}
			}
			return fmt.Errorf("no heartbeat reports a stall among %d status messages", len(sts))
		})
		msgs, sts := got.split()
		var fcs []*nats.Msg
		for _, st := range sts {
			if st.Header.Get("Description") == "FlowControl Request" {
				fcs = append(fcs, st)
			}
		}
		if len(fcs) != 1 {
			t.Fatalf("%d flow-control requests before the stall, want 1", len(fcs))
		}
		fc := fcs[0]
		if fc.Header.Get("Status") != "100" || !strings.HasPrefix(fc.Reply, "$JS.FC.") ||
			!strings.Contains(fc.Reply, ".FC."+name+".") || fc.Reply != stalledOn {
			t.Errorf("flow-control request %v reply %q (stalled on %q), want status 100 and a $JS.FC.FC.%s.<id> reply", fc.Header, fc.Reply, stalledOn, name)
		}
		delivered := 0
		for _, m := range msgs {
			delivered += len(m.Data)
		}
		if len(msgs) >= total || delivered > window+size {
			t.Fatalf("without a flow-control answer %d of %d messages (%d bytes) were delivered, want delivery to pause within %d bytes",
				len(msgs), total, delivered, window)
		}
		t.Logf("%s paused after %d of %d messages (%d KiB) with flow control unanswered", s.name, len(msgs), total, delivered>>10)

		// Answered: every request from now on, as nats.go does.
		answered := map[string]bool{}
		answer := func(subject string) {
			if !answered[subject] {
				answered[subject] = true
				if err := nc.Publish(subject, nil); err != nil {
					t.Fatal(err)
				}
			}
		}
		answer(stalledOn)
		testwait.For(t, 30*time.Second, func() error {
			msgs, sts := got.split()
			for _, st := range sts {
				if st.Reply != "" {
					answer(st.Reply)
				}
				if v := st.Header.Get("Nats-Consumer-Stalled"); v != "" {
					answer(v)
				}
			}
			if len(msgs) < total {
				return fmt.Errorf("%d of %d messages after answering flow control", len(msgs), total)
			}
			return nil
		})
		msgs, _ = got.split()
		for k, m := range msgs {
			md, err := m.Metadata()
			if err != nil || md.Sequence.Stream != uint64(k+1) || md.NumPending != uint64(total-k-1) {
				t.Fatalf("delivery %d: reply %q (%v), want stream seq %d pending %d", k+1, m.Reply, err, k+1, total-k-1)
			}
			if !strings.HasPrefix(string(m.Data), strconv.Itoa(k)) {
				t.Fatalf("delivery %d carries message %.8q", k+1, m.Data)
			}
		}
	})
}

// TestPushBound follows push_bound in consumer info as the deliver subject gains and loses
// interest: only a plain subscription counts without a deliver group, only a queue
// subscription of that group with one.
func TestPushBound(t *testing.T) {
	t.Parallel()
	onBoth(t, func(t *testing.T, s natsServer) {
		nc := connectURL(t, s.url)
		apiRequest(t, nc, "$JS.API.STREAM.CREATE.BOUND", `{"name":"BOUND","subjects":["bound.>"]}`, nil)
		bound := func(name string) bool {
			t.Helper()
			var info server.JSApiConsumerInfoResponse
			apiRequest(t, nc, "$JS.API.CONSUMER.INFO.BOUND."+name, "", &info)
			if info.Error != nil {
				t.Fatalf("consumer info %s: %+v", name, info.Error)
			}
			return info.PushBound
		}
		waitBound := func(name string, want bool) {
			t.Helper()
			testwait.For(t, 10*time.Second, func() error {
				if got := bound(name); got != want {
					return fmt.Errorf("%s: push_bound %t, want %t", name, got, want)
				}
				return nil
			})
		}
		for _, group := range []string{"", "workers"} {
			name := "PLAIN"
			if group != "" {
				name = "GROUP"
			}
			var created server.JSApiConsumerCreateResponse
			apiRequest(t, nc, "$JS.API.CONSUMER.CREATE.BOUND."+name, fmt.Sprintf(
				`{"stream_name":"BOUND","config":{"durable_name":%q,"deliver_subject":"dlv.bound.%s","deliver_group":%q,"ack_policy":"explicit"}}`,
				name, name, group), &created)
			if created.Error != nil {
				t.Fatalf("create %s: %+v", name, created.Error)
			}
			if created.PushBound {
				t.Errorf("%s: push_bound at create with no subscriber", name)
			}
			plain, err := nc.SubscribeSync("dlv.bound." + name)
			if err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			waitBound(name, group == "")
			if err := plain.Unsubscribe(); err != nil {
				t.Fatal(err)
			}
			waitBound(name, false)
			if group != "" {
				q, err := nc.QueueSubscribeSync("dlv.bound."+name, group)
				if err != nil {
					t.Fatal(err)
				}
				waitBound(name, true)
				if err := q.Unsubscribe(); err != nil {
					t.Fatal(err)
				}
				waitBound(name, false)
			}
		}
	})
}
