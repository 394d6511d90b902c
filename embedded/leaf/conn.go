package leaf

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

const (
	// PingIntervalDefault is how often the link checks the server is alive.
	PingIntervalDefault = 20 * time.Second
	// WriteBufferBytesDefault bounds the bytes waiting to be written.
	WriteBufferBytesDefault = 32 * 1024 * 1024
	// NameDefault is how the link introduces itself to the server.
	NameDefault = "jetgres-leaf"
	// DialTimeoutDefault bounds the TCP connect, and the handshake when
	// Dial's context has no deadline.
	DialTimeoutDefault = 10 * time.Second

	// maxPingsOut PINGs without a PONG mean the server is gone.
	maxPingsOut = 2
	// writeTimeout bounds one socket write; a server that accepts nothing
	// for this long is treated as lost.
	writeTimeout = 10 * time.Second
	// closeDrainTimeout bounds how long Close waits for the server to
	// confirm it has processed what was queued.
	closeDrainTimeout = 2 * time.Second
	readBufferMin     = 32 * 1024
	readBufferMax     = 512 * 1024
)

// Errors returned by the link. Errors that wrap them add what failed.
var (
	// ErrClosed: the link was closed with Close, or is lost (see Err).
	ErrClosed = errors.New("leaf: link closed")
	// ErrSlowConsumer: the outbound buffer is full; the publish was not
	// queued. The server or the network is not keeping up.
	ErrSlowConsumer = errors.New("leaf: outbound buffer full")
	// ErrMaxPayload: headers plus data exceed the server's max_payload.
	ErrMaxPayload = errors.New("leaf: message exceeds the server's max payload")
	// ErrBadSubject: a subject or queue name the server would reject.
	ErrBadSubject = errors.New("leaf: invalid subject")
	// ErrStaleConnection: the server stopped answering PINGs.
	ErrStaleConnection = errors.New("leaf: stale connection, no PONG from server")
	// ErrAuthorization: the server refused the credentials.
	ErrAuthorization = errors.New("leaf: authorization violation")
	// ErrNotLeafPort: the address is not a leafnode listener.
	ErrNotLeafPort = errors.New("leaf: not a leafnode port")
)

// Config configures a link.
type Config struct {
	// Addr is the server's leafnode listener, host:port. Required.
	Addr string
	// User and Password authenticate the link. Defaults to none.
	User     string
	Password string
	// Name shows up in the server's monitoring. Defaults to NameDefault.
	Name string
	// Logger receives the link's own log lines.
	// Defaults to slog.Default().
	Logger *slog.Logger
	// PingInterval is how often the link PINGs the server; after two
	// unanswered PINGs it gives up with ErrStaleConnection.
	// Defaults to PingIntervalDefault (20 s).
	PingInterval time.Duration
	// WriteBufferBytes bounds the bytes queued for the server, including
	// those being written. A publish that would exceed it fails with
	// ErrSlowConsumer instead; one message is always accepted into an
	// empty buffer. The writer keeps its last buffer of up to this size for
	// the next burst. Defaults to WriteBufferBytesDefault (32 MiB).
	WriteBufferBytes int
}

// String implements fmt.Stringer without revealing the password.
func (cfg Config) String() string {
	return fmt.Sprintf("leaf.Config{Addr:%s User:%s Name:%s}", cfg.Addr, cfg.User, cfg.Name)
}

// GoString implements fmt.GoStringer (%#v) without revealing the password.
func (cfg Config) GoString() string { return cfg.String() }

// LogValue implements slog.LogValuer without revealing the password.
func (cfg Config) LogValue() slog.Value {
	return slog.GroupValue(slog.String("addr", cfg.Addr), slog.String("user", cfg.User), slog.String("name", cfg.Name))
}

