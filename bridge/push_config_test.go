package bridge

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// The tests in this file create push consumers on jetgres and on a real JetStream side by
// side (the twin of retention_test.go) and compare what clients see: the configuration
// echoed back with its defaults, the errors of invalid shapes and updates, the listings,
// and push_bound as subscribers come and go.

const pushStream = "PUSHC"

func newPushTwin(t *testing.T) *twin {
	t.Helper()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: pushStream, Subjects: []string{"pushc.>"}})
	return tw
}

// request sends body to the API subject on both sides and decodes both answers.
func (tw *twin) request(subject, body string) [2]server.JSApiConsumerCreateResponse {
	tw.t.Helper()
	var out [2]server.JSApiConsumerCreateResponse
	for side, js := range tw.js {
		m, err := js.Conn().Request(subject, []byte(body), 5*time.Second)
		if err != nil {
			tw.t.Fatalf("%s: %s: %v", sideName[side], subject, err)
		}
		if err := json.Unmarshal(m.Data, &out[side]); err != nil {
			tw.t.Fatalf("%s: %s: answer %s: %v", sideName[side], subject, m.Data, err)
		}
	}
	return out
}

// comparable is a consumer configuration as JSON, without what differs by design: the
// metadata nats-server stamps ("_nats." keys) and, for ephemerals named by the server,
// the random name.
func comparable(t testing.TB, cfg any, randomName bool) string {
	t.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var c server.ConsumerConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	maps.DeleteFunc(c.Metadata, func(k, _ string) bool { return strings.HasPrefix(k, "_nats.") })
	if len(c.Metadata) == 0 {
		c.Metadata = nil
	}
	if randomName {
		c.Name = ""
	}
	raw, err = json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// sameAnswer fails t unless both sides gave the same error (status, err_code and
// description) or both accepted with the same configuration; it returns the error.
func (tw *twin) sameAnswer(what string, got [2]server.JSApiConsumerCreateResponse, randomName bool) *server.ApiError {
	tw.t.Helper()
	o, j := got[ours], got[theirs]
	switch {
	case o.Error != nil || j.Error != nil:
		if o.Error == nil || j.Error == nil || *o.Error != *j.Error {
			tw.t.Errorf("%s: jetgres %+v, jetstream %+v", what, o.Error, j.Error)
		}
		return j.Error
	case o.ConsumerInfo == nil || j.ConsumerInfo == nil:
		tw.t.Errorf("%s: no consumer info: jetgres %+v, jetstream %+v", what, o.ConsumerInfo, j.ConsumerInfo)
	default:
		if a, b := comparable(tw.t, o.Config, randomName), comparable(tw.t, j.Config, randomName); a != b {
			tw.t.Errorf("%s: configs differ\njetgres   %s\njetstream %s", what, a, b)
		}
		if o.PushBound != j.PushBound {
			tw.t.Errorf("%s: push_bound: jetgres %t, jetstream %t", what, o.PushBound, j.PushBound)
		}
	}
	return nil
}

func TestPushConfigTwin(t *testing.T) {
	t.Parallel()
	tw := newPushTwin(t)
	create := func(name string) string { return "$JS.API.CONSUMER.CREATE." + pushStream + "." + name }
	body := func(cfg string) string { return `{"stream_name":"` + pushStream + `","config":` + cfg + `}` }

	accepted := []struct{ what, subject, cfg string }{
		{"durable through DURABLE.CREATE", "$JS.API.CONSUMER.DURABLE.CREATE." + pushStream + ".D1",
			`{"durable_name":"D1","deliver_subject":"dlv.d1"}`},
		{"every push option", create("D2"),
			`{"durable_name":"D2","deliver_subject":"dlv.d2","deliver_group":"grp","ack_policy":"explicit","flow_control":true,"idle_heartbeat":5000000000,"rate_limit_bps":8192,"headers_only":true,"max_ack_pending":50,"ack_wait":10000000000,"max_deliver":5,"backoff":[1000000000,2000000000],"filter_subject":"pushc.a"}`},
		{"ordered named", create("O2"),
			`{"name":"O2","deliver_subject":"_INBOX.ord2","ack_policy":"none","max_deliver":1,"flow_control":true,"idle_heartbeat":5000000000,"mem_storage":true,"num_replicas":1,"deliver_policy":"last_per_subject","filter_subject":"pushc.kv.>","headers_only":true}`},
		{"ack none", create("N1"), `{"name":"N1","deliver_subject":"dlv.n1","ack_policy":"none"}`},
		{"ack all from new", create("A1"), `{"name":"A1","deliver_subject":"dlv.a1","ack_policy":"all","deliver_policy":"new"}`},
		{"max_request_* on push", create("R1"), `{"name":"R1","deliver_subject":"dlv.r1","max_batch":10,"max_expires":1000000000,"max_bytes":1024}`},
		{"deliver_group on pull", create("G1"), `{"name":"G1","deliver_group":"grp"}`},
		{"negative heartbeat on pull", create("H0"), `{"name":"H0","idle_heartbeat":-1}`},
		{"negative max_waiting on push", create("W0"), `{"name":"W0","deliver_subject":"dlv.w0","max_waiting":-3}`},
		{"paused push", create("P1"), `{"name":"P1","deliver_subject":"dlv.p1","pause_until":"2099-01-01T00:00:00Z"}`},
		{"a deliver subject another consumer uses", create("S2"), `{"name":"S2","deliver_subject":"dlv.d1"}`},
	}
	for _, c := range accepted {
		if e := tw.sameAnswer(c.what, tw.request(c.subject, body(c.cfg)), false); e != nil {
			t.Errorf("%s: refused: %v", c.what, e)
		}
	}

	// Ordered consumers as the clients of every language make them: ephemeral, named by
	// the server.
	ordered := `{"deliver_subject":"_INBOX.ord1","ack_policy":"none","max_deliver":1,"flow_control":true,"idle_heartbeat":5000000000,"mem_storage":true,"num_replicas":1,"inactive_threshold":300000000000,"deliver_policy":"by_start_sequence","opt_start_seq":1}`
	if e := tw.sameAnswer("ordered ephemeral", tw.request("$JS.API.CONSUMER.CREATE."+pushStream, body(ordered)), true); e != nil {
		t.Errorf("ordered ephemeral: refused: %v", e)
	}

	refused := []struct{ what, cfg string }{
		{"flow control without heartbeat", `{"name":"X","deliver_subject":"dlv.x","flow_control":true}`},
		{"max_waiting on push", `{"name":"X","deliver_subject":"dlv.x","max_waiting":10}`},
		{"deliver subject with *", `{"name":"X","deliver_subject":"dlv.*"}`},
		{"deliver subject with >", `{"name":"X","deliver_subject":"dlv.>"}`},
		{"deliver subject not valid", `{"name":"X","deliver_subject":"dlv..x"}`},
		{"deliver to acks", `{"name":"X","deliver_subject":"$JS.ACK.x"}`},
		{"deliver to flow control", `{"name":"X","deliver_subject":"$JS.FC.x"}`},
		{"deliver to the API", `{"name":"X","deliver_subject":"$JS.API.x"}`},
		{"deliver to a domain's API", `{"name":"X","deliver_subject":"$JS.hub.API.x"}`},
		{"deliver to a service reply", `{"name":"X","deliver_subject":"_R_.x"}`},
		{"deliver subject in the stream", `{"name":"X","deliver_subject":"pushc.out"}`},
		{"rate limit on pull", `{"name":"X","rate_limit_bps":100}`},
		{"heartbeat on pull", `{"name":"X","idle_heartbeat":1000000000}`},
		{"flow control on pull", `{"name":"X","flow_control":true}`},
		{"flow control and heartbeat on pull", `{"name":"X","flow_control":true,"idle_heartbeat":1000000000}`},
		{"heartbeat under 100ms", `{"name":"X","deliver_subject":"dlv.x","idle_heartbeat":50000000}`},
		{"ack none with max_ack_pending", `{"name":"X","deliver_subject":"dlv.x","ack_policy":"none","max_ack_pending":10}`},
		{"flow_control ack policy on pull", `{"name":"X","ack_policy":"flow_control"}`},
		{"flow_control ack policy with max_deliver", `{"name":"X","deliver_subject":"dlv.x","ack_policy":"flow_control","max_deliver":3}`},
		{"flow_control ack policy with ack_wait", `{"name":"X","deliver_subject":"dlv.x","ack_policy":"flow_control","ack_wait":1000000000}`},
		{"flow_control ack policy with backoff", `{"name":"X","deliver_subject":"dlv.x","ack_policy":"flow_control","backoff":[1000000000]}`},
		{"flow_control ack policy without max_ack_pending", `{"name":"X","deliver_subject":"dlv.x","ack_policy":"flow_control","max_ack_pending":-1}`},
	}
	for _, c := range refused {
		if e := tw.sameAnswer(c.what, tw.request(create("X"), body(c.cfg)), false); e == nil {
			t.Errorf("%s: accepted", c.what)
		}
	}
}

func TestPushUpdateTwin(t *testing.T) {
	t.Parallel()
	tw := newPushTwin(t)
	send := func(what, cfg string) *server.ApiError {
		t.Helper()
		name := strings.Split(strings.Split(cfg, `"durable_name":"`)[1], `"`)[0]
		return tw.sameAnswer(what, tw.request("$JS.API.CONSUMER.CREATE."+pushStream+"."+name,
			`{"stream_name":"`+pushStream+`","config":`+cfg+`}`), false)
	}
	for _, cfg := range []string{
		`{"durable_name":"PULL"}`,
		`{"durable_name":"PUSH","deliver_subject":"upd.1","ack_policy":"explicit"}`,
		`{"durable_name":"HB","deliver_subject":"upd.hb","idle_heartbeat":5000000000}`,
	} {
		if e := send("create "+cfg, cfg); e != nil {
			t.Fatalf("create %s: %v", cfg, e)
		}
	}
	for _, c := range []struct{ what, cfg string }{
		{"pull to push", `{"durable_name":"PULL","deliver_subject":"upd.x"}`},
		{"push to pull", `{"durable_name":"PUSH","ack_policy":"explicit"}`},
		{"push gains a heartbeat", `{"durable_name":"PUSH","deliver_subject":"upd.1","ack_policy":"explicit","idle_heartbeat":5000000000}`},
		{"push gains flow control", `{"durable_name":"HB","deliver_subject":"upd.hb","idle_heartbeat":5000000000,"flow_control":true}`},
		{"push gains max_waiting", `{"durable_name":"PUSH","deliver_subject":"upd.1","ack_policy":"explicit","max_waiting":5}`},
		{"push changes ack policy", `{"durable_name":"PUSH","deliver_subject":"upd.1","ack_policy":"none"}`},
	} {
		if e := send(c.what, c.cfg); e == nil {
			t.Errorf("%s: accepted", c.what)
		}
	}
	if e := send("push changes what may change", `{"durable_name":"PUSH","deliver_subject":"upd.1","ack_policy":"explicit","max_ack_pending":7,"deliver_group":"g","rate_limit_bps":64,"headers_only":true}`); e != nil {
		t.Errorf("update: %v", e)
	}

	// A deliver subject nobody listens on may move; one with a subscriber may not.
	if e := send("move while unbound", `{"durable_name":"PUSH","deliver_subject":"upd.2","ack_policy":"explicit"}`); e != nil {
		t.Errorf("move while unbound: %v", e)
	}
	for side, js := range tw.js {
		sub, err := js.Conn().SubscribeSync("upd.2")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		if err := js.Conn().Flush(); err != nil {
			t.Fatalf("%s: %v", sideName[side], err)
		}
	}
	tw.waitLinkInterest("upd.2", true)
	if e := send("move while bound", `{"durable_name":"PUSH","deliver_subject":"upd.3","ack_policy":"explicit"}`); e == nil {
		t.Error("move while bound: accepted")
	}
}

// waitLinkInterest waits until jetgres's link has heard the server announce (or withdraw)
// interest matching subject.
func (tw *twin) waitLinkInterest(subject string, want bool) {
	tw.t.Helper()
	testwait.For(tw.t, 10*time.Second, func() error {
		if tw.tb.link.HasInterest(subject) != want {
			return fmt.Errorf("link interest in %s is not %t yet", subject, want)
		}
		return nil
	})
}

// pushBound reads push_bound on both sides.
func (tw *twin) pushBound(name string) [2]bool {
	tw.t.Helper()
	var out [2]bool
	for side, js := range tw.js {
		c, err := js.PushConsumer(tw.ctx, pushStream, name)
		if err != nil {
			tw.t.Fatalf("%s: push consumer %s: %v", sideName[side], name, err)
		}
		info, err := c.Info(tw.ctx)
		if err != nil {
			tw.t.Fatalf("%s: info %s: %v", sideName[side], name, err)
		}
		out[side] = info.PushBound
	}
	return out
}

// expectBound waits until both sides report push_bound as want.
func (tw *twin) expectBound(what, name string, want bool) {
	tw.t.Helper()
	testwait.For(tw.t, 10*time.Second, func() error {
		if got := tw.pushBound(name); got != [2]bool{want, want} {
			return fmt.Errorf("%s: push_bound jetgres %t, jetstream %t, want %t", what, got[ours], got[theirs], want)
		}
		return nil
	})
}

// expectStaysUnbound checks, once jetgres's link has heard of the subscription that
// matches subject, that neither side counts it as binding the consumer.
func (tw *twin) expectStaysUnbound(what, name, subject string) {
	tw.t.Helper()
	tw.waitLinkInterest(subject, true)
	if got := tw.pushBound(name); got != [2]bool{} {
		tw.t.Errorf("%s: push_bound jetgres %t, jetstream %t, want false", what, got[ours], got[theirs])
	}
}

// subscribe subscribes on both sides (queue group if not empty) and returns a function
// that drops both subscriptions.
func (tw *twin) subscribe(subject, queue string) func() {
	tw.t.Helper()
	var subs [2]*nats.Subscription
	for side, js := range tw.js {
		var err error
		if queue == "" {
			subs[side], err = js.Conn().SubscribeSync(subject)
		} else {
			subs[side], err = js.Conn().QueueSubscribeSync(subject, queue)
		}
		if err != nil {
			tw.t.Fatalf("%s: subscribe %s: %v", sideName[side], subject, err)
		}
		if err := js.Conn().Flush(); err != nil {
			tw.t.Fatal(err)
		}
	}
	dropped := false
	drop := func() {
		if dropped {
			return
		}
		dropped = true
		for side, sub := range subs {
			if err := sub.Unsubscribe(); err != nil {
				tw.t.Fatalf("%s: unsubscribe: %v", sideName[side], err)
			}
			if err := tw.js[side].Conn().Flush(); err != nil {
				tw.t.Fatal(err)
			}
		}
	}
	tw.t.Cleanup(drop)
	return drop
}

func TestPushBoundTwin(t *testing.T) {
	t.Parallel()
	tw := newPushTwin(t)
	for _, cfg := range []jetstream.ConsumerConfig{
		{Durable: "PLAIN", DeliverSubject: "bnd.plain", AckPolicy: jetstream.AckExplicitPolicy},
		{Durable: "GROUP", DeliverSubject: "bnd.group", DeliverGroup: "g", AckPolicy: jetstream.AckExplicitPolicy},
	} {
		for side, js := range tw.js {
			if _, err := js.CreateOrUpdatePushConsumer(tw.ctx, pushStream, cfg); err != nil {
				t.Fatalf("%s: create %s: %v", sideName[side], cfg.Durable, err)
			}
		}
	}
	tw.expectBound("no subscriber", "PLAIN", false)

	drop := tw.subscribe("bnd.plain", "")
	tw.expectBound("a subscriber", "PLAIN", true)
	drop()
	tw.expectBound("the subscriber left", "PLAIN", false)

	// Only a subscription to the deliver subject itself binds, as nats-server's interest
	// notification is for that literal subject.
	drop = tw.subscribe("bnd.*", "")
	tw.expectStaysUnbound("a wildcard subscriber", "PLAIN", "bnd.plain")
	drop()
	tw.waitLinkInterest("bnd.plain", false)

	// With a deliver group, only a queue subscription of that group binds.
	tw.expectBound("grouped, no subscriber", "GROUP", false)
	drop = tw.subscribe("bnd.group", "")
	tw.expectStaysUnbound("grouped, a plain subscriber", "GROUP", "bnd.group")
	drop()
	tw.waitLinkInterest("bnd.group", false)
	drop = tw.subscribe("bnd.group", "other")
	tw.expectStaysUnbound("grouped, another group", "GROUP", "bnd.group")
	drop()
	tw.waitLinkInterest("bnd.group", false)
	drop = tw.subscribe("bnd.group", "g")
	tw.expectBound("grouped, a member of the group", "GROUP", true)
	drop()
	tw.expectBound("grouped, the member left", "GROUP", false)

	// Without a group, a queue subscriber does not bind.
	drop = tw.subscribe("bnd.plain", "g")
	tw.expectStaysUnbound("a queue subscriber", "PLAIN", "bnd.plain")
	drop()
}

func TestPushListTwin(t *testing.T) {
	t.Parallel()
	tw := newPushTwin(t)
	cfgs := []jetstream.ConsumerConfig{
		{Durable: "LPULL"},
		{Durable: "LPUSH", DeliverSubject: "lst.push", DeliverGroup: "g", FlowControl: true, IdleHeartbeat: 2 * time.Second, HeadersOnly: true},
		{Durable: "LBOUND", DeliverSubject: "lst.bound", AckPolicy: jetstream.AckNonePolicy},
	}
	for _, cfg := range cfgs {
		for side, js := range tw.js {
			if _, err := js.CreateOrUpdateConsumer(tw.ctx, pushStream, cfg); err != nil {
				t.Fatalf("%s: create %s: %v", sideName[side], cfg.Durable, err)
			}
		}
	}
	tw.subscribe("lst.bound", "")
	tw.expectBound("listed consumer's subscriber", "LBOUND", true)

	var listed [2]map[string]*jetstream.ConsumerInfo
	var names [2][]string
	for side, js := range tw.js {
		s, err := js.Stream(tw.ctx, pushStream)
		if err != nil {
			t.Fatal(err)
		}
		listed[side] = map[string]*jetstream.ConsumerInfo{}
		l := s.ListConsumers(tw.ctx)
		for info := range l.Info() {
			listed[side][info.Name] = info
		}
		if err := l.Err(); err != nil {
			t.Fatalf("%s: list: %v", sideName[side], err)
		}
		n := s.ConsumerNames(tw.ctx)
		for name := range n.Name() {
			names[side] = append(names[side], name)
		}
		if err := n.Err(); err != nil {
			t.Fatalf("%s: names: %v", sideName[side], err)
		}
	}
	if len(names[ours]) != len(cfgs) || len(names[theirs]) != len(cfgs) {
		t.Errorf("names: jetgres %v, jetstream %v", names[ours], names[theirs])
	}
	for _, cfg := range cfgs {
		o, j := listed[ours][cfg.Durable], listed[theirs][cfg.Durable]
		if o == nil || j == nil {
			t.Errorf("%s listed: jetgres %t, jetstream %t", cfg.Durable, o != nil, j != nil)
			continue
		}
		if a, b := comparable(t, o.Config, false), comparable(t, j.Config, false); a != b {
			t.Errorf("%s: listed configs differ\njetgres   %s\njetstream %s", cfg.Durable, a, b)
		}
		if o.PushBound != j.PushBound {
			t.Errorf("%s: listed push_bound: jetgres %t, jetstream %t", cfg.Durable, o.PushBound, j.PushBound)
		}
	}
}

// The clients' own calls: nats.go's jetstream package (push and plain create) and its
// legacy JetStreamContext.AddConsumer, each sent to both sides.
func TestPushClientsTwin(t *testing.T) {
	t.Parallel()
	tw := newPushTwin(t)
	var legacy [2]nats.JetStreamContext
	for side, js := range tw.js {
		var err error
		if legacy[side], err = js.Conn().JetStream(); err != nil {
			t.Fatal(err)
		}
	}
	type answer struct {
		cfg  any
		code jetstream.ErrorCode
	}
	compare := func(what string, got [2]answer) {
		t.Helper()
		switch {
		case got[ours].code != got[theirs].code:
			t.Errorf("%s: jetgres err_code %d, jetstream err_code %d", what, got[ours].code, got[theirs].code)
		case got[ours].code == 0:
			if a, b := comparable(t, got[ours].cfg, false), comparable(t, got[theirs].cfg, false); a != b {
				t.Errorf("%s: configs differ\njetgres   %s\njetstream %s", what, a, b)
			}
		}
	}
	for _, cfg := range []jetstream.ConsumerConfig{
		{Durable: "J1", DeliverSubject: "cli.j1", AckPolicy: jetstream.AckExplicitPolicy},
		{Name: "J2", DeliverSubject: "cli.j2", DeliverGroup: "workers", FlowControl: true, IdleHeartbeat: 5 * time.Second, AckPolicy: jetstream.AckAllPolicy, MaxAckPending: 20},
		{Name: "J3", DeliverSubject: "cli.j3", AckPolicy: jetstream.AckNonePolicy, MaxDeliver: 1, FlowControl: true, IdleHeartbeat: 5 * time.Second, MemoryStorage: true, Replicas: 1, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy, FilterSubject: "pushc.kv.>", HeadersOnly: true},
		{Name: "J4", DeliverSubject: "cli.j4", FlowControl: true},
		{Name: "J5", DeliverSubject: "cli.*"},
		{Name: "J6", DeliverSubject: "pushc.j6"},
	} {
		var got [2]answer
		for side, js := range tw.js {
			c, err := js.CreateOrUpdatePushConsumer(tw.ctx, pushStream, cfg)
			if got[side].code = errCode(t, side, err); err == nil {
				got[side].cfg = c.CachedInfo().Config
			}
		}
		compare("jetstream push "+cfg.Durable+cfg.Name, got)
	}

	// CreateOrUpdateConsumer sends a deliver subject just the same.
	var got [2]answer
	for side, js := range tw.js {
		c, err := js.CreateOrUpdateConsumer(tw.ctx, pushStream, jetstream.ConsumerConfig{Durable: "J7", DeliverSubject: "cli.j7"})
		if got[side].code = errCode(t, side, err); err == nil {
			got[side].cfg = c.CachedInfo().Config
		}
	}
	compare("jetstream plain create with a deliver subject", got)

	for _, cfg := range []nats.ConsumerConfig{
		{Durable: "L1", DeliverSubject: "cli.l1", AckPolicy: nats.AckExplicitPolicy},
		{Durable: "L2", DeliverSubject: "cli.l2", DeliverGroup: "workers", AckPolicy: nats.AckExplicitPolicy, FlowControl: true, Heartbeat: 2 * time.Second},
		{Durable: "L3", DeliverSubject: "cli.l3", AckPolicy: nats.AckExplicitPolicy, MaxWaiting: 4},
		{Durable: "L4", DeliverSubject: "cli.l4", AckPolicy: nats.AckNonePolicy, Heartbeat: 10 * time.Millisecond},
	} {
		var got [2]answer
		for side, js := range legacy {
			info, err := js.AddConsumer(pushStream, &cfg, nats.Context(tw.ctx))
			got[side].code = legacyErrCode(t, side, err)
			if err == nil {
				got[side].cfg = info.Config
			}
		}
		compare("legacy AddConsumer "+cfg.Durable, got)
	}
}

// legacyErrCode is errCode for the legacy JetStreamContext, whose errors are its own type.
func legacyErrCode(t testing.TB, side int, err error) jetstream.ErrorCode {
	t.Helper()
	var apiErr *nats.APIError
	if errors.As(err, &apiErr) {
		return jetstream.ErrorCode(apiErr.ErrorCode)
	}
	return errCode(t, side, err)
}
