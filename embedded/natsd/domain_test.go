package natsd_test

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/jetgres/jetgres/embedded/natsd"
	"github.com/jetgres/jetgres/internal/testwait"
)

func writeConf(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDomainRefusals(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, domain, conf, mention string
	}{
		{"dot", "a.b", "", "may not contain"},
		{"space", "a b", "", "may not contain"},
		{"wildcard", "a*", "", "may not contain"},
		{"reserved", "ACK", "", "reserved"},
		{"reserved in the file", "", "jetstream { domain: EVENT }", "reserved"},
		{"gateway", "", "gateway { name: other, port: -1 }", "gateways are not supported"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg := natsd.Config{JetStreamDomain: c.domain}
			if c.conf != "" {
				cfg.ConfigFile = writeConf(t, c.conf)
			}
			err := cfg.Check()
			if err == nil || !strings.Contains(err.Error(), c.mention) {
				t.Fatalf("Check() = %v, want an error mentioning %q", err, c.mention)
			}
		})
	}
}

func TestDomainFromConfig(t *testing.T) {
	t.Parallel()
	if d := start(t, natsd.Config{}).Domain(); d != "" {
		t.Errorf("default domain %q, want none", d)
	}
	conf := writeConf(t, "jetstream { domain: fromfile }")
	if d := start(t, natsd.Config{ConfigFile: conf}).Domain(); d != "fromfile" {
		t.Errorf("domain %q, want the file's, fromfile", d)
	}
	if d := start(t, natsd.Config{ConfigFile: conf, JetStreamDomain: "flag"}).Domain(); d != "flag" {
		t.Errorf("domain %q, want Config's, flag", d)
	}
}

// TestDomainMapsToTheAPI checks that the domain's prefixed API arrives where the bridge
// listens, $JS.API, key-value and object-store subjects at their own roots, alongside a
// configuration's own mappings.
func TestDomainMapsToTheAPI(t *testing.T) {
	t.Parallel()
	conf := writeConf(t, `mappings { "old.>": "new.>" }`)
	s := start(t, natsd.Config{JetStreamDomain: "pg", ConfigFile: conf})
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct{ sent, want string }{
		{"$JS.pg.API.INFO", "$JS.API.INFO"},
		{"$JS.pg.API.STREAM.CREATE.S", "$JS.API.STREAM.CREATE.S"},
		{"$JS.pg.API.CONSUMER.MSG.NEXT.S.C", "$JS.API.CONSUMER.MSG.NEXT.S.C"},
		{"$JS.pg.API.DIRECT.GET.S", "$JS.API.DIRECT.GET.S"},
		{"$JS.pg.API.$KV.B.k", "$KV.B.k"},
		{"$JS.pg.API.$OBJ.B.c", "$OBJ.B.c"},
		{"$JS.other.API.INFO", "$JS.other.API.INFO"},
		{"old.x", "new.x"},
	} {
		if err := nc.Publish(m.sent, nil); err != nil {
			t.Fatal(err)
		}
		got, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("%s: %v", m.sent, err)
		}
		if got.Subject != m.want {
			t.Errorf("%s arrived as %s, want %s", m.sent, got.Subject, m.want)
		}
	}
}

