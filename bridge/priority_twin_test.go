package bridge

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The tests in this file compare priority groups on pull consumers, jetgres against a real
// JetStream: their configurations, valid and invalid; what overflow, pinned_client and
// prioritized consumers deliver to raw pull requests, with the status answers and the
// Nats-Pin-Id header; CONSUMER.UNPIN and its errors; a pin lost after pinned_ttl, which on
// jetgres's side the fake clock drives; and the priority_groups of the consumer info.

// quiet is how long a test waits for a request it expects no answer to. A negative result
// cannot be waited for on a condition: this bounds how long a wrong answer has to arrive.
const quiet = 300 * time.Millisecond

// rawPull sends a MSG.NEXT request with body from a fresh inbox on side and returns the
// inbox's subscription.
func (tw *twin) rawPull(side int, stream, consumer, body string) *nats.Subscription {
	tw.t.Helper()
	nc := tw.js[side].Conn()
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		tw.t.Fatal(err)
	}
	tw.t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		tw.t.Fatal(err)
	}
	if err := nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT."+stream+"."+consumer, inbox, []byte(body)); err != nil {
		tw.t.Fatal(err)
	}
	return sub
}

// pullEvent is the next thing sub receives within d, as text the two sides share: "msg
// <stream seq> pinned" or "msg <stream seq>", "status <code> <description> <pending msgs>",
// or "" when nothing came; pin is a delivery's Nats-Pin-Id.
func pullEvent(t *testing.T, sub *nats.Subscription, d time.Duration) (ev, pin string) {
	t.Helper()
	m, err := sub.NextMsg(d)
	if errors.Is(err, nats.ErrTimeout) {
		return "", ""
	}
	if err != nil {
		t.Fatal(err)
	}
	if st := m.Header.Get("Status"); st != "" {
		return strings.TrimSpace(fmt.Sprintf("status %s %s %s", st, m.Header.Get("Description"), m.Header.Get(server.JSPullRequestPendingMsgs))), ""
	}
	md, err := m.Metadata()
	if err != nil {
		t.Fatalf("delivery %q: %v", m.Reply, err)
	}
	pin = m.Header.Get(server.JSPullRequestNatsPinId)
	if _, ok := m.Header[server.JSPullRequestNatsPinId]; ok {
		return fmt.Sprintf("msg %d pinned", md.Sequence.Stream), pin
	}
	return fmt.Sprintf("msg %d", md.Sequence.Stream), ""
}

// samePull sends body on both sides and compares the first n events each request's inbox
// receives within d; it returns each side's subscription and the pins its deliveries
// carried.
func (tw *twin) samePull(what, stream, consumer, body string, n int, d time.Duration) (subs [2]*nats.Subscription, pins [2]string) {
	tw.t.Helper()
	var got [2][]string
	for side := range tw.js {
		subs[side] = tw.rawPull(side, stream, consumer, body)
	}
	for side := range tw.js {
		for range n {
			ev, pin := pullEvent(tw.t, subs[side], d)
			got[side] = append(got[side], ev)
			if pin != "" {
				pins[side] = pin
			}
		}
	}
	if a, b := strings.Join(got[ours], ", "), strings.Join(got[theirs], ", "); a != b {
		tw.t.Fatalf("%s: jetgres got [%s], jetstream [%s]", what, a, b)
	}
	return subs, pins
}

// sameNext compares the next event of each side's subscription within d.
func (tw *twin) sameNext(what string, subs [2]*nats.Subscription, d time.Duration) (ev string, pins [2]string) {
	tw.t.Helper()
	var got [2]string
	for side := range tw.js {
		got[side], pins[side] = pullEvent(tw.t, subs[side], d)
	}
	if got[ours] != got[theirs] {
		tw.t.Fatalf("%s: jetgres got %q, jetstream %q", what, got[ours], got[theirs])
	}
	return got[ours], pins
}

