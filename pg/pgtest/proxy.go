package pgtest

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// Cut is what an armed Proxy does to the pipeline that carries the statement it waits for.
type Cut int

const (
	// CutAnswer lets the pipeline reach the server and run there to its end (its Sync, or
	// the simple query itself), keeps the server's answer from the client, and closes the
	// connection: the server has committed, or refused, and the client cannot know which.
	CutAnswer Cut = iota
	// CutRequest keeps the pipeline from the server and closes the client's side only: the
	// server's session stays open, idle, as a network partition leaves it, and whatever
	// transaction it had open stays open with its locks until that session ends.
	CutRequest
	// CutAll is CutAnswer, after which the database is away, as during a failover: the proxy
	// closes every connection it holds and refuses new ones until Restore.
	CutAll
)

// Proxy stands between a test's clients and its database and reads the protocol both
// ways, so that a test can break one connection at the moment the outcome of its commit
// becomes unknown to the client. Until Arm it forwards everything as it is.
type Proxy struct {
	ln      net.Listener
	network string
	target  string
	url     string

	mu    sync.Mutex
	armed *armedCut
	conns []net.Conn
	away  bool // CutAll fired and Restore has not come
	wg    sync.WaitGroup
}

type armedCut struct {
	how   Cut
	match func(sql string) bool
	done  chan struct{}
	once  sync.Once
}

func (a *armedCut) finish() { a.once.Do(func() { close(a.done) }) }

// NewProxy starts a proxy to the database at url (from NewDB); URL is how to reach the
// database through it. It stops, closing every connection it holds, when t ends.
func NewProxy(t testing.TB, url string) *Proxy {
	t.Helper()
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatalf("pgtest: proxy: parsing the database URL: %v", err)
	}
	network, target := "tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	if strings.HasPrefix(cfg.Host, "/") {
		network, target = "unix", fmt.Sprintf("%s/.s.PGSQL.%d", cfg.Host, cfg.Port)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgtest: proxy: %v", err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	p := &Proxy{ln: ln, network: network, target: target,
		url: WithParam(t, WithParam(t, WithParam(t, url, "host", "127.0.0.1"), "port", port), "sslmode", "disable")}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// URL is the connection string of the database through the proxy.
func (p *Proxy) URL() string { return p.url }

// Addr is the proxy's address, host:port, for a connection string of several hosts.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Arm makes the proxy cut, as how says, the first pipeline (or simple query) after now
// that runs a statement whose text match accepts. The channel it returns is closed once
// the client's side of that connection is closed. One cut is armed at a time.
func (p *Proxy) Arm(how Cut, match func(sql string) bool) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = &armedCut{how: how, match: match, done: make(chan struct{})}
	return p.armed.done
}

// take hands the armed cut to the first connection whose statement it matches.
func (p *Proxy) take(sql string) *armedCut {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.armed
	if a == nil || !a.match(sql) {
		return nil
	}
	p.armed = nil
	return a
}

// Restore lets connections through again after CutAll.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.away = false
}

// track keeps c to close when the proxy stops, or closes it now if the database is away.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.away {
		_ = c.Close()
		return false
	}
	p.conns = append(p.conns, c)
	return true
}

// closeAll closes every connection, and keeps new ones out while away.
func (p *Proxy) closeAll(away bool) {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.away = away
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

func (p *Proxy) close() {
	_ = p.ln.Close()
	p.closeAll(false)
	p.wg.Wait()
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.track(c) {
			p.wg.Go(func() { p.serve(c) })
		}
	}
}

// Codes of the messages a client may open a connection with, in place of a startup.
const (
	sslRequest    = 80877103
	gssEncRequest = 80877104
	cancelRequest = 80877102
)