// TestDomainWallsOnRemotes joins the embedded server to a plain nats-server through a
// leafnode remote and checks what crosses: ordinary subjects and other domains' APIs do,
// jetgres's own API, key-value, object-store and replica subjects do not, either way.
func TestDomainWallsOnRemotes(t *testing.T) {
	t.Parallel()
	hub, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		LeafNode: server.LeafNodeOpts{Host: "127.0.0.1", Port: -1},
	})
	if err != nil {
		t.Fatal(err)
	}
	hub.Start()
	t.Cleanup(func() { hub.Shutdown(); hub.WaitForShutdown() })
	if !hub.ReadyForConnections(10 * time.Second) {
		t.Fatal("hub not ready")
	}
	vz, err := hub.Varz(nil)
	if err != nil {
		t.Fatal(err)
	}
	conf := writeConf(t, fmt.Sprintf(`leafnodes { remotes: [ { url: "nats-leaf://127.0.0.1:%d", deny_exports: ["secret.>"] } ] }`, vz.LeafNode.Port))
	s := start(t, natsd.Config{JetStreamDomain: "pg", ConfigFile: conf, Logger: slog.New(slog.DiscardHandler)})

	hubNC, err := nats.Connect(hub.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer hubNC.Close()
	pgNC, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer pgNC.Close()

	walled := []string{"$JS.API.INFO", "$JS.API.CONSUMER.MSG.NEXT.S.C", "$KV.B.k", "$OBJ.B.c", "$JETGRES.REPLICA.x"}
	local := append(slices.Clone(walled), "$JS.pg.API.INFO", "secret.x")
	crossing := []string{"plain.x", "$JS.hub.API.INFO", "$JS.ACK.S.C.1.1.1.1.0"}
	hubHears, err := hubNC.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	pgHears, err := pgNC.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	// Literal subscriptions, like the bridge's pulls, must not even be announced to the hub.
	for _, subj := range walled {
		if _, err := pgNC.SubscribeSync(subj); err != nil {
			t.Fatal(err)
		}
	}
	for _, nc := range []*nats.Conn{hubNC, pgNC} {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, 10*time.Second, func() error {
		lz, err := hub.Leafz(&server.LeafzOptions{Subscriptions: true})
		if err != nil {
			return err
		}
		if len(lz.Leafs) != 1 || !slices.Contains(lz.Leafs[0].Subs, ">") {
			return fmt.Errorf("hub's leafnodes: %+v", lz.Leafs)
		}
		for _, sub := range lz.Leafs[0].Subs {
			if slices.Contains(walled, sub) {
				return fmt.Errorf("the embedded server announced %s to the hub", sub)
			}
		}
		// And the other way: the hub's interest must have reached the embedded server, or
		// what it publishes first goes nowhere.
		lz, err = s.NATSServer().Leafz(&server.LeafzOptions{Subscriptions: true})
		if err != nil {
			return err
		}
		for _, l := range lz.Leafs {
			if slices.Contains(l.Subs, ">") {
				return nil
			}
		}
		return fmt.Errorf("the embedded server's leafnodes: %+v", lz.Leafs)
	})

	// Each side publishes everything, then a marker; the other side must hear exactly what
	// crosses before it. Up, the domain's own API is answered at home: it does not leave.
	// Down, it arrives mapped, and what deny_exports holds back up may come down.
	publishAll := func(nc *nats.Conn, marker string) {
		t.Helper()
		for _, subj := range append(slices.Clone(local), crossing...) {
			if err := nc.Publish(subj, nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := nc.Publish(marker, nil); err != nil {
			t.Fatal(err)
		}
	}
	upTo := func(sub *nats.Subscription, marker string) []string {
		t.Helper()
		var heard []string
		for {
			m, err := sub.NextMsg(10 * time.Second)
			if err != nil {
				t.Fatalf("waiting for %s after %v: %v", marker, heard, err)
			}
			if m.Subject == marker {
				return heard
			}
			heard = append(heard, m.Subject)
		}
	}
	publishAll(pgNC, "marker.up")
	if heard, want := upTo(hubHears, "marker.up"), crossing; !slices.Equal(heard, want) {
		t.Errorf("the hub heard %v from jetgres, want %v", heard, want)
	}
	upTo(pgHears, "marker.up") // jetgres's client hears itself too
	publishAll(hubNC, "marker.down")
	if heard, want := upTo(pgHears, "marker.down"), append([]string{"$JS.API.INFO", "secret.x"}, crossing...); !slices.Equal(heard, want) {
		t.Errorf("jetgres heard %v from the hub, want %v", heard, want)
	}
}
