//go:build linux

package e2e

// A network that can fall silent: PostgreSQL's TCP end played by a front that keeps the
// socket options a session asks PostgreSQL for, and firewall rules that drop a port's
// packets on the loopback interface, as a dead link or machine does.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// tcpUserTimeout is TCP_USER_TIMEOUT of linux/tcp.h, which package syscall does not name.
const tcpUserTimeout = 0x12

// Codes of the messages a client may open a PostgreSQL connection with, in place of a
// startup.
const (
	frontSSLRequest    = 80877103
	frontGSSEncRequest = 80877104
	frontCancelRequest = 80877102
)

// pgFront is PostgreSQL's TCP end for a test server that listens on its Unix socket only.
// PostgreSQL sets the keepalive and tcp_user_timeout settings a session asks for on its
// own socket, and ends the session, with its locks, once the kernel gives that socket up;
// the front does the same with the settings a connection's startup asks for: it sets them
// on the accepted socket and closes the session's Unix connection once that socket fails.
// Settings changed later with SET are not seen; jetgres sends them with the startup.
type pgFront struct {
	ln     net.Listener
	socket string
	mu     sync.Mutex
	conns  []net.Conn
}

func startPGFront(t *testing.T, socket string) *pgFront {
	t.Helper()
	// Keepalives off until the startup says otherwise, as PostgreSQL leaves them to the
	// operating system's defaults.
	lc := net.ListenConfig{KeepAlive: -1}
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &pgFront{ln: ln, socket: socket}
	t.Cleanup(func() {
		_ = ln.Close()
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, c := range f.conns {
			_ = c.Close()
		}
	})
	go f.accept()
	return f
}

func (f *pgFront) port() int { return f.ln.Addr().(*net.TCPAddr).Port }

func (f *pgFront) track(c net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.conns = append(f.conns, c)
}

func (f *pgFront) accept() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.track(c)
		go f.serve(c.(*net.TCPConn))
	}
}

func (f *pgFront) serve(c *net.TCPConn) {
	in := bufio.NewReader(c)
	var startup []byte
	for {
		msg, err := readStartup(in)
		if err != nil {
			_ = c.Close()
			return
		}
		code := binary.BigEndian.Uint32(msg[4:8])
		if code == frontSSLRequest || code == frontGSSEncRequest {
			// No encryption, as a server without TLS answers.
			if _, err := c.Write([]byte{'N'}); err != nil {
				return
			}
			continue
		}
		if code != frontCancelRequest {
			if err := applySessionTCP(c, startupParams(msg)); err != nil {
				_ = c.Close()
				return
			}
		}
		startup = msg
		break
	}
	up, err := net.Dial("unix", f.socket)
	if err != nil {
		_ = c.Close()
		return
	}
	f.track(up)
	if _, err := up.Write(startup); err != nil {
		_ = c.Close()
		_ = up.Close()
		return
	}
	go func() {
		_, _ = io.Copy(c, up)
		_ = c.Close()
		_ = up.Close()
	}()
	// The client's side fails once the kernel gives up on it (keepalives unanswered, data
	// unacknowledged past tcp_user_timeout): then PostgreSQL's session ends.
	_, _ = io.Copy(up, in)
	_ = up.Close()
	_ = c.Close()
}

// readStartup reads a message of the connection's start, which has no type byte.
func readStartup(r *bufio.Reader) ([]byte, error) {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(head[:])
	if n < 8 || n > 1<<16 {
		return nil, fmt.Errorf("start message of %d bytes", n)
	}
	msg := make([]byte, n)
	copy(msg, head[:])
	_, err := io.ReadFull(r, msg[4:])
	return msg, err
}

// startupParams reads the name and value pairs of a startup message.
func startupParams(msg []byte) map[string]string {
	out := make(map[string]string)
	fields := bytes.Split(msg[8:], []byte{0})
	for i := 0; i+1 < len(fields) && len(fields[i]) > 0; i += 2 {
		out[string(fields[i])] = string(fields[i+1])
	}
	return out
}

