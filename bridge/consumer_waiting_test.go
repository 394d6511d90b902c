package bridge

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// pullRaw sends one MSG.NEXT request with req as its body to a fresh inbox and returns the
// subscription the answers arrive on.
func pullRaw(t *testing.T, nc *nats.Conn, stream, consumer string, req server.JSApiConsumerGetNextRequest) *nats.Subscription {
	t.Helper()
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT."+stream+"."+consumer, inbox, body); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return sub
}

// nextStatus waits for the next message on sub and returns its status line, "" for a
// message with data.
func nextStatus(t *testing.T, sub *nats.Subscription, wait time.Duration) string {
	t.Helper()
	m, err := sub.NextMsg(wait)
	if err != nil {
		t.Fatalf("no answer on %s: %v", sub.Subject, err)
	}
	return statusLine(m)
}

// statusLine is a pull answer's status line, "" for a message with data.
func statusLine(m *nats.Msg) string {
	if len(m.Data) > 0 {
		return ""
	}
	return m.Header.Get("Status") + " " + m.Header.Get("Description")
}

// TestNoWaitRequestsPending checks what nats-server's processNextMsgRequest does with a
// no-wait request: 404 when nothing is pending, 408 Requests Pending when the requests
// already waiting want more than is pending, and otherwise a one-shot batch.
func TestNoWaitRequestsPending(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "NW", "nw")
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", MaxAckPending: 2})
	if err != nil {
		t.Fatal(err)
	}

	sub := pullRaw(t, tb.nc, "NW", "C", server.JSApiConsumerGetNextRequest{Batch: 1, NoWait: true})
	if got := nextStatus(t, sub, 5*time.Second); got != "404 No Messages" {
		t.Fatalf("no-wait on an empty consumer: %q", got)
	}

	publishN(t, ctx, tb.js, "nw", 5)
	// Two deliveries reach max_ack_pending; they stay unacked for now.
	var held []jetstream.Msg
	if got := fetchSeqs(t, c, 2, 2*time.Second, func(m jetstream.Msg) { held = append(held, m) }); len(got) != 2 {
		t.Fatalf("first fetch got %v", got)
	}
	// A request for 10 now waits behind max_ack_pending with 3 messages pending.
	waiter := pullRaw(t, tb.nc, "NW", "C", server.JSApiConsumerGetNextRequest{Batch: 10, Expires: 20 * time.Second})
	testwait.For(t, 5*time.Second, func() error {
		info, err := c.Info(ctx)
		if err != nil || info.NumWaiting != 1 || info.NumPending != 3 {
			return fmt.Errorf("info %+v, %v", info, err)
		}
		return nil
	})
	sub = pullRaw(t, tb.nc, "NW", "C", server.JSApiConsumerGetNextRequest{Batch: 1, NoWait: true})
	if got := nextStatus(t, sub, 5*time.Second); got != "408 Requests Pending" {
		t.Fatalf("no-wait behind a larger waiting request: %q", got)
	}

	// With the waiter gone and the two acked, the 3 pending serve a no-wait request for 2
	// (max_ack_pending) in one shot.
	if err := waiter.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := tb.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, func() error {
		if tb.link.HasInterest(waiter.Subject) {
			return fmt.Errorf("the link still sees %s", waiter.Subject)
		}
		return nil
	})
	for _, m := range held {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	b, err := c.FetchNoWait(2)
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for m := range b.Messages() {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, md.Sequence.Stream)
	}
	if err := b.Error(); err != nil || !slices.Equal(got, []uint64{3, 4}) {
		t.Fatalf("no-wait fetch of 2 got %v, %v", got, err)
	}
}

// TestGoneInboxGetsNothing checks that a waiting request whose client unsubscribed its
// inbox takes no message: the message stays undelivered for the next request.
func TestGoneInboxGetsNothing(t *testing.T) {
	t.Parallel()
	tb := setup(t, setupOpts{config: func(c *Config) { c.TickPeriod = time.Hour }})
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "GI", "gi")
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C"})
	if err != nil {
		t.Fatal(err)
	}
	sub := pullRaw(t, tb.nc, "GI", "C", server.JSApiConsumerGetNextRequest{Batch: 10, Expires: 30 * time.Second})
	testwait.For(t, 5*time.Second, func() error {
		info, err := c.Info(ctx)
		if err != nil || info.NumWaiting != 1 {
			return fmt.Errorf("info %+v, %v", info, err)
		}
		return nil
	})
	if err := sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := tb.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, func() error {
		if tb.link.HasInterest(sub.Subject) {
			return fmt.Errorf("the link still sees %s", sub.Subject)
		}
		return nil
	})
	// Well inside the request's first second, where a grace period would still count it.
	publishN(t, ctx, tb.js, "gi", 1)
	testwait.For(t, 5*time.Second, func() error {
		info, err := c.Info(ctx)
		if err != nil || info.NumWaiting != 0 || info.NumPending != 1 || info.Delivered.Stream != 0 {
			return fmt.Errorf("info %+v, %v", info, err)
		}
		return nil
	})
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m, ok := <-batch.Messages()
	if !ok {
		t.Fatalf("no message: %v", batch.Error())
	}
	md, err := m.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	if md.NumDelivered != 1 || md.Sequence.Consumer != 1 {
		t.Fatalf("the message was delivered before: %+v", md)
	}
}