// sameAPI sends body to an API subject on both sides and compares the answers' type and
// error; it returns jetgres's error.
func (tw *twin) sameAPI(what, subject, body string) *server.ApiError {
	tw.t.Helper()
	var got [2]server.ApiResponse
	for side, js := range tw.js {
		m, err := js.Conn().Request(subject, []byte(body), 5*time.Second)
		if err != nil {
			tw.t.Fatalf("%s: %s: %v", what, sideName[side], err)
		}
		if err := json.Unmarshal(m.Data, &got[side]); err != nil {
			tw.t.Fatalf("%s: %s: %q: %v", what, sideName[side], m.Data, err)
		}
	}
	o, j := got[ours], got[theirs]
	if o.Type != j.Type || (o.Error == nil) != (j.Error == nil) || o.Error != nil && *o.Error != *j.Error {
		tw.t.Errorf("%s: jetgres %s %+v, jetstream %s %+v", what, o.Type, o.Error, j.Type, j.Error)
	}
	return o.Error
}

// groupStates reads the consumer info's priority_groups on both sides and compares them,
// a pin by whether it is held and, when pins is given, by the id each side gave.
func (tw *twin) groupStates(what, stream, consumer string, pins *[2]string) {
	tw.t.Helper()
	var st [2][]server.PriorityGroupState
	for side, js := range tw.js {
		m, err := js.Conn().Request("$JS.API.CONSUMER.INFO."+stream+"."+consumer, nil, 5*time.Second)
		if err != nil {
			tw.t.Fatal(err)
		}
		var resp server.JSApiConsumerInfoResponse
		if err := json.Unmarshal(m.Data, &resp); err != nil || resp.ConsumerInfo == nil {
			tw.t.Fatalf("%s: %s: info %q: %v", what, sideName[side], m.Data, err)
		}
		st[side] = resp.PriorityGroups
	}
	shape := func(side int) string {
		var parts []string
		for _, g := range st[side] {
			pinned := g.PinnedClientID != ""
			if pins != nil && pinned && g.PinnedClientID != pins[side] {
				tw.t.Errorf("%s: %s reports pin %q, its deliveries carried %q", what, sideName[side], g.PinnedClientID, pins[side])
			}
			parts = append(parts, fmt.Sprintf("%s pinned=%t ts=%t", g.Group, pinned, !g.PinnedTS.IsZero()))
		}
		return strings.Join(parts, "; ")
	}
	if a, b := shape(ours), shape(theirs); a != b {
		tw.t.Errorf("%s: priority_groups: jetgres [%s], jetstream [%s]", what, a, b)
	}
}

func TestPriorityGroupsConfigTwin(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "PRC", Subjects: []string{"prc.>"}})
	create := func(name, cfg string) [2]server.JSApiConsumerCreateResponse {
		return tw.request("$JS.API.CONSUMER.CREATE.PRC."+name, `{"stream_name":"PRC","config":`+cfg+`}`)
	}
	for _, c := range []struct{ what, name, cfg string }{
		{"overflow", "OV", `{"durable_name":"OV","ack_policy":"explicit","priority_policy":"overflow","priority_groups":["A","b-2"]}`},
		{"pinned with the default ttl", "PD", `{"durable_name":"PD","ack_policy":"explicit","priority_policy":"pinned_client","priority_groups":["A"]}`},
		{"pinned with a ttl", "PT", `{"durable_name":"PT","ack_policy":"explicit","priority_policy":"pinned_client","priority_groups":["A"],"priority_timeout":5000000000}`},
		{"prioritized", "PR", `{"durable_name":"PR","ack_policy":"explicit","priority_policy":"prioritized","priority_groups":["x/y=z_"]}`},
		{"pinned with a negative ttl", "PN", `{"durable_name":"PN","ack_policy":"none","priority_policy":"pinned_client","priority_groups":["A"],"priority_timeout":-5}`},
	} {
		if e := tw.sameAnswer(c.what, create(c.name, c.cfg), false); e != nil {
			t.Fatalf("%s: refused: %v", c.what, e)
		}
		tw.cons = append(tw.cons, [2]string{"PRC", c.name})
		tw.compareAll("create " + c.what)
		if e := tw.sameAnswer("info of "+c.what, tw.request("$JS.API.CONSUMER.INFO.PRC."+c.name, ""), false); e != nil {
			t.Fatalf("info of %s: %v", c.what, e)
		}
		tw.groupStates("info of "+c.what, "PRC", c.name, nil)
	}
	for _, c := range []struct{ what, cfg string }{
		{"a policy without groups", `{"durable_name":"X","priority_policy":"overflow"}`},
		{"an empty group", `{"durable_name":"X","priority_policy":"overflow","priority_groups":[""]}`},
		{"a group name too long", `{"durable_name":"X","priority_policy":"overflow","priority_groups":["abcdefghijklmnopq"]}`},
		{"a group name with a dot", `{"durable_name":"X","priority_policy":"pinned_client","priority_groups":["a.b"]}`},
		{"groups without a policy", `{"durable_name":"X","priority_groups":["A"]}`},
		{"a ttl without a policy", `{"durable_name":"X","priority_timeout":1000000000}`},
		{"a push consumer with a policy", `{"durable_name":"X","deliver_subject":"dlv.x","priority_policy":"overflow","priority_groups":["A"]}`},
		{"an unknown policy", `{"durable_name":"X","priority_policy":"loudest","priority_groups":["A"]}`},
	} {
		if e := tw.sameAnswer(c.what, create("X", c.cfg), false); e == nil {
			t.Errorf("%s: accepted", c.what)
		}
	}
	tw.compareAll("refused creates")
	for _, c := range []struct {
		what, cfg string
		ok        bool
	}{
		{"overflow gains a group", `{"durable_name":"OV","ack_policy":"explicit","priority_policy":"overflow","priority_groups":["A","b-2","C"]}`, true},
		{"overflow becomes pinned", `{"durable_name":"OV","ack_policy":"explicit","priority_policy":"pinned_client","priority_groups":["A"]}`, true},
		{"pinned loses its policy", `{"durable_name":"PT","ack_policy":"explicit"}`, true},
		{"pinned keeps groups without a policy", `{"durable_name":"PD","ack_policy":"explicit","priority_groups":["A"]}`, false},
	} {
		name := strings.Split(strings.Split(c.cfg, `"durable_name":"`)[1], `"`)[0]
		e := tw.sameAnswer(c.what, create(name, c.cfg), false)
		if c.ok != (e == nil) {
			t.Errorf("%s: error %v", c.what, e)
		}
		tw.compareAll(c.what)
	}
}

