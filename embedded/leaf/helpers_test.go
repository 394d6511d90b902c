package leaf_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/embedded/natsd"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const waitTimeout = 5 * time.Second

// linkFixture is a running server, a link attached to it and a nats.go client of it.
type linkFixture struct {
	srv  *natsd.Server
	link *leaf.Conn
	nc   *nats.Conn
}

// setup starts a server, attaches a link and connects a nats.go client.
func setup(t *testing.T) *linkFixture {
	t.Helper()
	srv := startServer(t, nil)
	return &linkFixture{srv: srv, link: dial(t, srv.Leaf(), nil), nc: connect(t, srv)}
}

func startServer(t testing.TB, logger *slog.Logger) *natsd.Server {
	t.Helper()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	srv, err := natsd.Start(ctx, natsd.Config{Port: -1, Logger: logger})
	if err != nil {
		t.Fatalf("start server: %v", err)
	}
	t.Cleanup(srv.Stop)
	return srv
}

// dial attaches a link to the endpoint; adjust may change the config first.
func dial(t testing.TB, ep natsd.LeafEndpoint, adjust func(*leaf.Config)) *leaf.Conn {
	t.Helper()
	c, err := dialErr(t, ep, adjust)
	if err != nil {
		t.Fatalf("dial leaf: %v", err)
	}
	return c
}

func dialErr(t testing.TB, ep natsd.LeafEndpoint, adjust func(*leaf.Config)) (*leaf.Conn, error) {
	t.Helper()
	cfg := leaf.Config{
		Addr:     ep.Addr,
		User:     ep.User,
		Password: ep.Password,
		Logger:   slog.New(slog.DiscardHandler),
	}
	if adjust != nil {
		adjust(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	c, err := leaf.Dial(ctx, cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	return c, nil
}

func connect(t testing.TB, srv *natsd.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatalf("connect client: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// flushBoth makes sure the server has processed everything the client sent
// and the link has received everything the server sent it before.
func flushBoth(t testing.TB, nc *nats.Conn, link *leaf.Conn) {
	t.Helper()
	if err := nc.Flush(); err != nil {
		t.Fatalf("client flush: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := link.Flush(ctx); err != nil {
		t.Fatalf("link flush: %v", err)
	}
}

// recv waits for the next message on ch.
func recv(t *testing.T, ch <-chan *leaf.Msg) *leaf.Msg {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(waitTimeout):
		t.Fatal("no message on the link")
		return nil
	}
}

// chanHandler sends every message into a buffered channel.
func chanHandler(n int) (leaf.Handler, chan *leaf.Msg) {
	ch := make(chan *leaf.Msg, n)
	return func(m *leaf.Msg) { ch <- m }, ch
}

// proxy relays one TCP connection and can hold either direction, to play
// a server or a network that stops reading.
type proxy struct {
	ln       net.Listener
	target   string
	mu       sync.Mutex
	holdUp   chan struct{} // closed = flowing; link -> server
	holdDown chan struct{} // server -> link
	conns    []net.Conn
	wg       sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &proxy{ln: ln, target: target, holdUp: make(chan struct{}), holdDown: make(chan struct{})}
	close(p.holdUp)
	close(p.holdDown)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			down.Close()
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, down, up)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(up, down, func() chan struct{} { return p.gate(true) })
		go p.pipe(down, up, func() chan struct{} { return p.gate(false) })
	}
}

func (p *proxy) gate(up bool) chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if up {
		return p.holdUp
	}
	return p.holdDown
}

// pipe copies src to dst, waiting at its gate before every read.
func (p *proxy) pipe(dst, src net.Conn, gate func() chan struct{}) {
	defer p.wg.Done()
	buf := make([]byte, 32*1024)
	for {
		<-gate()
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			dst.Close()
			return
		}
	}
}

// hold stops relaying in the given directions (from the next read on).
func (p *proxy) hold(up, down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if up {
		p.holdUp = make(chan struct{})
	}
	if down {
		p.holdDown = make(chan struct{})
	}
}

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, ch := range []chan struct{}{p.holdUp, p.holdDown} {
		select {
		case <-ch:
		default:
			close(ch)
		}
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
