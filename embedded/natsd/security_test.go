package natsd_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/syncbuf"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/embedded/natsd"
	"github.com/jetgres/jetgres/internal/testauth"
)

// writeConfig writes a nats-server configuration file for one test.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// leafStillWorks dials the bridge's link the way jetgres does: client security must not
// reach the leafnode listener.
func leafStillWorks(t *testing.T, s *natsd.Server) {
	t.Helper()
	ep := s.Leaf()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := leaf.Dial(ctx, leaf.Config{Addr: ep.Addr, User: ep.User, Password: ep.Password, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("bridge link: %v", err)
	}
	_ = c.Close()
}

func TestConfigFileAuthentication(t *testing.T) {
	t.Parallel()
	nkeyPub, nkeyOpt := testauth.NkeyUser(t)
	conf := writeConfig(t, fmt.Sprintf(`
listen: 0.0.0.0:4999 # ignored: jetgres decides the listener
max_payload: 2MB
authorization {
  users: [
    {user: hashed, password: %q}
    {user: plain, password: "plain-pass"}
    {nkey: %s}
  ]
}
`, testauth.BcryptHash(t, "bcrypt-pass"), nkeyPub))
	logs := &syncbuf.Buffer{}
	s := start(t, natsd.Config{ConfigFile: conf, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if !strings.HasPrefix(s.ClientURL(), "nats://127.0.0.1:") || strings.HasSuffix(s.ClientURL(), ":4999") {
		t.Errorf("client URL %s: the file's listen address was not overridden", s.ClientURL())
	}
	if s.MaxPayload() != 2<<20 {
		t.Errorf("max payload %d, want the file's 2 MiB", s.MaxPayload())
	}
	for _, c := range []struct {
		name string
		opt  nats.Option
		ok   bool
	}{
		{"bcrypt user", nats.UserInfo("hashed", "bcrypt-pass"), true},
		{"bcrypt user, the hash as password", nats.UserInfo("hashed", testauth.BcryptHash(t, "bcrypt-pass")), false},
		{"plain user", nats.UserInfo("plain", "plain-pass"), true},
		{"wrong password", nats.UserInfo("plain", "wrong"), false},
		{"unknown user", nats.UserInfo("nobody", "plain-pass"), false},
		{"nkey user", nkeyOpt, true},
		{"no credentials", func(*nats.Options) error { return nil }, false},
	} {
		nc, err := nats.Connect(s.ClientURL(), c.opt, nats.MaxReconnects(0))
		if c.ok && err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if !c.ok && !errors.Is(err, nats.ErrAuthorization) {
			t.Errorf("%s: %v, want an authorization error", c.name, err)
		}
		if nc != nil {
			nc.Close()
		}
	}
	if out := logs.String(); !strings.Contains(out, "listen address is ignored") || !strings.Contains(out, `auth="2 users, 1 nkeys"`) {
		t.Errorf("logs do not report the ignored address and the security:\n%s", out)
	}
	leafStillWorks(t, s)
}

func TestUserAddsToConfigFile(t *testing.T) {
	t.Parallel()
	conf := writeConfig(t, `authorization { user: fileuser, password: filepass }`)
	s := start(t, natsd.Config{ConfigFile: conf, User: "flaguser", Password: testauth.BcryptHash(t, "flagpass")})
	for _, u := range [][2]string{{"fileuser", "filepass"}, {"flaguser", "flagpass"}} {
		nc, err := nats.Connect(s.ClientURL(), nats.UserInfo(u[0], u[1]))
		if err != nil {
			t.Errorf("user %s: %v", u[0], err)
			continue
		}
		nc.Close()
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := natsd.Start(ctx, natsd.Config{Port: -1, ConfigFile: conf, User: "fileuser", Password: "x", Logger: slog.New(slog.DiscardHandler)}); err == nil || !strings.Contains(err.Error(), "fileuser") {
		t.Errorf("the same user in the file and in Config: %v", err)
	}
}

func TestConfigFileRefusals(t *testing.T) {
	t.Parallel()
	for name, text := range map[string]string{
		"other account":   `accounts { APP: { users: [{user: a, password: b}] } }`,
		"operator mode":   fmt.Sprintf("operator: %q\nresolver: MEMORY", operatorJWT(t)),
		"syntax":          `authorization { users: [ }`,
		"unknown key":     `no_such_setting: 1`,
		"bad permissions": `authorization { users: [{user: a, password: b, permissions: {publish: {allow: ["a..b"]}}}] }`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			conf := writeConfig(t, text)
			s, err := natsd.Start(ctx, natsd.Config{Port: -1, ConfigFile: conf, Logger: slog.New(slog.DiscardHandler)})
			if err == nil {
				s.Stop()
				t.Fatalf("started with %s", text)
			}
			if !strings.Contains(err.Error(), "nats.conf") {
				t.Errorf("error does not name the file: %v", err)
			}
			if cerr := (natsd.Config{ConfigFile: conf}).Check(); cerr == nil {
				t.Errorf("Check accepts what Start refuses (%v)", err)
			}
			t.Log(err)
		})
	}
	// The system account may be defined: it is for operators, not for JetStream clients.
	s := start(t, natsd.Config{ConfigFile: writeConfig(t, `
accounts { SYS: { users: [{user: admin, password: adminpass}] } }
system_account: SYS
authorization { users: [{user: app, password: apppass}] }
`)})
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("app", "apppass"))
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
}

func TestPermissionsFromConfigFile(t *testing.T) {
	t.Parallel()
	s := start(t, natsd.Config{ConfigFile: writeConfig(t, `
authorization {
  users: [
    {user: reader, password: r, permissions: {publish: {deny: ">"}, subscribe: {allow: "orders.>"}}}
    {user: writer, password: w, permissions: {publish: {allow: "orders.>"}, subscribe: {deny: ">"}}}
  ]
}
`)})
	errs := make(chan error, 10)
	handler := nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err })
	reader, err := nats.Connect(s.ClientURL(), nats.UserInfo("reader", "r"), handler)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	writer, err := nats.Connect(s.ClientURL(), nats.UserInfo("writer", "w"), handler)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	sub, err := reader.SubscribeSync("orders.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := reader.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := reader.Publish("orders.x", []byte("from reader")); err != nil {
		t.Fatal(err)
	}
	if err := writer.Publish("orders.x", []byte("from writer")); err != nil {
		t.Fatal(err)
	}
	if err := writer.Flush(); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(2 * time.Second)
	if err != nil || string(m.Data) != "from writer" {
		t.Fatalf("reader got %v, %v; want only the writer's message", m, err)
	}
	if m, err := sub.NextMsg(200 * time.Millisecond); err == nil {
		t.Fatalf("reader got %q, which it may not publish", m.Data)
	}
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Fatalf("async error %v, want a permissions violation", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no permissions violation reported")
	}
}