// TestOverflowPullTwin: overflow requests are served only while num_pending reaches
// min_pending or num_ack_pending min_ack_pending, counted as each message goes out, and
// the requests a consumer without that policy may not make are refused.
func TestOverflowPullTwin(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "PRO", Subjects: []string{"pro.>"}})
	if e := tw.sameAnswer("create", tw.request("$JS.API.CONSUMER.CREATE.PRO.OV",
		`{"stream_name":"PRO","config":{"durable_name":"OV","ack_policy":"explicit","priority_policy":"overflow","priority_groups":["A"]}}`), false); e != nil {
		t.Fatal(e)
	}
	tw.cons = append(tw.cons, [2]string{"PRO", "OV"})
	tw.pubN("pro.x", 5, 8)

	tw.samePull("below min_pending", "PRO", "OV", `{"batch":1,"group":"A","min_pending":10,"expires":500000000}`, 1, 5*time.Second)
	tw.samePull("at min_pending until it is not", "PRO", "OV", `{"batch":2,"group":"A","min_pending":5,"expires":500000000}`, 2, 5*time.Second)
	tw.samePull("at min_ack_pending", "PRO", "OV", `{"batch":1,"group":"A","min_ack_pending":1,"expires":500000000}`, 1, 5*time.Second)
	tw.samePull("without thresholds", "PRO", "OV", `{"batch":1,"group":"A","expires":500000000}`, 1, 5*time.Second)
	for _, c := range []struct{ what, body string }{
		{"no group", `{"batch":1}`},
		{"another group", `{"batch":1,"group":"B"}`},
		{"a pin id", `{"batch":1,"group":"A","id":"x"}`},
		{"a priority out of range", `{"batch":1,"group":"A","priority":10}`},
	} {
		tw.samePull(c.what, "PRO", "OV", c.body, 1, 5*time.Second)
	}
	// A request that is not JSON names no group and is served as ever.
	tw.samePull("a bare batch", "PRO", "OV", `1`, 1, 5*time.Second)
	tw.groupStates("overflow", "PRO", "OV", nil)

	// A redelivery counts one more than the messages never delivered: with none left, it
	// still reaches a min_pending of 1.
	if e := tw.sameAnswer("create", tw.request("$JS.API.CONSUMER.CREATE.PRO.RE",
		`{"stream_name":"PRO","config":{"durable_name":"RE","ack_policy":"explicit","ack_wait":1000000000,"priority_policy":"overflow","priority_groups":["A"]}}`), false); e != nil {
		t.Fatal(e)
	}
	tw.cons = append(tw.cons, [2]string{"PRO", "RE"})
	tw.samePull("all, unacknowledged", "PRO", "RE", `{"batch":5,"group":"A","expires":2000000000}`, 5, 5*time.Second)
	tw.samePull("a redelivery at min_pending 1", "PRO", "RE", `{"batch":1,"group":"A","min_pending":1,"expires":3000000000}`, 1, 5*time.Second)
	tw.compareAll("overflow")
}