func (cfg Config) withDefaults() (Config, error) {
	if cfg.Addr == "" {
		return cfg, errors.New("leaf: config: Addr is required")
	}
	if cfg.Name == "" {
		cfg.Name = NameDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.PingInterval < 0 {
		return cfg, fmt.Errorf("leaf: config: PingInterval %s is negative", cfg.PingInterval)
	}
	if cfg.PingInterval == 0 {
		cfg.PingInterval = PingIntervalDefault
	}
	if cfg.WriteBufferBytes < 0 {
		return cfg, fmt.Errorf("leaf: config: WriteBufferBytes %d is negative", cfg.WriteBufferBytes)
	}
	if cfg.WriteBufferBytes == 0 {
		cfg.WriteBufferBytes = WriteBufferBytesDefault
	}
	return cfg, nil
}

// LinkStats counts the link's traffic since Dial. Bytes are headers plus data.
type LinkStats struct {
	InMsgs   uint64
	InBytes  uint64
	OutMsgs  uint64
	OutBytes uint64
	// Dropped counts inbound messages no local subscription took, e.g.
	// because it was removed while the message was on its way.
	Dropped uint64
	// SlowConsumer counts publishes refused with ErrSlowConsumer.
	SlowConsumer uint64
}

// Conn is a leafnode link to a server. Its methods are safe for concurrent
// use.
type Conn struct {
	cfg Config
	nc  net.Conn
	log *slog.Logger

	// Owned by the read goroutine.
	parser  Parser
	gotInfo bool
	targets []*Subscription
	queued  []*Subscription
	rr      uint32
	view    Msg // what a borrowed subscription's handler gets

	connected  atomic.Bool // the handshake's PONG arrived
	maxPayload atomic.Int64
	interest   interest
	// interestCh receives, without blocking the read loop, after each LS+ or LS-.
	interestCh chan struct{}

	// subMu guards the local subscriptions; when both are held it is
	// taken before mu, so that LS+/LS- leave in the order of the changes.
	subMu     sync.RWMutex
	local     trie[subSet]
	localKeys map[string]int

	mu       sync.Mutex
	out      []byte // bytes waiting for the writer
	spare    []byte // the writer's previous buffer, for reuse
	inflight int    // bytes the writer is writing now
	pongs    []chan struct{}
	pingsOut int
	closing  bool
	closed   bool
	err      error

	wake chan struct{}
	done chan struct{}
	wg   sync.WaitGroup

	inMsgs, inBytes, outMsgs, outBytes, dropped, slow atomic.Uint64
}

// serverInfo is the part of INFO the link uses.
type serverInfo struct {
	ServerID      string   `json:"server_id"`
	CID           uint64   `json:"client_id"`
	MaxPayload    int64    `json:"max_payload"`
	Headers       bool     `json:"headers"`
	TLSRequired   bool     `json:"tls_required"`
	InfoOnConnect bool     `json:"info_on_connect"`
	LeafNodeURLs  []string `json:"leafnode_urls"`
	LameDuckMode  bool     `json:"ldm"`
}

// connectInfo is the leafnode CONNECT. It must not carry "lang": that is
// how the server tells a misdirected client from a leafnode.
type connectInfo struct {
	User     string `json:"user,omitempty"`
	Pass     string `json:"pass,omitempty"`
	Name     string `json:"name,omitempty"`
	Headers  bool   `json:"headers"`
	Protocol int    `json:"protocol"`
	Verbose  bool   `json:"verbose"`
	Pedantic bool   `json:"pedantic"`
}

// Dial connects to a leafnode listener and completes the handshake: it
// reads the server's INFO, sends CONNECT and PING, and returns once the
// PONG arrives, that is once the server has accepted the credentials and
// sent its current interest (HasInterest is up to date from the start).
// Cancelling ctx aborts the handshake; it has no effect on the link after
// Dial returns.
func Dial(ctx context.Context, cfg Config) (*Conn, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	d := net.Dialer{Timeout: DialTimeoutDefault}
	nc, err := d.DialContext(ctx, "tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("leaf: dial %s: %w", cfg.Addr, err)
	}
	c := &Conn{
		cfg:        cfg,
		nc:         nc,
		log:        cfg.Logger.With(slog.String("component", "leaf"), slog.String("name", cfg.Name)),
		localKeys:  make(map[string]int),
		wake:       make(chan struct{}, 1),
		interestCh: make(chan struct{}, 1),
		done:       make(chan struct{}),
	}
	c.maxPayload.Store(1 << 20)
	c.wg.Add(1)
	go c.writeLoop()

	buf, err := c.handshake(ctx)
	if err != nil {
		c.shutdown(err)
		c.wg.Wait()
		return nil, fmt.Errorf("leaf: connect %s: %w", cfg.Addr, err)
	}
	c.wg.Add(2)
	go c.readLoop(buf)
	go c.pingLoop()
	return c, nil
}

func (c *Conn) handshake(ctx context.Context) ([]byte, error) {
	deadline, fromCtx := ctx.Deadline()
	if !fromCtx {
		deadline = time.Now().Add(DialTimeoutDefault)
	}
	if err := c.nc.SetReadDeadline(deadline); err != nil {
		return nil, fmt.Errorf("set deadline: %w", err)
	}
	stop := context.AfterFunc(ctx, func() {
		_ = c.nc.SetReadDeadline(time.Unix(1, 0))
	})

	buf := make([]byte, readBufferMin)
	emit := c.handleOp
	var err error
	for !c.connected.Load() && err == nil {
		var n int
		n, err = c.nc.Read(buf)
		if n > 0 {
			if perr := c.parser.Parse(buf[:n], emit); perr != nil {
				err = perr
			}
		}
	}
	if !stop() {
		// The context ended; its deadline may have landed on the socket.
		return nil, fmt.Errorf("handshake: %w", ctx.Err())
	}
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, fmt.Errorf("handshake: %w", ctxErr)
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			// The socket deadline can beat the context's own timer.
			if fromCtx {
				return nil, fmt.Errorf("handshake: %w", context.DeadlineExceeded)
			}
			return nil, fmt.Errorf("handshake: no answer within %s", DialTimeoutDefault)
		}
		if errors.Is(err, io.EOF) {
			return nil, errors.New("handshake: server closed the connection")
		}
		return nil, err
	}
	if err := c.nc.SetReadDeadline(time.Time{}); err != nil {
		return nil, fmt.Errorf("clear deadline: %w", err)
	}
	return buf, nil
}