func TestTLS(t *testing.T) {
	t.Parallel()
	certs := testauth.Write(t)
	t.Run("server certificate", func(t *testing.T) {
		t.Parallel()
		s := start(t, natsd.Config{TLS: natsd.TLSConfig{Cert: certs.ServerCert, Key: certs.ServerKey}})
		if !strings.HasPrefix(s.ClientURL(), "tls://") {
			t.Errorf("client URL %s is not tls://", s.ClientURL())
		}
		plain := strings.Replace(s.ClientURL(), "tls://", "nats://", 1)
		if nc, err := nats.Connect(plain, nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Error("a plain client connected to a TLS server")
		}
		if nc, err := nats.Connect(s.ClientURL(), nats.RootCAs(certs.OtherCA)); err == nil {
			nc.Close()
			t.Error("a client that does not trust the server's authority connected")
		}
		nc, err := nats.Connect(s.ClientURL(), nats.RootCAs(certs.CA))
		if err != nil {
			t.Fatalf("TLS client with the CA: %v", err)
		}
		if !nc.TLSRequired() {
			t.Error("connection does not require TLS")
		}
		nc.Close()
		leafStillWorks(t, s)
	})
	t.Run("client verification", func(t *testing.T) {
		t.Parallel()
		s := start(t, natsd.Config{TLS: natsd.TLSConfig{Cert: certs.ServerCert, Key: certs.ServerKey, CA: certs.CA, Verify: true}})
		if nc, err := nats.Connect(s.ClientURL(), nats.RootCAs(certs.CA), nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Error("a client without a certificate connected")
		}
		nc, err := nats.Connect(s.ClientURL(), nats.RootCAs(certs.CA), nats.ClientCert(certs.ClientCert, certs.ClientKey))
		if err != nil {
			t.Fatalf("TLS client with a certificate: %v", err)
		}
		nc.Close()
		leafStillWorks(t, s)
	})
	t.Run("misconfigured", func(t *testing.T) {
		t.Parallel()
		for name, c := range map[string]natsd.TLSConfig{
			"no key":           {Cert: certs.ServerCert},
			"key of no cert":   {Key: certs.ServerKey},
			"verify, no cert":  {Verify: true, CA: certs.CA},
			"missing file":     {Cert: filepath.Join(t.TempDir(), "none.pem"), Key: certs.ServerKey},
			"key for the cert": {Cert: certs.ServerCert, Key: certs.ClientKey},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			s, err := natsd.Start(ctx, natsd.Config{Port: -1, TLS: c, Logger: slog.New(slog.DiscardHandler)})
			cancel()
			if err == nil {
				s.Stop()
				t.Errorf("%s: started", name)
			}
		}
		conf := writeConfig(t, fmt.Sprintf(`tls { cert_file: %q, key_file: %q }`, certs.ServerCert, certs.ServerKey))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := natsd.Start(ctx, natsd.Config{Port: -1, ConfigFile: conf, TLS: natsd.TLSConfig{Cert: certs.ServerCert, Key: certs.ServerKey}, Logger: slog.New(slog.DiscardHandler)})
		if err == nil {
			s.Stop()
			t.Error("started with TLS both in the file and in Config")
		}
	})
}

func TestMaxControlLineFitsTheLink(t *testing.T) {
	t.Parallel()
	s := start(t, natsd.Config{ConfigFile: writeConfig(t, `max_control_line: 1MB`)})
	vz, err := s.NATSServer().Varz(nil)
	if err != nil {
		t.Fatal(err)
	}
	if vz.MaxControlLine > leaf.MaxControlLine/2 {
		t.Fatalf("max_control_line %d, more than the link accepts", vz.MaxControlLine)
	}
}

// operatorJWT is a self-signed operator, enough to put a server in operator mode.
func operatorJWT(t *testing.T) string {
	t.Helper()
	kp, err := nkeys.CreateOperator()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	token, err := jwt.NewOperatorClaims(pub).Encode(kp)
	if err != nil {
		t.Fatal(err)
	}
	return token
}