// TestPinnedClientTwin: the first request of a pinned_client consumer's group takes the
// pin and every delivery carries it; other requests wait, or are refused when they name
// another pin; CONSUMER.UNPIN gives the pin to the next request; a pinned client that
// stops asking loses the pin after pinned_ttl (the fake clock on jetgres's side, real time
// on JetStream's).
func TestPinnedClientTwin(t *testing.T) {
	t.Parallel()
	tw, clock := newClockTwin(t)
	// Long enough that JetStream's pin, on a real timer, cannot lapse between the unpin and
	// the requests that follow it on a busy machine.
	const ttl = 5 * time.Second
	tw.createStream(jetstream.StreamConfig{Name: "PRP", Subjects: []string{"prp.>"}})
	if e := tw.sameAnswer("create", tw.request("$JS.API.CONSUMER.CREATE.PRP.PIN",
		fmt.Sprintf(`{"stream_name":"PRP","config":{"durable_name":"PIN","ack_policy":"none","priority_policy":"pinned_client","priority_groups":["A"],"priority_timeout":%d}}`, ttl)), false); e != nil {
		t.Fatal(e)
	}
	tw.cons = append(tw.cons, [2]string{"PRP", "PIN"})
	tw.pubN("prp.x", 20, 8)

	const long = `"expires":60000000000`
	_, pins := tw.samePull("first request", "PRP", "PIN", `{"batch":3,"group":"A",`+long+`}`, 3, 5*time.Second)
	if pins[ours] == "" || pins[theirs] == "" {
		t.Fatalf("no pin: %q", pins)
	}
	tw.groupStates("pinned", "PRP", "PIN", &pins)
	waiting, _ := tw.samePull("another client", "PRP", "PIN", `{"batch":1,"group":"A",`+long+`}`, 1, quiet)
	for side, pin := range pins {
		sub := tw.rawPull(side, "PRP", "PIN", `{"batch":1,"group":"A","id":"not-`+pin+`",`+long+`}`)
		if got, _ := pullEvent(t, sub, 5*time.Second); got != "status 423 Nats-Pin-Id mismatch" {
			t.Fatalf("%s: another pin got %q", sideName[side], got)
		}
		sub = tw.rawPull(side, "PRP", "PIN", `{"batch":2,"group":"A","id":"`+pin+`",`+long+`}`)
		for range 2 {
			ev, p := pullEvent(t, sub, 5*time.Second)
			if !strings.HasSuffix(ev, " pinned") || p != pin {
				t.Fatalf("%s: the pinned client got %q with pin %q, want its pin %q", sideName[side], ev, p, pin)
			}
		}
	}
	if ev, _ := tw.sameNext("the other client while pinned", waiting, quiet); ev != "" {
		t.Fatalf("the other client got %q", ev)
	}

	for _, c := range []struct{ what, subject, body string }{
		{"unpin another group", "PRP.PIN", `{"group":"B"}`},
		{"unpin no group", "PRP.PIN", `{}`},
		{"unpin an invalid group", "PRP.PIN", `{"group":"a.b"}`},
		{"unpin without a body", "PRP.PIN", ``},
		{"unpin a missing consumer", "PRP.NOPE", `{"group":"A"}`},
		{"unpin in a missing stream", "NOPE.PIN", `{"group":"A"}`},
	} {
		if e := tw.sameAPI(c.what, "$JS.API.CONSUMER.UNPIN."+c.subject, c.body); e == nil {
			t.Errorf("%s: accepted", c.what)
		}
	}
	if e := tw.sameAPI("unpin", "$JS.API.CONSUMER.UNPIN.PRP.PIN", `{"group":"A"}`); e != nil {
		t.Fatalf("unpin: %v", e)
	}
	ev, newPins := tw.sameNext("the other client after unpin", waiting, 5*time.Second)
	if !strings.HasSuffix(ev, " pinned") || newPins[ours] == pins[ours] || newPins[theirs] == pins[theirs] {
		t.Fatalf("after unpin the waiting client got %q with pins %q (old %q)", ev, newPins, pins)
	}
	tw.groupStates("pinned anew", "PRP", "PIN", &newPins)
	for side, pin := range pins {
		sub := tw.rawPull(side, "PRP", "PIN", `{"batch":1,"group":"A","id":"`+pin+`",`+long+`}`)
		if got, _ := pullEvent(t, sub, 5*time.Second); got != "status 423 Nats-Pin-Id mismatch" {
			t.Fatalf("%s: the old pin got %q", sideName[side], got)
		}
	}

	// The new pinned client asks no more: once pinned_ttl passes, a waiting request takes
	// the pin. JetStream's timer runs in real time; jetgres's runs on the fake clock.
	var late [2]*nats.Subscription
	for side := range tw.js {
		late[side] = tw.rawPull(side, "PRP", "PIN", `{"batch":1,"group":"A",`+long+`}`)
	}
	if ev, _ := pullEvent(t, late[ours], quiet); ev != "" {
		t.Fatalf("jetgres: a request got %q while another client held the pin", ev)
	}
	clock.Advance(ttl)
	ev, lastPins := tw.sameNext("a request after pinned_ttl", late, ttl+5*time.Second)
	if !strings.HasSuffix(ev, " pinned") || lastPins[ours] == newPins[ours] || lastPins[theirs] == newPins[theirs] {
		t.Fatalf("after pinned_ttl the waiting request got %q with pins %q (before %q)", ev, lastPins, newPins)
	}
	tw.groupStates("pinned after ttl", "PRP", "PIN", &lastPins)

	// A request that is not JSON names no group: while no pin is held it takes a message
	// without one, with an empty Nats-Pin-Id; while one is held it waits.
	if e := tw.sameAnswer("create bare", tw.request("$JS.API.CONSUMER.CREATE.PRP.BARE",
		`{"stream_name":"PRP","config":{"durable_name":"BARE","ack_policy":"none","priority_policy":"pinned_client","priority_groups":["A"]}}`), false); e != nil {
		t.Fatal(e)
	}
	tw.cons = append(tw.cons, [2]string{"PRP", "BARE"})
	tw.samePull("a bare batch without a pin", "PRP", "BARE", `1`, 1, 5*time.Second)
	tw.groupStates("after a bare batch", "PRP", "BARE", nil)
	tw.samePull("a request of the group", "PRP", "BARE", `{"batch":1,"group":"A",`+long+`}`, 1, 5*time.Second)
	tw.samePull("a bare batch while pinned", "PRP", "BARE", `1`, 1, quiet)
	tw.compareAll("pinned")
}