func (p *Proxy) serve(client net.Conn) {
	server, err := net.Dial(p.network, p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	if !p.track(server) {
		_ = client.Close()
		return
	}
	c := &proxyConn{p: p, client: client, server: server, in: bufio.NewReader(client), stmts: make(map[string]string)}
	if !c.start() {
		_ = client.Close()
		_ = server.Close()
		return
	}
	p.wg.Go(c.down)
	c.up()
}

// start forwards the message that opens the connection and reports whether a session
// follows, rather than a cancel request or a failure.
func (c *proxyConn) start() bool {
	for {
		msg, err := readUntyped(c.in)
		if err != nil {
			return false
		}
		switch binary.BigEndian.Uint32(msg[4:8]) {
		case sslRequest, gssEncRequest:
			// Encryption would hide the protocol from the proxy: refuse it, as a server
			// without TLS does, and the client goes on in the clear.
			if _, err := c.client.Write([]byte{'N'}); err != nil {
				return false
			}
			continue
		case cancelRequest:
			if _, err := c.server.Write(msg); err == nil {
				_, _ = io.Copy(io.Discard, c.server)
			}
			return false
		}
		_, err = c.server.Write(msg)
		return err == nil
	}
}

// proxyConn is one client connection and its server connection.
type proxyConn struct {
	p              *Proxy
	client, server net.Conn
	in             *bufio.Reader

	stmts map[string]string // prepared statement name → text, "" for the unnamed one
	bound string            // the text of the statement last bound

	mu  sync.Mutex
	cut *armedCut // set once the pipeline it cuts has gone to the server
}

// up forwards the client's messages. It holds the messages of the extended protocol until
// the Sync or Flush that sends them on, so that a cut can keep a pipeline whole from the
// server.
func (c *proxyConn) up() {
	var pending []byte
	var fire *armedCut
	for {
		typ, msg, err := readTyped(c.in)
		if err != nil {
			_ = c.server.Close()
			return
		}
		body := msg[5:]
		switch typ {
		case 'P':
			name, rest := cstring(body)
			query, _ := cstring(rest)
			c.stmts[name] = query
		case 'B':
			_, rest := cstring(body)
			stmt, _ := cstring(rest)
			c.bound = c.stmts[stmt]
		case 'E':
			if fire == nil {
				fire = c.p.take(c.bound)
			}
		case 'Q':
			query, _ := cstring(body)
			if fire == nil {
				fire = c.p.take(query)
			}
		}
		pending = append(pending, msg...)
		if strings.IndexByte("PBDEC", typ) >= 0 {
			continue
		}
		if fire != nil && (typ == 'S' || typ == 'Q') {
			c.cutOff(fire, pending)
			return
		}
		if _, err := c.server.Write(pending); err != nil {
			_ = c.client.Close()
			return
		}
		pending = pending[:0]
	}
}

// cutOff ends the connection at the pipeline a cut fired on. The server's side is left to
// down, or, for CutRequest, open until the proxy stops.
func (c *proxyConn) cutOff(a *armedCut, pipeline []byte) {
	if a.how == CutRequest {
		_ = c.client.Close()
		a.finish()
		return
	}
	c.mu.Lock()
	c.cut = a
	c.mu.Unlock()
	if _, err := c.server.Write(pipeline); err != nil {
		_ = c.client.Close()
		a.finish()
	}
}

// down forwards the server's messages until a cut's pipeline has gone to the server; from
// then on it forwards nothing, and closes both sides once the server is ready for the next
// query, that is, once it has run the whole pipeline.
func (c *proxyConn) down() {
	in := bufio.NewReader(c.server)
	out := bufio.NewWriter(c.client)
	for {
		typ, msg, err := readTyped(in)
		c.mu.Lock()
		cut := c.cut
		c.mu.Unlock()
		if err != nil || cut != nil && typ == 'Z' {
			if err != nil && cut == nil {
				_ = out.Flush()
			}
			_ = c.client.Close()
			if cut != nil {
				_ = c.server.Close()
				if cut.how == CutAll {
					c.p.closeAll(true)
				}
				cut.finish()
			}
			return
		}
		if cut != nil {
			continue
		}
		if _, err := out.Write(msg); err != nil {
			return
		}
		if in.Buffered() == 0 {
			if err := out.Flush(); err != nil {
				return
			}
		}
	}
}

// readUntyped reads a message of the connection's start, which has no type byte.
func readUntyped(r *bufio.Reader) ([]byte, error) {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(head[:])
	if n < 8 || n > 1<<20 {
		return nil, fmt.Errorf("pgtest: proxy: start message of %d bytes", n)
	}
	msg := make([]byte, n)
	copy(msg, head[:])
	_, err := io.ReadFull(r, msg[4:])
	return msg, err
}

// readTyped reads one message: its type and the whole message as it came.
func readTyped(r *bufio.Reader) (byte, []byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(head[1:])
	if n < 4 {
		return 0, nil, fmt.Errorf("pgtest: proxy: message %q of length %d", head[0], n)
	}
	msg := make([]byte, 1+n)
	copy(msg, head[:])
	_, err := io.ReadFull(r, msg[5:])
	return head[0], msg, err
}

// cstring splits a NUL-terminated string off b.
func cstring(b []byte) (string, []byte) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return string(b), nil
	}
	return string(b[:i]), b[i+1:]
}