func (c *Conn) readLoop(buf []byte) {
	defer c.wg.Done()
	emit := c.handleOp
	for {
		n, err := c.nc.Read(buf)
		if n > 0 {
			if perr := c.parser.Parse(buf[:n], emit); perr != nil {
				c.shutdown(perr)
				return
			}
		}
		if err != nil {
			c.shutdown(c.readError(err))
			return
		}
		// A full read means the server has more queued: read more at once.
		if n == len(buf) && len(buf) < readBufferMax {
			buf = make([]byte, 2*len(buf))
		}
	}
}

func (c *Conn) readError(err error) error {
	if errors.Is(err, io.EOF) {
		return errors.New("leaf: server closed the connection")
	}
	return fmt.Errorf("leaf: read: %w", err)
}

// handleOp runs on the read goroutine for every operation from the server.
func (c *Conn) handleOp(op *Op) error {
	if !c.gotInfo && op.Kind != OpInfo && op.Kind != OpErr {
		return fmt.Errorf("%w: expected INFO first, got %s", ErrProtocol, op.Kind)
	}
	switch op.Kind {
	case OpMsg:
		c.deliver(op)
	case OpSub:
		if c.interest.add(op.Subject, op.Queue) {
			c.interestMoved()
		}
	case OpUnsub:
		if c.interest.remove(op.Subject, op.Queue) {
			c.interestMoved()
		}
	case OpPing:
		// Fails only once the link is down, when no answer is needed.
		_ = c.enqueueControl(pongFrame)
	case OpPong:
		c.gotPong()
	case OpInfo:
		return c.handleInfo(op.Arg)
	case OpErr:
		return c.handleErr(string(op.Arg))
	case OpOK:
	}
	return nil
}

var (
	pingFrame = []byte("PING\r\n")
	pongFrame = []byte("PONG\r\n")
)