// TestPrioritizedPullTwin: a prioritized consumer serves the waiting request of the lowest
// priority first, and those of one priority in turn.
func TestPrioritizedPullTwin(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "PRZ", Subjects: []string{"prz.>"}})
	if e := tw.sameAnswer("create", tw.request("$JS.API.CONSUMER.CREATE.PRZ.Z",
		`{"stream_name":"PRZ","config":{"durable_name":"Z","ack_policy":"none","priority_policy":"prioritized","priority_groups":["A"]}}`), false); e != nil {
		t.Fatal(e)
	}
	tw.cons = append(tw.cons, [2]string{"PRZ", "Z"})
	const long = `"expires":60000000000`
	var subs [4][2]*nats.Subscription
	for i, body := range []string{
		`{"batch":2,"group":"A","priority":5,` + long + `}`,
		`{"batch":2,"group":"A","priority":1,` + long + `}`,
		`{"batch":1,"group":"A","priority":1,` + long + `}`,
		`1`,
	} {
		for side := range tw.js {
			subs[i][side] = tw.rawPull(side, "PRZ", "Z", body)
		}
	}
	// Each request's inbox in the order the messages should reach them.
	for n, want := range []int{1, 2, 1, 0, 0, 3} {
		tw.pub("prz.x", []byte("m"))
		ev, _ := tw.sameNext(fmt.Sprintf("message %d", n+1), subs[want], 5*time.Second)
		if ev != fmt.Sprintf("msg %d", n+1) {
			t.Fatalf("message %d: request %d got %q", n+1, want, ev)
		}
	}
	tw.compareAll("prioritized")
}