// applySessionTCP sets on c what PostgreSQL sets on its socket for the settings in params:
// keepalives always, with the idle time, interval and count given (the system's otherwise),
// and TCP_USER_TIMEOUT in milliseconds when given.
func applySessionTCP(c *net.TCPConn, params map[string]string) error {
	secs := func(name string) (time.Duration, error) {
		v, ok := params[name]
		if !ok || v == "0" {
			return -1, nil
		}
		n, err := strconv.Atoi(v)
		return time.Duration(n) * time.Second, err
	}
	var cfg net.KeepAliveConfig
	var err error
	cfg.Enable = true
	if cfg.Idle, err = secs("tcp_keepalives_idle"); err != nil {
		return err
	}
	if cfg.Interval, err = secs("tcp_keepalives_interval"); err != nil {
		return err
	}
	count, ok := params["tcp_keepalives_count"]
	cfg.Count = -1
	if ok && count != "0" {
		if cfg.Count, err = strconv.Atoi(count); err != nil {
			return err
		}
	}
	if err := c.SetKeepAliveConfig(cfg); err != nil {
		return err
	}
	ms, ok := params["tcp_user_timeout"]
	if !ok {
		return nil
	}
	n, err := strconv.Atoi(ms)
	if err != nil {
		return err
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout, n)
	}); err != nil {
		return err
	}
	return serr
}

// silencer drops, in the kernel, every loopback packet to or from the ports it is given,
// without a reset: the connections stay open on both sides and hear nothing more.
type silencer struct {
	t     *testing.T
	mark  string // the comment on each rule, naming this process
	once  sync.Once
	mu    sync.Mutex
	rules [][]string
}

// silenceMarkPrefix starts the comment on every rule a silencer adds, followed by the
// process's id: the rules of a test process killed before its cleanups ran stay in the
// kernel and drop whatever later binds their ports, and the next silencer removes them.
const silenceMarkPrefix = "jetgres-e2e-silence-pid-"

// newSilencer returns a silencer, or skips t where the machine cannot drop packets: it
// needs root and iptables.
func newSilencer(t *testing.T) *silencer {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a silent network partition needs firewall rules, hence root; this test runs as an unprivileged user")
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("a silent network partition needs iptables, which is not installed")
	}
	out, err := exec.Command("iptables", "-w", "-S", "OUTPUT").CombinedOutput()
	if err != nil {
		t.Skipf("a silent network partition needs iptables, which fails here: %v: %s", err, bytes.TrimSpace(out))
	}
	removeOrphanRules(t, string(out))
	return &silencer{t: t, mark: silenceMarkPrefix + strconv.Itoa(os.Getpid())}
}

// removeOrphanRules deletes the rules, listed as iptables -S prints them, that silencers
// of processes no longer running left behind.
func removeOrphanRules(t *testing.T, listed string) {
	t.Helper()
	for line := range strings.Lines(listed) {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "-A" {
			continue
		}
		for i := range f {
			f[i] = strings.Trim(f[i], `"`)
		}
		i := slices.Index(f, "--comment")
		if i < 0 || i+1 == len(f) {
			continue
		}
		pid, ok := strings.CutPrefix(f[i+1], silenceMarkPrefix)
		if !ok {
			continue
		}
		if _, err := os.Stat("/proc/" + pid); err == nil {
			continue
		}
		// Another test process may remove it first.
		if out, err := exec.Command("iptables", append([]string{"-w", "-D"}, f[1:]...)...).CombinedOutput(); err != nil {
			t.Logf("removing a rule left behind by process %s: %v: %s", pid, err, bytes.TrimSpace(out))
		}
	}
}

// silence drops the packets of ports from now on, until the test ends. The rules go
// before the cleanups registered earlier run, while the test's sockets still hold the
// ports: once freed, a port may be bound again by any test, whose packets a rule left in
// place would drop.
func (s *silencer) silence(ports ...int) {
	s.t.Helper()
	s.once.Do(func() { s.t.Cleanup(s.restore) })
	for _, p := range ports {
		for _, dir := range []string{"--dport", "--sport"} {
			rule := []string{"OUTPUT", "-o", "lo", "-s", "127.0.0.1", "-d", "127.0.0.1", "-p", "tcp", dir, strconv.Itoa(p),
				"-m", "comment", "--comment", s.mark, "-j", "DROP"}
			if out, err := exec.Command("iptables", append([]string{"-w", "-I"}, rule...)...).CombinedOutput(); err != nil {
				s.t.Fatalf("iptables -I %s: %v: %s", strings.Join(rule, " "), err, out)
			}
			s.mu.Lock()
			s.rules = append(s.rules, rule)
			s.mu.Unlock()
		}
	}
}

// restore removes every rule the silencer added.
func (s *silencer) restore() {
	s.mu.Lock()
	rules := s.rules
	s.rules = nil
	s.mu.Unlock()
	var errs []error
	for _, rule := range rules {
		if out, err := exec.Command("iptables", append([]string{"-w", "-D"}, rule...)...).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("iptables -D %s: %v: %s", strings.Join(rule, " "), err, out))
		}
	}
	if err := errors.Join(errs...); err != nil {
		s.t.Errorf("removing the partition's firewall rules: %v", err)
	}
}