func (c *Conn) handleInfo(arg []byte) error {
	var info serverInfo
	if err := json.Unmarshal(arg, &info); err != nil {
		return fmt.Errorf("%w: INFO: %v", ErrProtocol, err)
	}
	if info.MaxPayload > 0 {
		c.maxPayload.Store(info.MaxPayload)
	}
	if info.LameDuckMode {
		c.log.Warn("leaf: server entering lame duck mode")
	}
	if c.gotInfo {
		return nil
	}
	c.gotInfo = true
	// The server applies the same test to tell its leafnode port from
	// others.
	if info.CID == 0 || (!info.InfoOnConnect && len(info.LeafNodeURLs) == 0) {
		return ErrNotLeafPort
	}
	if info.TLSRequired {
		return errors.New("server requires TLS on its leafnode port, which this link does not speak")
	}
	if !info.Headers {
		return errors.New("server does not support headers")
	}
	connect, err := json.Marshal(connectInfo{
		User:     c.cfg.User,
		Pass:     c.cfg.Password,
		Name:     c.cfg.Name,
		Headers:  true,
		Protocol: 1,
	})
	if err != nil {
		return fmt.Errorf("encode CONNECT: %w", err)
	}
	frame := make([]byte, 0, len(connect)+16)
	frame = append(frame, "CONNECT "...)
	frame = append(frame, connect...)
	frame = append(frame, "\r\n"...)
	if err := c.enqueueControl(frame); err != nil {
		return err
	}
	// The PONG to this PING completes the handshake.
	if err := c.ping(nil); err != nil {
		return err
	}
	c.log.Debug("leaf: server info", slog.String("server_id", info.ServerID), slog.Int64("max_payload", info.MaxPayload))
	return nil
}

// nonFatal lists -ERR texts after which the server keeps the connection.
var nonFatal = []string{
	"permissions violation",
	"invalid subject",
	"invalid subscription",
	"maximum subscriptions exceeded",
}

func (c *Conn) handleErr(text string) error {
	lower := strings.ToLower(text)
	for _, p := range nonFatal {
		if strings.HasPrefix(lower, p) {
			c.log.Warn("leaf: server reported an error", slog.String("err", text))
			return nil
		}
	}
	if strings.Contains(lower, "authorization violation") {
		return ErrAuthorization
	}
	return fmt.Errorf("leaf: server error: %s", text)
}

func (c *Conn) gotPong() {
	c.connected.Store(true)
	c.mu.Lock()
	c.pingsOut = 0
	var ch chan struct{}
	if len(c.pongs) > 0 {
		ch = c.pongs[0]
		c.pongs[0] = nil
		c.pongs = c.pongs[1:]
	}
	c.mu.Unlock()
	if ch != nil {
		close(ch)
	}
}

// ping queues a PING and, in the same step, the channel to close when its
// PONG arrives (nil for none): PONGs come back in PING order, so the two
// queues must stay in step.
func (c *Conn) ping(ch chan struct{}) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.pongs = append(c.pongs, ch)
	wasEmpty := len(c.out) == 0
	c.out = append(c.out, pingFrame...)
	c.mu.Unlock()
	if wasEmpty {
		c.signal()
	}
	return nil
}

// signal wakes the writer.
func (c *Conn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// enqueueControl queues a protocol frame regardless of WriteBufferBytes:
// control traffic is tiny and must not be lost to a full buffer.
func (c *Conn) enqueueControl(frame []byte) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	wasEmpty := len(c.out) == 0
	c.out = append(c.out, frame...)
	c.mu.Unlock()
	if wasEmpty {
		c.signal()
	}
	return nil
}

// writeLoop writes whatever accumulated while the previous write was in
// progress with one call, so a burst of publishes costs one syscall.
func (c *Conn) writeLoop() {
	defer c.wg.Done()
	for {
		select {
		case <-c.wake:
		case <-c.done:
			return
		}
		for {
			c.mu.Lock()
			buf := c.out
			if len(buf) == 0 {
				c.mu.Unlock()
				break
			}
			c.out, c.spare = c.spare[:0], nil
			c.inflight = len(buf)
			c.mu.Unlock()

			err := c.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
			if err == nil {
				_, err = c.nc.Write(buf)
			}

			c.mu.Lock()
			c.inflight = 0
			// The buffer is kept for the next burst up to the most that may be queued. A
			// push consumer draining a backlog queues megabytes while a write is in
			// progress, and of large messages (object chunks of 128 KiB) more than 8 MiB,
			// the bound this once had: each such burst grew a fresh buffer, copying it at
			// every doubling, and that was a sixth of an object get's CPU.
			if cap(buf) <= c.cfg.WriteBufferBytes {
				c.spare = buf[:0]
			}
			c.mu.Unlock()
			if err != nil {
				c.shutdown(fmt.Errorf("leaf: write: %w", err))
				return
			}
		}
	}
}

