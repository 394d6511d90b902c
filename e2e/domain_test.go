package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// domainHub is a real nats-server with JetStream in domain "hub" and a leafnode listener,
// the existing NATS system that jetgres joins.
type domainHub struct {
	ns *server.Server
	// violations counts the permission violations the hub logged: a leafnode that sends
	// what the hub denies it is cut off with one.
	violations atomic.Int64
}

func startDomainHub(t *testing.T) *domainHub {
	t.Helper()
	ns, err := server.NewServer(&server.Options{
		ServerName:      "hub",
		Host:            "127.0.0.1",
		Port:            -1,
		JetStream:       true,
		JetStreamDomain: "hub",
		StoreDir:        t.TempDir(),
		LeafNode:        server.LeafNodeOpts{Host: "127.0.0.1", Port: -1},
		NoSigs:          true,
	})
	if err != nil {
		t.Fatal(err)
	}
	h := &domainHub{ns: ns}
	ns.SetLoggerV2(h, false, false, false)
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("hub not ready")
	}
	return h
}

func (h *domainHub) count(format string, v []any) {
	if strings.Contains(fmt.Sprintf(format, v...), "Violation") {
		h.violations.Add(1)
	}
}

func (h *domainHub) Noticef(format string, v ...any) { h.count(format, v) }
func (h *domainHub) Warnf(format string, v ...any)   { h.count(format, v) }
func (h *domainHub) Fatalf(format string, v ...any)  { h.count(format, v) }
func (h *domainHub) Errorf(format string, v ...any)  { h.count(format, v) }
func (h *domainHub) Debugf(string, ...any)           {}
func (h *domainHub) Tracef(string, ...any)           {}

func (h *domainHub) leafURL(t *testing.T) string {
	t.Helper()
	vz, err := h.ns.Varz(nil)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("nats-leaf://127.0.0.1:%d", vz.LeafNode.Port)
}

// leaf is the hub's one leafnode connection, jetgres's, with the interest it registered.
func (h *domainHub) leaf() (*server.LeafInfo, error) {
	lz, err := h.ns.Leafz(&server.LeafzOptions{Subscriptions: true})
	if err != nil {
		return nil, err
	}
	if len(lz.Leafs) != 1 {
		return nil, fmt.Errorf("%d leafnode connections on the hub, want 1", len(lz.Leafs))
	}
	l := lz.Leafs[0]
	// A leafnode counts once its interest is in: the remote sends it right after CONNECT.
	if !slices.Contains(l.Subs, "$JS.pg.API.STREAM.>") {
		return nil, fmt.Errorf("jetgres's leafnode has not registered $JS.pg.API.STREAM.> on the hub: %v", l.Subs)
	}
	return l, nil
}

