package leaf_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/syncbuf"
	"github.com/jetgres/jetgres/internal/testwait"

	"github.com/nats-io/nats.go"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/embedded/natsd"
)

func TestAckReplyIsRewrittenForClients(t *testing.T) {
	t.Parallel()
	tb := setup(t)

	inbox := nats.NewInbox()
	sub, err := tb.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	flushBoth(t, tb.nc, tb.link)
	if !tb.link.HasInterest(inbox) {
		t.Fatal("link does not see the client's inbox subscription")
	}

	// A pulled message: published to the inbox with the ack reply and the
	// original subject after `@`.
	if err := tb.link.Publish(inbox, "$JS.ACK.a.b.1.1.1.1.0@orders.new", nil, []byte("order 1")); err != nil {
		t.Fatalf("publish: %v", err)
	}
	m, err := sub.NextMsg(waitTimeout)
	if err != nil {
		t.Fatalf("client receive: %v", err)
	}
	if m.Subject != "orders.new" || m.Reply != "$JS.ACK.a.b.1.1.1.1.0" || string(m.Data) != "order 1" {
		t.Fatalf("client got subject %q reply %q data %q", m.Subject, m.Reply, m.Data)
	}

	// The same with the reply in a buffer that is reused as soon as the call returns.
	reply := []byte("$JS.ACK.a.b.1.2.2.1.0@orders.new")
	if err := tb.link.PublishQueue(inbox, reply, "", nil, []byte("order 2")); err != nil {
		t.Fatalf("publish: %v", err)
	}
	copy(reply, "XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX")
	m, err = sub.NextMsg(waitTimeout)
	if err != nil {
		t.Fatalf("client receive: %v", err)
	}
	if m.Subject != "orders.new" || m.Reply != "$JS.ACK.a.b.1.2.2.1.0" || string(m.Data) != "order 2" {
		t.Fatalf("client got subject %q reply %q data %q", m.Subject, m.Reply, m.Data)
	}

	// Inline status messages reach the client untouched.
	status := []byte("NATS/1.0 404 No Messages\r\n\r\n")
	if err := tb.link.Publish(inbox, "", status, nil); err != nil {
		t.Fatalf("publish status: %v", err)
	}
	m, err = sub.NextMsg(waitTimeout)
	if err != nil {
		t.Fatalf("client receive status: %v", err)
	}
	if got := m.Header.Get("Status"); got != "404" || m.Header.Get("Description") != "No Messages" {
		t.Fatalf("status header %q, headers %v", got, m.Header)
	}
}

