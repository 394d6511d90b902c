package leaf_test

// Tests of what a link learns of the server's subscriptions (interest, queue groups, and
// their changes) and of how its own subscriptions deliver and stop.

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/testwait"

	"github.com/nats-io/nats.go"

	"github.com/jetgres/jetgres/embedded/leaf"
)

func TestQueueSubscriptions(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	const n = 200

	var a, b, plain, client atomic.Int64
	count := func(c *atomic.Int64) leaf.Handler { return func(*leaf.Msg) { c.Add(1) } }
	if _, err := tb.link.Subscribe("work", "q", count(&a)); err != nil {
		t.Fatalf("subscribe a: %v", err)
	}
	if _, err := tb.link.Subscribe("work", "q", count(&b)); err != nil {
		t.Fatalf("subscribe b: %v", err)
	}
	if _, err := tb.link.Subscribe("work", "", count(&plain)); err != nil {
		t.Fatalf("subscribe plain: %v", err)
	}
	flushBoth(t, tb.nc, tb.link)

	publish := func() {
		t.Helper()
		for i := range n {
			if err := tb.nc.Publish("work", []byte{byte(i)}); err != nil {
				t.Fatalf("publish: %v", err)
			}
		}
		flushBoth(t, tb.nc, tb.link)
	}

	// Only the link serves q: each message goes to exactly one of its
	// members, in turn, and to the plain subscription.
	publish()
	if a.Load()+b.Load() != n || plain.Load() != n {
		t.Fatalf("queue members got %d + %d, plain %d; want %d and %d", a.Load(), b.Load(), plain.Load(), n, n)
	}
	if a.Load() == 0 || b.Load() == 0 {
		t.Fatalf("queue members got %d and %d: no rotation", a.Load(), b.Load())
	}

	// With a client in q as well, every message still reaches exactly one
	// member of the group (the server prefers its local member).
	if _, err := tb.nc.QueueSubscribe("work", "q", func(*nats.Msg) { client.Add(1) }); err != nil {
		t.Fatalf("client queue subscribe: %v", err)
	}
	flushBoth(t, tb.nc, tb.link)
	a.Store(0)
	b.Store(0)
	plain.Store(0)
	publish()
	testwait.For(t, waitTimeout, func() error {
		if q, p := a.Load()+b.Load()+client.Load(), plain.Load(); q != n || p != n {
			return fmt.Errorf("%d queue and %d plain deliveries, want %d of each", q, p, n)
		}
		return nil
	})
	if st := tb.link.Stats(); st.Dropped != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestUnsubscribeStopsDelivery(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	h1, ch1 := chanHandler(10)
	h2, ch2 := chanHandler(10)
	hm, marker := chanHandler(10)
	s1, err := tb.link.Subscribe("news", "", h1)
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	s2, err := tb.link.Subscribe("news", "", h2)
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	if _, err := tb.link.Subscribe("marker", "", hm); err != nil {
		t.Fatalf("subscribe marker: %v", err)
	}
	flushBoth(t, tb.nc, tb.link)

	// Dropping one of two subscriptions keeps the other served.
	if err := s1.Unsubscribe(); err != nil {
		t.Fatalf("unsubscribe: %v", err)
	}
	flushBoth(t, tb.nc, tb.link)
	if err := tb.nc.Publish("news", []byte("1")); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if m := recv(t, ch2); string(m.Data) != "1" {
		t.Fatalf("got %q", m.Data)
	}

	// Dropping the last one withdraws the interest from the server.
	if err := s2.Unsubscribe(); err != nil {
		t.Fatalf("unsubscribe: %v", err)
	}
	if err := s2.Unsubscribe(); err != nil {
		t.Fatalf("second unsubscribe: %v", err)
	}
	flushBoth(t, tb.nc, tb.link)
	if err := tb.nc.Publish("news", []byte("2")); err != nil {
		t.Fatalf("publish: %v", err)
	}
	// The marker travels behind "2" on the same path.
	if err := tb.nc.Publish("marker", nil); err != nil {
		t.Fatalf("publish marker: %v", err)
	}
	recv(t, marker)
	select {
	case m := <-ch1:
		t.Fatalf("unsubscribed handler got %q", m.Data)
	case m := <-ch2:
		t.Fatalf("unsubscribed handler got %q", m.Data)
	default:
	}
	if st := tb.link.Stats(); st.Dropped != 0 {
		t.Fatalf("server still sent %d messages after LS-", st.Dropped)
	}
}

func TestHasInterest(t *testing.T) {
	t.Parallel()
	tb := setup(t)

	sub, err := tb.nc.SubscribeSync("_INBOX.x.*")
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	if _, err := tb.nc.SubscribeSync("events.>"); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	if _, err := tb.nc.QueueSubscribeSync("jobs", "workers"); err != nil {
		t.Fatalf("queue subscribe: %v", err)
	}
	flushBoth(t, tb.nc, tb.link)
	for subject, want := range map[string]bool{
		"_INBOX.x.abc":   true,
		"_INBOX.x.abc.d": false,
		"_INBOX.y.abc":   false,
		"events.a.b":     true,
		"events":         false,
		"jobs":           true,
		"jobs.x":         false,
	} {
		if got := tb.link.HasInterest(subject); got != want {
			t.Errorf("HasInterest(%q) = %v, want %v", subject, got, want)
		}
	}

	before := tb.link.InterestVersion()
	flushBoth(t, tb.nc, tb.link)
	if tb.link.InterestVersion() != before {
		t.Fatal("the interest version moved with no subscription changed")
	}
	if err := sub.Unsubscribe(); err != nil {
		t.Fatalf("unsubscribe: %v", err)
	}
	flushBoth(t, tb.nc, tb.link)
	if tb.link.HasInterest("_INBOX.x.abc") {
		t.Fatal("interest remains after the client unsubscribed")
	}
	if tb.link.InterestVersion() == before {
		t.Fatal("the interest version did not move when a subscription went away")
	}

	// A client that goes away takes its interest with it.
	other := connect(t, tb.srv)
	if _, err := other.SubscribeSync("_INBOX.gone.*"); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	flushBoth(t, other, tb.link)
	if !tb.link.HasInterest("_INBOX.gone.1") {
		t.Fatal("no interest for the second client's inbox")
	}
	other.Close()
	testwait.For(t, waitTimeout, func() error {
		if tb.link.HasInterest("_INBOX.gone.1") {
			return errors.New("interest outlives the disconnected client")
		}
		return nil
	})
	if !tb.link.HasInterest("events.a") {
		t.Fatal("the first client's interest vanished too")
	}
}

func TestInterestChanged(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	drain := func() {
		select {
		case <-tb.link.InterestChanged():
		default:
		}
	}
	wait := func(what string) {
		t.Helper()
		select {
		case <-tb.link.InterestChanged():
		case <-time.After(waitTimeout):
			t.Fatalf("no interest change heard after %s", what)
		}
	}
	flushBoth(t, tb.nc, tb.link)
	drain()
	sub, err := tb.nc.QueueSubscribeSync("deliver.here", "g")
	if err != nil {
		t.Fatalf("queue subscribe: %v", err)
	}
	flushBoth(t, tb.nc, tb.link)
	wait("a subscription")
	if err := sub.Unsubscribe(); err != nil {
		t.Fatalf("unsubscribe: %v", err)
	}
	flushBoth(t, tb.nc, tb.link)
	wait("an unsubscription")
}

func TestHasQueueInterest(t *testing.T) {
	t.Parallel()
	tb := setup(t)

	if _, err := tb.nc.SubscribeSync("deliver.plain"); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	q1, err := tb.nc.QueueSubscribeSync("deliver.grouped", "workers")
	if err != nil {
		t.Fatalf("queue subscribe: %v", err)
	}
	q2, err := tb.nc.QueueSubscribeSync("deliver.grouped", "workers")
	if err != nil {
		t.Fatalf("queue subscribe: %v", err)
	}
	if _, err := tb.nc.SubscribeSync("deliver.wild.*"); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	flushBoth(t, tb.nc, tb.link)
	for _, c := range []struct {
		subject, group string
		want           bool
	}{
		{"deliver.plain", "", true},
		{"deliver.plain", "workers", false},
		{"deliver.grouped", "workers", true},
		{"deliver.grouped", "", false},
		{"deliver.grouped", "others", false},
		{"deliver.wild.x", "", false},
	} {
		if got := tb.link.HasQueueInterest(c.subject, c.group); got != c.want {
			t.Errorf("HasQueueInterest(%q, %q) = %v, want %v", c.subject, c.group, got, c.want)
		}
	}

	// The group stays while one member does.
	if err := q1.Unsubscribe(); err != nil {
		t.Fatalf("unsubscribe: %v", err)
	}
	flushBoth(t, tb.nc, tb.link)
	if !tb.link.HasQueueInterest("deliver.grouped", "workers") {
		t.Fatal("the group's interest left with one of its two members")
	}
	if err := q2.Unsubscribe(); err != nil {
		t.Fatalf("unsubscribe: %v", err)
	}
	flushBoth(t, tb.nc, tb.link)
	if tb.link.HasQueueInterest("deliver.grouped", "workers") {
		t.Fatal("the group's interest outlives its last member")
	}
}

func TestPublishQueue(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	var members [2]*nats.Subscription
	for i := range members {
		sub, err := tb.nc.QueueSubscribeSync("deliver.q", "g")
		if err != nil {
			t.Fatalf("queue subscribe: %v", err)
		}
		members[i] = sub
	}
	plain, err := tb.nc.SubscribeSync("deliver.q")
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	flushBoth(t, tb.nc, tb.link)
	const n = 40
	for i := range n {
		var reply []byte
		var hdr []byte
		if i%2 == 0 {
			reply = []byte("reply.q")
		}
		if i%4 < 2 {
			hdr = []byte("NATS/1.0\r\nK: v\r\n\r\n")
		}
		if err := tb.link.PublishQueue("deliver.q", reply, "g", hdr, []byte(strconv.Itoa(i))); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	flushBoth(t, tb.nc, tb.link)
	got := map[string]int{}
	for _, sub := range members {
		for {
			m, err := sub.NextMsg(50 * time.Millisecond)
			if err != nil {
				break
			}
			got[string(m.Data)]++
			i, _ := strconv.Atoi(string(m.Data))
			if wantReply := i%2 == 0; (m.Reply == "reply.q") != wantReply || (m.Header.Get("K") == "v") != (i%4 < 2) {
				t.Fatalf("message %d: reply %q header %v", i, m.Reply, m.Header)
			}
		}
	}
	if len(got) != n {
		t.Fatalf("the group got %d distinct messages of %d", len(got), n)
	}
	for data, k := range got {
		if k != 1 {
			t.Fatalf("message %s reached %d members", data, k)
		}
	}
	for i := range n {
		if _, err := plain.NextMsg(waitTimeout); err != nil {
			t.Fatalf("plain subscriber, message %d: %v", i, err)
		}
	}
}

func TestInterestKnownAtDial(t *testing.T) {
	t.Parallel()
	srv := startServer(t, nil)
	nc := connect(t, srv)
	if _, err := nc.SubscribeSync("_INBOX.early.*"); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	link := dial(t, srv.Leaf(), nil)
	if !link.HasInterest("_INBOX.early.1") {
		t.Fatal("interest existing before Dial not known when Dial returns")
	}
}

// QueueGroups lists the groups whose subscriptions match a subject, wildcards included,
// and PublishQueues reaches one member of each of them, and every plain subscriber.
func TestQueueGroupsAndPublishQueues(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	subscribe := func(subject, group string) *nats.Subscription {
		t.Helper()
		sub, err := tb.nc.QueueSubscribeSync(subject, group)
		if group == "" {
			sub, err = tb.nc.SubscribeSync(subject)
		}
		if err != nil {
			t.Fatalf("subscribe %s %s: %v", subject, group, err)
		}
		return sub
	}
	a1, a2 := subscribe("rp.>", "a"), subscribe("rp.>", "a")
	b := subscribe("rp.*.x", "b")
	plain := subscribe("rp.one.x", "")
	other := subscribe("other.>", "c")
	flushBoth(t, tb.nc, tb.link)
	if got := fmt.Sprint(sorted(tb.link.QueueGroups("rp.one.x", nil))); got != "[a b]" {
		t.Fatalf("QueueGroups(rp.one.x) = %s, want [a b]", got)
	}
	if got := tb.link.QueueGroups("rp.one", nil); fmt.Sprint(got) != "[a]" {
		t.Fatalf("QueueGroups(rp.one) = %v, want [a]", got)
	}
	if err := tb.link.PublishQueues("rp.one.x", "", tb.link.QueueGroups("rp.one.x", nil), nil, []byte("m")); err != nil {
		t.Fatal(err)
	}
	got := func(s *nats.Subscription) int {
		n, _, err := s.Pending()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	testwait.For(t, 5*time.Second, func() error {
		if n := got(a1) + got(a2); n != 1 || got(b) != 1 || got(plain) != 1 || got(other) != 0 {
			return fmt.Errorf("group a got %d, b %d, plain %d, other %d; want 1, 1, 1, 0", n, got(b), got(plain), got(other))
		}
		return nil
	})
	if err := b.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	flushBoth(t, tb.nc, tb.link)
	if got := tb.link.QueueGroups("rp.one.x", nil); fmt.Sprint(got) != "[a]" {
		t.Fatalf("after b left, QueueGroups(rp.one.x) = %v, want [a]", got)
	}
}

func sorted(s []string) []string {
	slices.Sort(s)
	return s
}