func (c *Conn) pingLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		c.mu.Lock()
		stale := c.pingsOut >= maxPingsOut
		c.pingsOut++
		c.mu.Unlock()
		if stale {
			c.shutdown(ErrStaleConnection)
			return
		}
		if c.ping(nil) != nil {
			return
		}
	}
}

// shutdown ends the link once; err is what Err reports.
func (c *Conn) shutdown(err error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.err = err
	c.out, c.spare, c.pongs = nil, nil, nil
	c.mu.Unlock()
	close(c.done)
	_ = c.nc.Close()
	if !errors.Is(err, ErrClosed) && c.connected.Load() {
		c.log.Warn("leaf: link lost", slog.String("err", err.Error()))
	}
}

// Publish queues a message for the server: LMSG, or HMSG when hdr is not
// empty. hdr is a complete header block ("NATS/1.0\r\n...\r\n\r\n"). It
// never waits for the network: it fails with ErrSlowConsumer when the
// outbound buffer is full and with ErrClosed once the link is closed or
// lost. hdr and data are copied before Publish returns.
func (c *Conn) Publish(subject, reply string, hdr, data []byte) error {
	return c.publish(subject, reply, "", hdr, data)
}

// PublishQueue is Publish with the reply subject in a byte slice, which the
// caller may reuse once it returns (a sender that builds a reply subject for
// every message saves turning each into a string), and for the members of
// queue group queue as well: the server hands a message from a leafnode to a
// local queue group only when the message names the group, and then to one of
// its members. Plain subscribers receive it as they do any message.
func (c *Conn) PublishQueue(subject string, reply []byte, queue string, hdr, data []byte) error {
	if queue != "" && !validLiteral(queue) {
		return fmt.Errorf("leaf: publish to queue %q: %w", queue, ErrBadSubject)
	}
	return c.publish(subject, bytesToString(reply), queue, hdr, data)
}

// PublishQueues is Publish for the members of every queue group in queues
// as well (one of each), which QueueGroups lists for a subject.
func (c *Conn) PublishQueues(subject, reply string, queues []string, hdr, data []byte) error {
	for _, q := range queues {
		if !validLiteral(q) {
			return fmt.Errorf("leaf: publish to queue %q: %w", q, ErrBadSubject)
		}
	}
	return c.publish(subject, reply, strings.Join(queues, " "), hdr, data)
}

func (c *Conn) publish(subject, reply, queue string, hdr, data []byte) error {
	if !validLiteral(subject) {
		return fmt.Errorf("leaf: publish to %q: %w", subject, ErrBadSubject)
	}
	if reply != "" && !validLiteral(reply) {
		return fmt.Errorf("leaf: publish reply %q: %w", reply, ErrBadSubject)
	}
	size := len(hdr) + len(data)
	if limit := c.maxPayload.Load(); int64(size) > limit {
		return fmt.Errorf("leaf: publish %d bytes to %q, limit %d: %w", size, subject, limit, ErrMaxPayload)
	}
	// Upper bound of the frame: op, spaces, two sizes, CRLFs.
	frame := len(subject) + len(reply) + len(queue) + size + 44

	c.mu.Lock()
	if c.closing || c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	pending := len(c.out) + c.inflight
	if pending > 0 && pending+frame > c.cfg.WriteBufferBytes {
		c.mu.Unlock()
		c.slow.Add(1)
		return ErrSlowConsumer
	}
	wasEmpty := len(c.out) == 0
	c.out = appendMsg(c.out, subject, reply, queue, hdr, data)
	c.mu.Unlock()
	if wasEmpty {
		c.signal()
	}
	c.outMsgs.Add(1)
	c.outBytes.Add(uint64(size))
	return nil
}

