package natsd_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/syncbuf"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/jetgres/jetgres/embedded/natsd"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func start(t *testing.T, cfg natsd.Config) *natsd.Server {
	t.Helper()
	if cfg.Port == 0 {
		cfg.Port = -1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := natsd.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

func TestStartServesClients(t *testing.T) {
	t.Parallel()
	s := start(t, natsd.Config{})
	if !s.Ready() {
		t.Fatal("Ready() = false after Start")
	}
	if got := s.MaxPayload(); got != natsd.MaxPayloadDefault {
		t.Errorf("MaxPayload() = %d, want %d", got, natsd.MaxPayloadDefault)
	}

	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatalf("connect %s: %v", s.ClientURL(), err)
	}
	defer nc.Close()
	if got := nc.MaxPayload(); got != int64(natsd.MaxPayloadDefault) {
		t.Errorf("client sees max payload %d, want %d", got, natsd.MaxPayloadDefault)
	}
	sub, err := nc.SubscribeSync("ping")
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	if err := nc.Publish("ping", []byte("x")); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if _, err := sub.NextMsg(2 * time.Second); err != nil {
		t.Fatalf("receive: %v", err)
	}
	if s.NATSServer().JetStreamEnabled() {
		t.Error("JetStream is enabled; jetgres answers the JetStream API itself")
	}
}

func TestMaxPayloadConfigurable(t *testing.T) {
	t.Parallel()
	s := start(t, natsd.Config{MaxPayload: 2 << 20})
	if got := s.MaxPayload(); got != 2<<20 {
		t.Fatalf("MaxPayload() = %d, want %d", got, 2<<20)
	}
}

func TestStopIsIdempotent(t *testing.T) {
	t.Parallel()
	s := start(t, natsd.Config{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(s.Stop)
	}
	wg.Wait()
	s.Stop()
	if s.Ready() {
		t.Fatal("Ready() = true after Stop")
	}
}

func TestLeafEndpoint(t *testing.T) {
	t.Parallel()
	// Clients may listen everywhere; the leaf port never does.
	s := start(t, natsd.Config{Host: "0.0.0.0"})
	ep := s.Leaf()

	host, port, err := net.SplitHostPort(ep.Addr)
	if err != nil {
		t.Fatalf("leaf addr %q: %v", ep.Addr, err)
	}
	if host != "127.0.0.1" {
		t.Fatalf("leaf host = %q, want 127.0.0.1", host)
	}
	if ep.User == "" || len(ep.Password) < 32 {
		t.Fatalf("leaf credentials too weak: user %q, password of %d chars", ep.User, len(ep.Password))
	}
	other := start(t, natsd.Config{})
	if o := other.Leaf(); o.User == ep.User || o.Password == ep.Password {
		t.Fatal("two servers share leaf credentials")
	}
	for _, text := range []string{ep.String(), fmt.Sprintf("%v", ep), fmt.Sprintf("%+v", ep)} {
		if strings.Contains(text, ep.Password) {
			t.Fatalf("formatted endpoint reveals the password: %s", text)
		}
	}

	// Reachable on loopback...
	c, err := net.DialTimeout("tcp", ep.Addr, 2*time.Second)
	if err != nil {
		t.Fatalf("dial leaf on loopback: %v", err)
	}
	c.Close()
	// ...and on no other address of this machine.
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatalf("interface addresses: %v", err)
	}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.IsLoopback() || ipn.IP.IsLinkLocalUnicast() {
			continue
		}
		target := net.JoinHostPort(ipn.IP.String(), port)
		if c, err := net.DialTimeout("tcp", target, time.Second); err == nil {
			c.Close()
			t.Errorf("leaf port reachable on %s", target)
		}
	}
}