// TestDomainHubLeafnode joins jetgres, JetStream domain "pg", to a hub running JetStream in
// domain "hub" through a leafnode remote, as a user would with --nats-config, and proves that
// the two JetStreams stay apart while each stays reachable from the other side through its
// domain prefix.
func TestDomainHubLeafnode(t *testing.T) {
	hub := startDomainHub(t)
	conf := filepath.Join(t.TempDir(), "leaf.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, "leafnodes { remotes: [ { url: %q } ] }\n", hub.leafURL(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	j := startJetgres(t, options{Args: []string{"--nats-config", conf, "--js-domain", "pg"}})

	var leafID uint64
	testwait.For(t, 30*time.Second, func() error {
		l, err := hub.leaf()
		if err == nil {
			leafID = l.ID
		}
		return err
	})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hubNC, err := nats.Connect(hub.ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer hubNC.Close()
	pgNC, err := nats.Connect(j.natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pgNC.Close()

	hubJS, err := jetstream.New(hubNC)
	if err != nil {
		t.Fatal(err)
	}
	hubStream, err := hubJS.CreateStream(ctx, jetstream.StreamConfig{Name: "HUBS", Subjects: []string{"hubs.>"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hubStream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "HC", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	if _, err := hubJS.Publish(ctx, "hubs.a", []byte("from the hub")); err != nil {
		t.Fatal(err)
	}
	if _, err := hubJS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "HKV"}); err != nil {
		t.Fatal(err)
	}

	// What reaches the hub from jetgres, seen by a hub client that hears everything, up to a
	// marker that jetgres's client sends last, on the same path.
	leaked, err := hubNC.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	if err := hubNC.Flush(); err != nil {
		t.Fatal(err)
	}
	// The hub announces that interest to jetgres's server in its own time: until a probe
	// crosses, a leak would go unseen.
	testwait.For(t, 10*time.Second, func() error {
		if err := pgNC.Publish("domain.probe", nil); err != nil {
			return err
		}
		for {
			m, err := leaked.NextMsg(50 * time.Millisecond)
			if err != nil {
				return fmt.Errorf("no probe from jetgres's client on the hub: %w", err)
			}
			if m.Subject == "domain.probe" {
				return nil
			}
		}
	})

	pgJS, err := jetstream.New(pgNC)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("jetgres's own JetStream", func(t *testing.T) {
		s, err := pgJS.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 6 {
			ack, err := pgJS.Publish(ctx, fmt.Sprintf("orders.%d", i), []byte("o"))
			if err != nil {
				t.Fatal(err)
			}
			if ack.Stream != "ORDERS" || ack.Domain != "pg" {
				t.Fatalf("PubAck %+v, want stream ORDERS in domain pg", ack)
			}
		}
		ai, err := pgJS.AccountInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ai.Domain != "pg" || ai.Streams != 1 {
			t.Fatalf("account info: domain %q, %d streams; want domain pg, 1 stream", ai.Domain, ai.Streams)
		}
		c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "W", AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			t.Fatal(err)
		}
		// Each pull registers a literal $JS.API.CONSUMER.MSG.NEXT interest, what the hub
		// cut the link over.
		for range 3 {
			batch, err := c.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			for m := range batch.Messages() {
				if err := m.Ack(); err != nil {
					t.Fatal(err)
				}
			}
			if err := batch.Error(); err != nil {
				t.Fatal(err)
			}
		}
		kv, err := pgJS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "CONF"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
			t.Fatal(err)
		}
		checkStreamInfoDomain(t, pgNC, "$JS.API.STREAM.INFO.ORDERS", "pg")
		checkStreamInfoDomain(t, pgNC, "$JS.pg.API.STREAM.INFO.ORDERS", "pg")
	})

	t.Run("the hub through its domain", func(t *testing.T) {
		viaHub, err := jetstream.NewWithDomain(pgNC, "hub")
		if err != nil {
			t.Fatal(err)
		}
		ai, err := viaHub.AccountInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ai.Domain != "hub" {
			t.Fatalf("account info through $JS.hub.API: domain %q, want hub", ai.Domain)
		}
		info, err := viaHub.Stream(ctx, "HUBS")
		if err != nil {
			t.Fatal(err)
		}
		if info.CachedInfo().State.Msgs != 1 {
			t.Fatalf("HUBS through $JS.hub.API: %d messages, want 1", info.CachedInfo().State.Msgs)
		}
		ack, err := viaHub.Publish(ctx, "hubs.b", []byte("from jetgres's client"))
		if err != nil {
			t.Fatal(err)
		}
		if ack.Stream != "HUBS" || ack.Domain != "hub" || ack.Sequence != 2 {
			t.Fatalf("PubAck %+v, want HUBS seq 2 in domain hub", ack)
		}
		// Key-value subjects stay home, but a bucket of the hub is reached through the prefix.
		kv, err := viaHub.KeyValue(ctx, "HKV")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, "k", []byte("put by jetgres's client")); err != nil {
			t.Fatal(err)
		}
		hkv, err := hubJS.KeyValue(ctx, "HKV")
		if err != nil {
			t.Fatal(err)
		}
		if e, err := hkv.Get(ctx, "k"); err != nil || string(e.Value()) != "put by jetgres's client" {
			t.Fatalf("the hub's HKV k: %v, %v", e, err)
		}
	})

	t.Run("jetgres from the hub through its domain", func(t *testing.T) {
		viaPG, err := jetstream.NewWithDomain(hubNC, "pg")
		if err != nil {
			t.Fatal(err)
		}
		ai, err := viaPG.AccountInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ai.Domain != "pg" {
			t.Fatalf("account info through $JS.pg.API: domain %q, want pg", ai.Domain)
		}
		s, err := viaPG.CreateStream(ctx, jetstream.StreamConfig{Name: "FROMHUB", Subjects: []string{"fromhub.>"}})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			ack, err := viaPG.Publish(ctx, fmt.Sprintf("fromhub.%d", i), []byte("h"))
			if err != nil {
				t.Fatal(err)
			}
			if ack.Stream != "FROMHUB" || ack.Domain != "pg" {
				t.Fatalf("PubAck %+v, want FROMHUB in domain pg", ack)
			}
		}
		c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "R", AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			t.Fatal(err)
		}
		batch, err := c.Fetch(3, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for m := range batch.Messages() {
			got = append(got, m.Subject())
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := batch.Error(); err != nil {
			t.Fatal(err)
		}
		if want := []string{"fromhub.0", "fromhub.1", "fromhub.2"}; !slices.Equal(got, want) {
			t.Fatalf("fetched %v through $JS.pg.API, want %v", got, want)
		}
		ci, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ci.AckFloor.Stream != 3 {
			t.Fatalf("R's ack floor %d after acks from the hub, want 3", ci.AckFloor.Stream)
		}
		checkStreamInfoDomain(t, hubNC, "$JS.pg.API.STREAM.INFO.FROMHUB", "pg")
		kv, err := viaPG.KeyValue(ctx, "CONF")
		if err != nil {
			t.Fatal(err)
		}
		if e, err := kv.Get(ctx, "k"); err != nil || string(e.Value()) != "v" {
			t.Fatalf("jetgres's CONF k through $JS.pg.API: %v, %v", e, err)
		}
		if _, err := kv.Put(ctx, "k2", []byte("put from the hub")); err != nil {
			t.Fatal(err)
		}
		pkv, err := pgJS.KeyValue(ctx, "CONF")
		if err != nil {
			t.Fatal(err)
		}
		if e, err := pkv.Get(ctx, "k2"); err != nil || string(e.Value()) != "put from the hub" {
			t.Fatalf("jetgres's CONF k2: %v, %v", e, err)
		}
		// A watch is an ordered push consumer: deliveries, heartbeats and flow control
		// cross the leafnode to the hub's client, and its answers come back.
		w, err := kv.Watch(ctx, "k2")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = w.Stop() }()
		nextUpdate := func() jetstream.KeyValueEntry {
			t.Helper()
			for {
				select {
				case e := <-w.Updates():
					if e != nil {
						return e
					}
				case <-ctx.Done():
					t.Fatal("watch of CONF k2 from the hub: no update")
				}
			}
		}
		if e := nextUpdate(); string(e.Value()) != "put from the hub" {
			t.Fatalf("watch of CONF k2 from the hub: %q first", e.Value())
		}
		if _, err := pkv.Put(ctx, "k2", []byte("put by jetgres's client")); err != nil {
			t.Fatal(err)
		}
		if e := nextUpdate(); string(e.Value()) != "put by jetgres's client" {
			t.Fatalf("watch of CONF k2 from the hub: %q next", e.Value())
		}
		names := streamNames(ctx, t, pgJS)
		if !slices.Equal(names, []string{"FROMHUB", "KV_CONF", "ORDERS"}) {
			t.Fatalf("jetgres's streams %v, want FROMHUB, KV_CONF and ORDERS", names)
		}
	})

	t.Run("the nats CLI on either side", func(t *testing.T) {
		hubSide := natsServer{name: "hub", url: hub.ns.ClientURL()}
		pgSide := natsServer{name: "jetgres", url: j.natsURL}
		for _, c := range []struct {
			at        natsServer
			args      []string
			want, not []string
		}{
			{pgSide, nil, []string{"FROMHUB", "KV_CONF", "ORDERS"}, []string{"HUBS", "KV_HKV"}},
			{pgSide, []string{"--js-domain", "hub"}, []string{"HUBS", "KV_HKV"}, []string{"FROMHUB", "KV_CONF", "ORDERS"}},
			{hubSide, []string{"--js-domain", "pg"}, []string{"FROMHUB", "KV_CONF", "ORDERS"}, []string{"HUBS", "KV_HKV"}},
		} {
			args := append(slices.Clone(c.args), "stream", "ls", "--names")
			out := natsAt(t, c.at, args...)
			names := strings.Fields(out)
			for _, n := range c.want {
				if !slices.Contains(names, n) {
					t.Errorf("%s: nats %s lists no %s:\n%s", c.at.name, strings.Join(args, " "), n, out)
				}
			}
			for _, n := range c.not {
				if slices.Contains(names, n) {
					t.Errorf("%s: nats %s lists %s:\n%s", c.at.name, strings.Join(args, " "), n, out)
				}
			}
		}
	})

	t.Run("the hub untouched", func(t *testing.T) {
		if err := pgNC.Publish("domain.marker", nil); err != nil {
			t.Fatal(err)
		}
		if err := pgNC.Flush(); err != nil {
			t.Fatal(err)
		}
		for {
			m, err := leaked.NextMsg(10 * time.Second)
			if err != nil {
				t.Fatalf("the marker from jetgres's client did not reach the hub: %v", err)
			}
			if m.Subject == "domain.marker" {
				break
			}
			if fromJetgres(m) {
				t.Errorf("%s reached the hub from jetgres", m.Subject)
			}
		}
		if names := streamNames(ctx, t, hubJS); !slices.Equal(names, []string{"HUBS", "KV_HKV"}) {
			t.Errorf("the hub's streams %v, want HUBS and KV_HKV alone", names)
		}
		var consumers []string
		for n := range hubStream.ConsumerNames(ctx).Name() {
			consumers = append(consumers, n)
		}
		if !slices.Equal(consumers, []string{"HC"}) {
			t.Errorf("HUBS's consumers %v, want HC alone", consumers)
		}
		info, err := hubStream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != 2 {
			t.Errorf("HUBS holds %d messages, want 2", info.State.Msgs)
		}
		l, err := hub.leaf()
		if err != nil {
			t.Fatal(err)
		}
		if l.ID != leafID {
			t.Errorf("jetgres's leafnode connection is %d, was %d: the hub dropped it", l.ID, leafID)
		}
		for _, s := range l.Subs {
			for _, p := range []string{"$JS.API.", "$KV.", "$OBJ.", "$JETGRES."} {
				if strings.HasPrefix(s, p) {
					t.Errorf("jetgres registered %s on the hub", s)
				}
			}
		}
		if n := hub.violations.Load(); n != 0 {
			t.Errorf("the hub logged %d permission violations", n)
		}
	})
}

