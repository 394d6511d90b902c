package leaf_test

// Tests of messages crossing a link both ways: ack replies rewritten for clients, headers,
// ownership of what a handler is given, requests and replies, the JetStream API subjects,
// publish limits and concurrent publishers.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
