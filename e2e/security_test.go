package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/testauth"
)

// TestSecurity starts jetgres with client security from flags and a nats-server
// configuration file together, and checks it from the outside: TLS with client
// certificates, passwords plain and bcrypt, an nkey, and permissions that govern the
// JetStream API; the bridge's leafnode listener and the private cluster's directory stay
// closed to everyone else.
func TestSecurity(t *testing.T) {
	t.Parallel()
	certs := testauth.Write(t)
	nkeyPub, nkeyLogin := testauth.NkeyUser(t)
	conf := filepath.Join(t.TempDir(), "nats.conf")
	writeFile(t, conf, fmt.Sprintf(`
authorization {
  users: [
    {user: admin, password: %q}
    {nkey: %s}
    # May do anything but create streams.
    {user: nostream, password: nostream, permissions: {
      publish: {allow: ">", deny: "$JS.API.STREAM.CREATE.>"}, subscribe: "_INBOX.>"}}
    # May only listen.
    {user: reader, password: reader, permissions: {publish: {deny: ">"}, subscribe: ">"}}
    # May not ask about consumer C1.
    {user: noinfo, password: noinfo, permissions: {
      publish: {allow: ">", deny: "$JS.API.CONSUMER.INFO.ORDERS.C1"}, subscribe: ">"}}
    # May ask, but not hear the answer.
    {user: deaf, password: deaf, permissions: {publish: ">", subscribe: {deny: "_INBOX.>"}}}
  ]
}
`, testauth.BcryptHash(t, "admin-pass"), nkeyPub))
	j := startJetgres(t, options{Args: []string{
		"--nats-config", conf,
		"--user", "flaguser", "--password", testauth.BcryptHash(t, "flag-pass"),
		"--tls-cert", certs.ServerCert, "--tls-key", certs.ServerKey, "--tls-ca", certs.CA, "--tls-verify",
	}})
	if !strings.HasPrefix(j.natsURL, "tls://") {
		t.Fatalf("NATS URL %s is not tls://", j.natsURL)
	}
	tlsOK := []nats.Option{nats.RootCAs(certs.CA), nats.ClientCert(certs.ClientCert, certs.ClientKey)}
	connect := func(opts ...nats.Option) (*nats.Conn, error) {
		nc, err := nats.Connect(j.natsURL, append([]nats.Option{nats.MaxReconnects(0), nats.Timeout(5 * time.Second)}, opts...)...)
		if err == nil {
			t.Cleanup(nc.Close)
		}
		return nc, err
	}
	mustConnect := func(name string, opts ...nats.Option) jetstream.JetStream {
		t.Helper()
		nc, err := connect(append(slices.Clone(tlsOK), opts...)...)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("TLS", func(t *testing.T) {
		plain := strings.Replace(j.natsURL, "tls://", "nats://", 1)
		if nc, err := nats.Connect(plain, nats.UserInfo("admin", "admin-pass"), nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Error("a plain client connected")
		}
		if _, err := connect(nats.RootCAs(certs.CA), nats.UserInfo("admin", "admin-pass")); err == nil {
			t.Error("a client without a certificate connected despite --tls-verify")
		}
		if _, err := connect(nats.RootCAs(certs.OtherCA), nats.ClientCert(certs.ClientCert, certs.ClientKey), nats.UserInfo("admin", "admin-pass")); err == nil {
			t.Error("a client that does not trust the server's certificate connected")
		}
		if !strings.Contains(j.logs.String(), "tls=true tls_verify=true") {
			t.Errorf("logs do not report TLS with verification:\n%s", j.logs.String())
		}
	})

	t.Run("passwords", func(t *testing.T) {
		for _, c := range []struct {
			user, pass string
			ok         bool
		}{
			{"admin", "admin-pass", true},                 // bcrypt in the file
			{"flaguser", "flag-pass", true},               // bcrypt in --password
			{"admin", "wrong", false},                     // wrong password
			{"flaguser", "", false},                       // none
			{"nobody", "admin-pass", false},               // unknown user
			{"admin", testauth.BcryptHash(t, "x"), false}, // a hash is not a password
		} {
			_, err := connect(append(slices.Clone(tlsOK), nats.UserInfo(c.user, c.pass))...)
			if c.ok && err != nil {
				t.Errorf("%s: %v", c.user, err)
			}
			if !c.ok && !errors.Is(err, nats.ErrAuthorization) {
				t.Errorf("%s with %q: %v, want an authorization error", c.user, c.pass, err)
			}
		}
		if _, err := connect(tlsOK...); !errors.Is(err, nats.ErrAuthorization) {
			t.Errorf("no credentials: %v, want an authorization error", err)
		}
	})

	admin := mustConnect("admin", nats.UserInfo("admin", "admin-pass"))
	orders, err := admin.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		t.Fatalf("admin creates a stream: %v", err)
	}
	for i := range 3 {
		if _, err := admin.Publish(ctx, "orders.new", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := orders.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C1", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	streamMsgs := func() uint64 {
		t.Helper()
		info, err := orders.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}

	t.Run("nkey user publishes and consumes", func(t *testing.T) {
		js := mustConnect("nkey user", nkeyLogin)
		if _, err := js.Publish(ctx, "orders.nkey", []byte("by nkey")); err != nil {
			t.Fatalf("publish: %v", err)
		}
		c, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "NK", FilterSubject: "orders.nkey", AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			t.Fatal(err)
		}
		b, err := c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range b.Messages() {
			n++
			if err := m.DoubleAck(ctx); err != nil || string(m.Data()) != "by nkey" {
				t.Errorf("message %q, ack %v", m.Data(), err)
			}
		}
		if n != 1 || b.Error() != nil {
			t.Errorf("fetched %d, %v", n, b.Error())
		}
	})
	before := streamMsgs()

	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 3*time.Second) }

	t.Run("no permission to create a stream", func(t *testing.T) {
		js := mustConnect("nostream", nats.UserInfo("nostream", "nostream"))
		c, cancel := short()
		defer cancel()
		_, err := js.CreateStream(c, jetstream.StreamConfig{Name: "SNEAKY", Subjects: []string{"sneaky.>"}})
		if err == nil {
			t.Fatal("created a stream without permission")
		}
		t.Logf("create refused: %v", err)
		if _, err := admin.Stream(ctx, "SNEAKY"); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("stream SNEAKY: %v, want not found", err)
		}
		// What the user may do still works.
		if _, err := js.Publish(ctx, "orders.allowed", nil); err != nil {
			t.Errorf("publish within the permissions: %v", err)
		}
		before++
	})

	t.Run("subscribe-only user cannot publish into a stream", func(t *testing.T) {
		nc, err := connect(append(slices.Clone(tlsOK), nats.UserInfo("reader", "reader"))...)
		if err != nil {
			t.Fatal(err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		info, err := orders.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		last := info.State.LastSeq
		c, cancel := short()
		defer cancel()
		if _, err := js.Publish(c, "orders.forbidden", []byte("x"), jetstream.WithRetryAttempts(0)); err == nil {
			t.Fatal("a subscribe-only user got a PubAck")
		}
		if err := nc.Publish("orders.forbidden", []byte("core")); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		// Once the flush returns the server has dealt with both publishes, so a forbidden one
		// that got through would reach the stream ahead of the admin's next publish.
		ack, err := admin.Publish(ctx, "orders.after", nil)
		if err != nil {
			t.Fatal(err)
		}
		before++
		if ack.Sequence != last+1 {
			t.Errorf("the admin's publish after the forbidden ones stored at %d, want %d", ack.Sequence, last+1)
		}
		if got := streamMsgs(); got != before {
			t.Errorf("stream holds %d messages, want %d", got, before)
		}
	})

	t.Run("reading a consumer needs both directions", func(t *testing.T) {
		for _, u := range []string{"noinfo", "deaf"} {
			js := mustConnect(u, nats.UserInfo(u, u))
			c, cancel := short()
			_, err := js.Consumer(c, "ORDERS", "C1")
			cancel()
			if err == nil {
				t.Errorf("%s read consumer C1", u)
			} else {
				t.Logf("%s: %v", u, err)
			}
		}
	})

	t.Run("leafnode listener", func(t *testing.T) {
		addr := leafAddr(t, j)
		if host, _, _ := net.SplitHostPort(addr); host != "127.0.0.1" {
			t.Fatalf("leafnode listener on %s, want loopback only", addr)
		}
		if nc, err := nats.Connect("nats://"+addr, nats.UserInfo("admin", "admin-pass"), nats.MaxReconnects(0), nats.Timeout(2*time.Second)); err == nil {
			nc.Close()
			t.Error("a NATS client connected to the leafnode listener")
		}
		for _, creds := range [][2]string{{"", ""}, {"admin", "admin-pass"}, {"flaguser", "flag-pass"}} {
			c, cancel := short()
			link, err := leaf.Dial(c, leaf.Config{Addr: addr, User: creds[0], Password: creds[1], Logger: slog.New(slog.DiscardHandler)})
			cancel()
			if err == nil {
				_ = link.Close()
				t.Errorf("a leafnode with %q attached", creds[0])
			} else if !errors.Is(err, leaf.ErrAuthorization) {
				t.Errorf("a leafnode with %q: %v, want an authorization error", creds[0], err)
			}
		}
	})

	t.Run("private cluster directory", func(t *testing.T) {
		fi, err := os.Stat(filepath.Join(j.dataDir, "pg"))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o700 {
			t.Errorf("%s has mode %v, want 0700", fi.Name(), fi.Mode().Perm())
		}
	})

	j.stop(t)
	if logs := j.logs.String(); strings.Contains(logs, "admin-pass") || strings.Contains(logs, "flag-pass") {
		t.Errorf("logs contain a client password:\n%s", logs)
	}
}

// TestSecurityRefusesBadConfiguration starts jetgres with client security it cannot apply:
// it must exit at once with a usage or start-up error that names the problem.
func TestSecurityRefusesBadConfiguration(t *testing.T) {
	t.Parallel()
	conf := filepath.Join(t.TempDir(), "accounts.conf")
	writeFile(t, conf, `accounts { APP: { users: [{user: a, password: b}] } }`)
	for _, c := range []struct {
		args    []string
		code    int
		mention string
	}{
		{[]string{"--user", "u"}, 2, "--password"},
		{[]string{"--tls-cert", "cert.pem"}, 2, "--tls-key"},
		{[]string{"--tls-verify"}, 2, "--tls-cert"},
		{[]string{"--nats-config", conf}, 1, "global account only"},
		{[]string{"--nats-config", filepath.Join(t.TempDir(), "missing.conf")}, 1, "missing.conf"},
	} {
		j := launchJetgres(t, options{Args: c.args})
		err := j.wait(stopTimeout)
		var exit interface{ ExitCode() int }
		if !errors.As(err, &exit) || exit.ExitCode() != c.code {
			t.Errorf("%q: %v, want exit code %d", c.args, err, c.code)
		}
		logs := j.logs.String()
		if !strings.Contains(logs, c.mention) {
			t.Errorf("%q: output does not mention %s:\n%s", c.args, c.mention, logs)
		}
		if strings.Contains(logs, "starting private PostgreSQL") {
			t.Errorf("%q: PostgreSQL started before the NATS settings were checked", c.args)
		}
	}
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// leafAddr finds the bridge's leafnode listener from the outside: the one TCP socket the
// jetgres process listens on besides its NATS and HTTP ports.
func leafAddr(t *testing.T, j *jetgres) string {
	t.Helper()
	pid := j.cmd.Process.Pid
	inodes := map[string]bool{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Skipf("no /proc to find the leafnode port in: %v", err)
	}
	for _, fd := range fds {
		if target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil {
			if ino, ok := strings.CutPrefix(target, "socket:["); ok {
				inodes[strings.TrimSuffix(ino, "]")] = true
			}
		}
	}
	known := map[string]bool{}
	for _, a := range []string{strings.TrimPrefix(j.natsURL, "tls://"), j.httpAddr} {
		_, port, _ := net.SplitHostPort(a)
		known[port] = true
	}
	var found []string
	for _, file := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, file))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "0A" || !inodes[fields[9]] {
				continue
			}
			addr := procAddr(t, fields[1])
			if _, port, _ := net.SplitHostPort(addr); !known[port] {
				found = append(found, addr)
			}
		}
		f.Close()
	}
	if len(found) != 1 {
		t.Fatalf("listening sockets besides NATS and HTTP: %v, want exactly the leafnode one", found)
	}
	return found[0]
}

// procAddr decodes an address of /proc/net/tcp{,6}: hex IP in host byte order, hex port.
func procAddr(t *testing.T, s string) string {
	t.Helper()
	hexIP, hexPort, ok := strings.Cut(s, ":")
	port, err := strconv.ParseUint(hexPort, 16, 16)
	if !ok || err != nil {
		t.Fatalf("address %q", s)
	}
	var ip net.IP
	for i := 0; i+8 <= len(hexIP); i += 8 {
		word, err := strconv.ParseUint(hexIP[i:i+8], 16, 32)
		if err != nil {
			t.Fatalf("address %q", s)
		}
		ip = append(ip, byte(word), byte(word>>8), byte(word>>16), byte(word>>24))
	}
	return net.JoinHostPort(ip.String(), strconv.FormatUint(port, 10))
}