// fromJetgres says whether m is one that only jetgres's own JetStream may hear: its
// clients' API requests about jetgres's streams, its bucket's key-value subjects, its
// replicas'. (The hub's clients' own requests, and those that reach the hub through
// $JS.hub.API, mapped there to $JS.API and $KV of the hub's own bucket, are the hub's.
// So are deliveries to a hub client's inbox, which show the stored message's subject.)
func fromJetgres(m *nats.Msg) bool {
	subject := m.Subject
	if strings.HasPrefix(m.Reply, "$JS.ACK.") {
		return false
	}
	if strings.HasPrefix(subject, "$JS.API.") {
		return strings.Contains(subject, "ORDERS") || strings.Contains(subject, "KV_CONF")
	}
	return strings.HasPrefix(subject, "$KV.CONF.") || strings.HasPrefix(subject, "$OBJ.") || strings.HasPrefix(subject, "$JETGRES.")
}

// checkStreamInfoDomain asks for a stream's info on subject and checks the domain it reports.
func checkStreamInfoDomain(t *testing.T, nc *nats.Conn, subject, domain string) {
	t.Helper()
	m, err := nc.Request(subject, nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var si struct {
		Domain string          `json:"domain"`
		Error  json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &si); err != nil || si.Error != nil {
		t.Fatalf("%s: %s (%v)", subject, m.Data, err)
	}
	if si.Domain != domain {
		t.Fatalf("%s: domain %q, want %q", subject, si.Domain, domain)
	}
}

func streamNames(ctx context.Context, t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	var names []string
	l := js.StreamNames(ctx)
	for n := range l.Name() {
		names = append(names, n)
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

// A domain nats-server would refuse, and a gateway, are refused before PostgreSQL starts.
func TestDomainRefusedEarly(t *testing.T) {
	gateway := filepath.Join(t.TempDir(), "gateway.conf")
	if err := os.WriteFile(gateway, []byte("gateway { name: other, port: -1 }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args    []string
		mention string
	}{
		{[]string{"--js-domain", "a.b"}, "may not contain"},
		{[]string{"--js-domain", "ACK"}, "reserved"},
		{[]string{"--nats-config", gateway}, "gateways are not supported"},
	} {
		j := launchJetgres(t, options{Args: c.args})
		err := j.wait(stopTimeout)
		var exit interface{ ExitCode() int }
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Errorf("%q: %v, want exit code 1", c.args, err)
		}
		logs := j.logs.String()
		if !strings.Contains(logs, c.mention) {
			t.Errorf("%q: output does not mention %q:\n%s", c.args, c.mention, logs)
		}
		if strings.Contains(logs, "starting private PostgreSQL") {
			t.Errorf("%q: PostgreSQL started before the domain was checked", c.args)
		}
	}
}