func TestStartFailsOnBusyPort(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port

	logs := &syncbuf.Buffer{}
	// Waiting for this deadline, not the time taken to notice, is the failure: a long one
	// keeps the two apart however loaded the machine.
	const deadline = time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	began := time.Now()
	s, err := natsd.Start(ctx, natsd.Config{Port: port, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err == nil {
		s.Stop()
		t.Fatalf("Start on busy port %d succeeded", port)
	}
	// The server reports the failure through Fatalf, which must neither exit
	// the process nor leave Start waiting for its deadline.
	if !strings.Contains(err.Error(), strconv.Itoa(port)) {
		t.Errorf("error does not name the port: %v", err)
	}
	if d := time.Since(began); d > deadline/2 {
		t.Errorf("Start took %s to notice the busy port", d)
	}
	if !strings.Contains(logs.String(), "fatal=true") {
		t.Errorf("fatal message not logged:\n%s", logs.String())
	}
}

func TestStartHonoursContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s, err := natsd.Start(ctx, natsd.Config{Port: -1, Logger: slog.New(slog.DiscardHandler)})
	if err == nil {
		// Readiness can win the race against the cancelled context; that
		// is fine as long as the server works.
		defer s.Stop()
		if !s.Ready() {
			t.Fatal("Start returned a server that is not ready")
		}
	}
}

func TestServerOptionsHook(t *testing.T) {
	t.Parallel()
	s := start(t, natsd.Config{ServerOptions: func(o *server.Options) {
		o.Username, o.Password = "alice", "secret"
		// Attempts to move the leaf listener are overridden.
		o.LeafNode.Host = "0.0.0.0"
		o.LeafNode.Username = "mallory"
		o.NoSigs = false
	}})
	if _, err := nats.Connect(s.ClientURL()); err == nil {
		t.Fatal("connected without the credentials the hook configured")
	}
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("alice", "secret"))
	if err != nil {
		t.Fatalf("connect with credentials: %v", err)
	}
	nc.Close()
	ep := s.Leaf()
	if !strings.HasPrefix(ep.Addr, "127.0.0.1:") || ep.User == "mallory" {
		t.Fatalf("hook changed the leaf endpoint: %s", ep)
	}
}

func TestServerLogsReachSlog(t *testing.T) {
	t.Parallel()
	logs := &syncbuf.Buffer{}
	s := start(t, natsd.Config{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	s.Stop()
	out := logs.String()
	if !strings.Contains(out, "component=nats-server") || !strings.Contains(out, "Server is ready") {
		t.Fatalf("server log lines missing:\n%s", out)
	}
	if strings.Contains(out, s.Leaf().Password) {
		t.Fatal("leaf password appears in the log")
	}
}

// A default start warns about nothing: the server's warning about default_js_domain concerns a
// setting natsd makes itself, so it is kept to debug level.
func TestDefaultStartWarnsAboutNothing(t *testing.T) {
	t.Parallel()
	logs := &syncbuf.Buffer{}
	s := start(t, natsd.Config{Host: "127.0.0.1", Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	s.Stop()
	var sawDomain bool
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			t.Errorf("a default start logged: %s", line)
		}
		sawDomain = sawDomain || strings.Contains(line, "default_js_domain")
	}
	if !sawDomain {
		t.Error("the default_js_domain notice is not at debug level either; has the server's wording changed?")
	}
}

// The configuration's jetstream block keeps JetStream off in the server and hands its
// resources to jetgres, which bounds what streams hold by them.
func TestJetStreamLimitsFromConfig(t *testing.T) {
	t.Parallel()
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte("jetstream {\n  max_memory_store: 1048576\n  max_file_store: 2097152\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := start(t, natsd.Config{ConfigFile: conf})
	if s.NATSServer().JetStreamEnabled() {
		t.Error("JetStream is enabled; jetgres answers the JetStream API itself")
	}
	if got, want := s.JetStreamLimits(), (natsd.JetStreamLimits{MaxMemory: 1 << 20, MaxStore: 2 << 20}); got != want {
		t.Fatalf("JetStreamLimits() = %+v, want %+v", got, want)
	}
	if got := start(t, natsd.Config{}).JetStreamLimits(); got != (natsd.JetStreamLimits{}) {
		t.Fatalf("JetStreamLimits() without a jetstream block = %+v, want none", got)
	}
}