func TestClientPublishReachesLink(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	h, ch := chanHandler(4)
	if _, err := tb.link.Subscribe("orders.>", "", h); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	flushBoth(t, tb.nc, tb.link)

	msg := nats.NewMsg("orders.new")
	msg.Reply = "_INBOX.reply.1"
	msg.Header.Set("Nats-Msg-Id", "abc")
	msg.Data = []byte("payload")
	if err := tb.nc.PublishMsg(msg); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if err := tb.nc.Publish("orders.plain", []byte("no header")); err != nil {
		t.Fatalf("publish: %v", err)
	}

	m := recv(t, ch)
	if m.Subject != "orders.new" || m.Reply != "_INBOX.reply.1" || string(m.Data) != "payload" {
		t.Fatalf("link got subject %q reply %q data %q", m.Subject, m.Reply, m.Data)
	}
	if !bytes.HasPrefix(m.Header, []byte("NATS/1.0\r\n")) || !bytes.Contains(m.Header, []byte("Nats-Msg-Id: abc\r\n")) || !bytes.HasSuffix(m.Header, []byte("\r\n\r\n")) {
		t.Fatalf("header block %q", m.Header)
	}
	m = recv(t, ch)
	if m.Subject != "orders.plain" || m.Reply != "" || m.Header != nil || string(m.Data) != "no header" {
		t.Fatalf("link got %+v", m)
	}

	st := tb.link.Stats()
	if st.InMsgs != 2 || st.Dropped != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestMessagesAreOwnedByHandler(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	h, ch := chanHandler(100)
	if _, err := tb.link.Subscribe("own.*", "", h); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	flushBoth(t, tb.nc, tb.link)
	for i := range 100 {
		if err := tb.nc.Publish(fmt.Sprintf("own.%d", i), []byte(strings.Repeat(string(rune('a'+i%26)), 100))); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	// Read them all only after they arrived: reused buffers would show.
	var kept []*leaf.Msg
	for range 100 {
		kept = append(kept, recv(t, ch))
	}
	for i, m := range kept {
		want := strings.Repeat(string(rune('a'+i%26)), 100)
		if m.Subject != fmt.Sprintf("own.%d", i) || string(m.Data) != want {
			t.Fatalf("message %d changed: %q %q", i, m.Subject, m.Data)
		}
	}
}

// A borrowed subscription's handler sees each message whole, headers and reply included,
// for as long as it runs.
func TestBorrowedMessages(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	type seen struct{ subject, reply, header, data string }
	ch := make(chan seen, 100)
	if _, err := tb.link.SubscribeBorrowed("view.*", "", func(m *leaf.Msg) {
		ch <- seen{strings.Clone(m.Subject), strings.Clone(m.Reply), string(m.Header), string(m.Data)}
	}); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	flushBoth(t, tb.nc, tb.link)
	for i := range 100 {
		m := nats.NewMsg(fmt.Sprintf("view.%d", i))
		m.Reply = fmt.Sprintf("re.%d", i)
		m.Data = []byte(strings.Repeat(string(rune('a'+i%26)), i))
		if i%2 == 0 {
			m.Header.Set("N", fmt.Sprint(i))
		}
		if err := tb.nc.PublishMsg(m); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	for i := range 100 {
		var got seen
		select {
		case got = <-ch:
		case <-time.After(waitTimeout):
			t.Fatalf("message %d not delivered", i)
		}
		want := seen{fmt.Sprintf("view.%d", i), fmt.Sprintf("re.%d", i), "", strings.Repeat(string(rune('a'+i%26)), i)}
		if i%2 == 0 {
			want.header = fmt.Sprintf("NATS/1.0\r\nN: %d\r\n\r\n", i)
		}
		if got != want {
			t.Fatalf("message %d: got %+v, want %+v", i, got, want)
		}
	}
}

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

func TestRequestReply(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	link := tb.link

	// The client asks, the link answers.
	_, err := link.Subscribe("svc.echo", "", func(m *leaf.Msg) {
		if err := link.Publish(m.Reply, "", nil, append([]byte("echo:"), m.Data...)); err != nil {
			t.Errorf("reply: %v", err)
		}
	})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	flushBoth(t, tb.nc, link)
	for i := range 20 {
		resp, err := tb.nc.Request("svc.echo", []byte(fmt.Sprint(i)), waitTimeout)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if want := fmt.Sprintf("echo:%d", i); string(resp.Data) != want {
			t.Fatalf("response %q, want %q", resp.Data, want)
		}
	}

	// The link asks, the client answers.
	if _, err := tb.nc.Subscribe("svc.client", func(m *nats.Msg) { m.Respond([]byte("hi " + string(m.Data))) }); err != nil {
		t.Fatalf("client subscribe: %v", err)
	}
	h, replies := chanHandler(1)
	if _, err := link.Subscribe("_LINK_INBOX.1", "", h); err != nil {
		t.Fatalf("subscribe inbox: %v", err)
	}
	flushBoth(t, tb.nc, link)
	if err := link.Publish("svc.client", "_LINK_INBOX.1", nil, []byte("link")); err != nil {
		t.Fatalf("publish request: %v", err)
	}
	if m := recv(t, replies); string(m.Data) != "hi link" {
		t.Fatalf("reply %q", m.Data)
	}
}

func TestJetStreamAPIReachesLink(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	link := tb.link
	// JetStream is off in the server, yet $JS.API must flow to the link.
	_, err := link.Subscribe("$JS.API.>", "", func(m *leaf.Msg) {
		_ = link.Publish(m.Reply, "", nil, []byte(`{"type":"io.nats.jetstream.api.v1.account_info_response"}`))
	})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	flushBoth(t, tb.nc, link)
	resp, err := tb.nc.Request("$JS.API.INFO", nil, waitTimeout)
	if err != nil {
		t.Fatalf("request $JS.API.INFO: %v", err)
	}
	if !strings.Contains(string(resp.Data), "account_info_response") {
		t.Fatalf("response %q", resp.Data)
	}
}

func TestDialRefusals(t *testing.T) {
	t.Parallel()
	srv := startServer(t, nil)

	ep := srv.Leaf()
	ep.Password = "wrong"
	if _, err := dialErr(t, ep, nil); !errors.Is(err, leaf.ErrAuthorization) {
		t.Fatalf("wrong password: err %v, want ErrAuthorization", err)
	}
	ep = srv.Leaf()
	ep.User = ""
	ep.Password = ""
	if _, err := dialErr(t, ep, nil); !errors.Is(err, leaf.ErrAuthorization) {
		t.Fatalf("no credentials: err %v, want ErrAuthorization", err)
	}

	ep = srv.Leaf()
	ep.Addr = strings.TrimPrefix(srv.ClientURL(), "nats://")
	if _, err := dialErr(t, ep, nil); !errors.Is(err, leaf.ErrNotLeafPort) {
		t.Fatalf("client port: err %v, want ErrNotLeafPort", err)
	}

	if _, err := leaf.Dial(context.Background(), leaf.Config{}); err == nil {
		t.Fatal("Dial without Addr succeeded")
	}
}

func TestDialHonoursContext(t *testing.T) {
	t.Parallel()
	srv := startServer(t, nil)
	p := newProxy(t, srv.Leaf().Addr)
	p.hold(false, true) // the INFO never arrives
	ep := srv.Leaf()
	ep.Addr = p.addr()

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	began := time.Now()
	_, err := leaf.Dial(ctx, leaf.Config{Addr: ep.Addr, User: ep.User, Password: ep.Password, Logger: slog.New(slog.DiscardHandler)})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want DeadlineExceeded", err)
	}
	// Without the context the handshake would wait DialTimeoutDefault (10 s); half of that
	// tells the two apart however loaded the machine.
	if d := time.Since(began); d > leaf.DialTimeoutDefault/2 {
		t.Fatalf("Dial took %s past its deadline", d)
	}
}

func TestPublishLimits(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	big := make([]byte, tb.srv.MaxPayload()+1)
	if err := tb.link.Publish("big", "", nil, big); !errors.Is(err, leaf.ErrMaxPayload) {
		t.Fatalf("oversized publish: err %v, want ErrMaxPayload", err)
	}
	for _, subj := range []string{"", "a b", "a\r\nPING"} {
		if err := tb.link.Publish(subj, "", nil, nil); !errors.Is(err, leaf.ErrBadSubject) {
			t.Errorf("publish to %q: err %v, want ErrBadSubject", subj, err)
		}
	}
	if err := tb.link.Publish("ok", "bad reply", nil, nil); !errors.Is(err, leaf.ErrBadSubject) {
		t.Errorf("bad reply: err %v, want ErrBadSubject", err)
	}
	for _, subj := range []string{"", "a..b", "a.>.b", ".a", "a b"} {
		if _, err := tb.link.Subscribe(subj, "", func(*leaf.Msg) {}); !errors.Is(err, leaf.ErrBadSubject) {
			t.Errorf("subscribe %q: err %v, want ErrBadSubject", subj, err)
		}
	}
	// The link is still healthy after all this.
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := tb.link.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
}

func TestConcurrentPublishers(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	const publishers, each = 8, 500
	var got atomic.Int64
	sub, err := tb.nc.Subscribe("load.*", func(*nats.Msg) { got.Add(1) })
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatalf("pending limits: %v", err)
	}
	flushBoth(t, tb.nc, tb.link)

	var wg sync.WaitGroup
	for p := range publishers {
		wg.Go(func() {
			subject := fmt.Sprintf("load.%d", p)
			for range each {
				if err := tb.link.Publish(subject, "", nil, []byte("0123456789")); err != nil {
					t.Errorf("publish: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := tb.link.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	testwait.For(t, waitTimeout, func() error {
		if n := got.Load(); n != publishers*each {
			return fmt.Errorf("%d messages at the client, want %d", n, publishers*each)
		}
		return nil
	})
	if st := tb.link.Stats(); st.OutMsgs != publishers*each || st.OutBytes != publishers*each*10 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCloseDeliversQueuedMessages(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	const n = 20000
	var got atomic.Int64
	sub, err := tb.nc.Subscribe("drain", func(*nats.Msg) { got.Add(1) })
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatalf("pending limits: %v", err)
	}
	flushBoth(t, tb.nc, tb.link)
	for range n {
		if err := tb.link.Publish("drain", "", nil, []byte("x")); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	if err := tb.link.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := tb.link.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	testwait.For(t, waitTimeout, func() error {
		if g := got.Load(); g != n {
			return fmt.Errorf("%d of %d queued messages delivered after Close", g, n)
		}
		return nil
	})

	if !errors.Is(tb.link.Err(), leaf.ErrClosed) {
		t.Fatalf("Err() after Close = %v", tb.link.Err())
	}
	if err := tb.link.Publish("drain", "", nil, nil); !errors.Is(err, leaf.ErrClosed) {
		t.Fatalf("publish after Close: %v", err)
	}
	if _, err := tb.link.Subscribe("x", "", func(*leaf.Msg) {}); !errors.Is(err, leaf.ErrClosed) {
		t.Fatalf("subscribe after Close: %v", err)
	}
	if err := tb.link.Flush(context.Background()); !errors.Is(err, leaf.ErrClosed) {
		t.Fatalf("flush after Close: %v", err)
	}
}

func TestServerShutdownEndsLink(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	if err := tb.link.Err(); err != nil {
		t.Fatalf("Err() on a live link = %v", err)
	}
	tb.srv.Stop()
	select {
	case <-tb.link.Done():
	case <-time.After(waitTimeout):
		t.Fatal("link did not notice the server going away")
	}
	if err := tb.link.Err(); err == nil || errors.Is(err, leaf.ErrClosed) {
		t.Fatalf("Err() = %v, want the failure", err)
	}
	if err := tb.link.Publish("x", "", nil, nil); !errors.Is(err, leaf.ErrClosed) {
		t.Fatalf("publish on a lost link: %v", err)
	}
}

func TestStaleConnection(t *testing.T) {
	t.Parallel()
	srv := startServer(t, nil)
	p := newProxy(t, srv.Leaf().Addr)
	ep := srv.Leaf()
	ep.Addr = p.addr()
	link := dial(t, ep, func(c *leaf.Config) { c.PingInterval = 20 * time.Millisecond })
	p.hold(true, true)
	select {
	case <-link.Done():
	case <-time.After(waitTimeout):
		t.Fatal("link did not notice the silent server")
	}
	if err := link.Err(); !errors.Is(err, leaf.ErrStaleConnection) {
		t.Fatalf("Err() = %v, want ErrStaleConnection", err)
	}
}

func TestSlowConsumerBoundsBuffer(t *testing.T) {
	t.Parallel()
	srv := startServer(t, nil)
	p := newProxy(t, srv.Leaf().Addr)
	ep := srv.Leaf()
	ep.Addr = p.addr()
	const limit = 1 << 20
	link := dial(t, ep, func(c *leaf.Config) { c.WriteBufferBytes = limit })
	p.hold(true, false) // the server stops reading what the link writes

	data := make([]byte, 32<<10)
	var refused int
	for i := 0; i < 4096 && refused == 0; i++ {
		err := link.Publish("slow", "", nil, data)
		switch {
		case errors.Is(err, leaf.ErrSlowConsumer):
			refused++
		case err != nil:
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	if refused == 0 {
		t.Fatal("128 MiB queued without ErrSlowConsumer")
	}
	if st := link.Stats(); st.SlowConsumer != 1 {
		t.Fatalf("stats %+v, want one slow-consumer rejection", st)
	}
}

func TestCredentialsStayOutOfLogs(t *testing.T) {
	t.Parallel()
	logs := &syncbuf.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv := startServer(t, logger)
	ep := srv.Leaf()
	link := dial(t, ep, func(c *leaf.Config) { c.Logger = logger })
	logger.Info("configs", "leaf", ep, "link", leaf.Config{Addr: ep.Addr, User: ep.User, Password: ep.Password})
	bad := ep
	bad.Password = "definitely-wrong-password"
	if _, err := dialErr(t, bad, func(c *leaf.Config) { c.Logger = logger }); err == nil {
		t.Fatal("wrong password accepted")
	}
	link.Close()
	srv.Stop()
	out := logs.String()
	if strings.Contains(out, ep.Password) || strings.Contains(out, bad.Password) {
		t.Fatalf("a leaf password reached the log:\n%s", out)
	}
	for _, format := range []string{"%v", "%+v", "%#v", "%s"} {
		if got := fmt.Sprintf(format, leaf.Config{Password: ep.Password}); strings.Contains(got, ep.Password) {
			t.Fatalf("Config formats its password with %s: %s", format, got)
		}
		if got := fmt.Sprintf(format, ep); strings.Contains(got, ep.Password) {
			t.Fatalf("LeafEndpoint formats its password with %s: %s", format, got)
		}
	}
}

func BenchmarkPublish(b *testing.B) {
	srv, err := natsd.Start(context.Background(), natsd.Config{Port: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Stop()
	ep := srv.Leaf()
	link, err := leaf.Dial(context.Background(), leaf.Config{Addr: ep.Addr, User: ep.User, Password: ep.Password, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer link.Close()
	data := []byte(strings.Repeat("x", 128))
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		for {
			err := link.Publish("bench.nobody", "", nil, data)
			if err == nil {
				break
			}
			if !errors.Is(err, leaf.ErrSlowConsumer) {
				b.Fatal(err)
			}
			if err := link.Flush(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := link.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
}