// appendMsg writes the leafnode message frame; with queue groups (queue
// names them, separated by spaces) its arguments are
// "<subject> + <reply> <queues>" or "<subject> | <queues>".
func appendMsg(b []byte, subject, reply, queue string, hdr, data []byte) []byte {
	if len(hdr) > 0 {
		b = append(b, "HMSG "...)
	} else {
		b = append(b, "LMSG "...)
	}
	b = append(b, subject...)
	b = append(b, ' ')
	switch {
	case queue != "" && reply != "":
		b = append(append(append(append(b, "+ "...), reply...), ' '), queue...)
		b = append(b, ' ')
	case queue != "":
		b = append(append(append(b, "| "...), queue...), ' ')
	case reply != "":
		b = append(b, reply...)
		b = append(b, ' ')
	}
	if len(hdr) > 0 {
		b = strconv.AppendInt(b, int64(len(hdr)), 10)
		b = append(b, ' ')
	}
	b = strconv.AppendInt(b, int64(len(hdr)+len(data)), 10)
	b = append(b, "\r\n"...)
	b = append(b, hdr...)
	b = append(b, data...)
	return append(b, "\r\n"...)
}

// Flush sends a PING and waits for the PONG: once it returns nil, the server
// has received and processed everything queued before the call.
// Cancelling ctx stops the wait, not the PING.
func (c *Conn) Flush(ctx context.Context) error {
	c.mu.Lock()
	closing := c.closing
	c.mu.Unlock()
	if closing {
		return ErrClosed
	}
	ch := make(chan struct{})
	if err := c.ping(ch); err != nil {
		return err
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("leaf: flush: %w", ctx.Err())
	case <-c.done:
		return fmt.Errorf("leaf: flush: %w", c.Err())
	}
}

// Close refuses new publishes, waits (at most a couple of seconds) until
// the server has processed what was queued, then closes the connection and
// waits for the link's goroutines. Safe to call more than once. It must not
// be called from a Handler, whose goroutine it waits for.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closing || c.closed {
		c.mu.Unlock()
		c.wg.Wait()
		return nil
	}
	c.closing = true
	c.mu.Unlock()

	// Written bytes are not enough: closing a socket that still has unread
	// input resets it, and the server may lose what it had not read yet.
	// The PONG proves it has read and processed everything before.
	answered := make(chan struct{})
	if c.ping(answered) == nil {
		t := time.NewTimer(closeDrainTimeout)
		select {
		case <-answered:
		case <-c.done:
		case <-t.C:
		}
		t.Stop()
	}
	c.shutdown(ErrClosed)
	c.wg.Wait()
	return nil
}

// Done is closed when the link ends, by Close or by a failure.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err reports why the link ended: nil while it is up, ErrClosed after
// Close, otherwise the failure.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		return nil
	}
	return c.err
}

// Stats returns a snapshot of the link's counters.
func (c *Conn) Stats() LinkStats {
	return LinkStats{
		InMsgs:       c.inMsgs.Load(),
		InBytes:      c.inBytes.Load(),
		OutMsgs:      c.outMsgs.Load(),
		OutBytes:     c.outBytes.Load(),
		Dropped:      c.dropped.Load(),
		SlowConsumer: c.slow.Load(),
	}
}

// validLiteral rejects what would break the framing: empty subjects and
// whitespace or control characters. Every delivery checks its subject and its
// reply, some hundred bytes, so it looks at eight bytes at a time: byte by byte
// it was a hundredth of all the CPU the push bench spent.
func validLiteral(s string) bool {
	if s == "" {
		return false
	}
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	i := 0
	for ; i+8 <= len(s); i += 8 {
		w := binary.LittleEndian.Uint64(unsafe.Slice(unsafe.StringData(s[i:]), 8))
		// A byte below 0x21 (n ≤ 0x80 makes the test exact), or one equal to 0x7f.
		del := w ^ (0x7f * ones)
		if ((w-0x21*ones)&^w|(del-ones)&^del)&highs != 0 {
			return false
		}
	}
	for ; i < len(s); i++ {
		if s[i] <= ' ' || s[i] == 0x7f {
			return false
		}
	}
	return true
}

// bytesToString views b as a string without copying. Only for lookups that
// do not keep the string beyond the call, while b is not modified.
func bytesToString(b []byte) string {
	return unsafe.String(unsafe.SliceData(b), len(b))
}
