package leaf_test

// Tests of a link's life: dialing (refused, or cut short by its context), closing, losing the
// server, a silent or slow server, and credentials kept out of logs.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/syncbuf"
	"github.com/jetgres/jetgres/internal/testwait"

	"github.com/nats-io/nats.go"

	"github.com/jetgres/jetgres/embedded/leaf"
)

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
