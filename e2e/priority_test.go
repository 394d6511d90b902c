package e2e

// Priority groups on pull consumers through nats.go's jetstream package and the nats CLI,
// on a real JetStream and on jetgres: a pinned consumer with two clients and a failover
// between them, and the CLI's consumer add, info and unpin.

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// pinnedClient is one client of a pinned consumer, on a connection of its own, noting
// what it received.
type pinnedClient struct {
	name string
	nc   *nats.Conn
	mu   sync.Mutex
	got  map[int]bool
}

func (c *pinnedClient) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.got)
}

// has reports whether it received every job from from up to to.
func (c *pinnedClient) has(from, to int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := from; i < to; i++ {
		if !c.got[i] {
			return false
		}
	}
	return true
}

// TestPinnedConsumerFailover: two clients consume a pinned_client consumer's group; one
// is pinned and receives every message while the other waits. The pinned client's
// connection drops; once pinned_ttl passes the other takes the pin and receives the rest,
// and, after ack_wait, what the first received without its ack reaching the server.
func TestPinnedConsumerFailover(t *testing.T) {
	t.Parallel()
	onBoth(t, func(t *testing.T, s natsServer) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		admin, err := jetstream.New(connectURL(t, s.url))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admin.CreateStream(ctx, jetstream.StreamConfig{Name: "JOBS", Subjects: []string{"jobs.>"}}); err != nil {
			t.Fatal(err)
		}
		const ttl = 2 * time.Second
		if _, err := admin.CreateOrUpdateConsumer(ctx, "JOBS", jetstream.ConsumerConfig{
			Durable: "W", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 3 * time.Second,
			PriorityPolicy: jetstream.PriorityPolicyPinned, PriorityGroups: []string{"workers"}, PinnedTTL: ttl,
		}); err != nil {
			t.Fatalf("%s: create pinned consumer: %v", s.name, err)
		}

		clients := []*pinnedClient{{name: "a"}, {name: "b"}}
		for _, c := range clients {
			c.nc = connectURL(t, s.url)
			js, err := jetstream.New(c.nc)
			if err != nil {
				t.Fatal(err)
			}
			cons, err := js.Consumer(ctx, "JOBS", "W")
			if err != nil {
				t.Fatal(err)
			}
			c.got = map[int]bool{}
			cc, err := cons.Consume(func(m jetstream.Msg) {
				var job int
				if _, err := fmt.Sscanf(string(m.Data()), "job %d", &job); err != nil {
					t.Errorf("%s: received %q", s.name, m.Data())
				}
				c.mu.Lock()
				c.got[job] = true
				c.mu.Unlock()
				_ = m.Ack()
			}, jetstream.PullPriorityGroup("workers"), jetstream.PullExpiry(time.Second))
			if err != nil {
				t.Fatalf("%s: consume: %v", s.name, err)
			}
			t.Cleanup(cc.Stop)
		}
		publish := func(from, to int) {
			for i := from; i < to; i++ {
				if _, err := admin.Publish(ctx, "jobs.x", fmt.Appendf(nil, "job %d", i)); err != nil {
					t.Fatal(err)
				}
			}
		}
		publish(0, 50)
		testwait.For(t, 30*time.Second, func() error {
			if a, b := clients[0].count(), clients[1].count(); a+b < 50 {
				return fmt.Errorf("%s: received %d and %d of 50", s.name, a, b)
			}
			return nil
		})
		pinned, other := clients[0], clients[1]
		if pinned.count() == 0 {
			pinned, other = other, pinned
		}
		if pinned.count() != 50 || other.count() != 0 {
			t.Fatalf("%s: the first 50 went %d to %s and %d to %s, want all to the pinned one", s.name, pinned.count(), pinned.name, other.count(), other.name)
		}
		info, err := admin.Consumer(ctx, "JOBS", "W")
		if err != nil {
			t.Fatal(err)
		}
		if pg := info.CachedInfo().PriorityGroups; len(pg) != 1 || pg[0].Group != "workers" || pg[0].PinnedClientID == "" {
			t.Fatalf("%s: priority groups %+v, want workers pinned", s.name, pg)
		}
		oldPin := info.CachedInfo().PriorityGroups[0].PinnedClientID

		// The pinned client vanishes: it asks no more, and the pin lapses after pinned_ttl.
		pinned.nc.Close()
		gone := time.Now()
		publish(50, 100)
		testwait.For(t, 30*time.Second, func() error {
			if !other.has(50, 100) {
				return fmt.Errorf("%s: %s took over %d messages, not yet all of 50 to 99", s.name, other.name, other.count())
			}
			return nil
		})
		took := time.Since(gone)
		t.Logf("%s: %s took over %v after the pinned client went", s.name, other.name, took.Round(time.Millisecond))
		if took < ttl/2 {
			t.Errorf("%s: %s took over after %v, before pinned_ttl %v could pass", s.name, other.name, took, ttl)
		}
		testwait.For(t, 30*time.Second, func() error {
			for i := range 50 {
				if !pinned.has(i, i+1) && !other.has(i, i+1) {
					return fmt.Errorf("%s: job %d received by neither", s.name, i)
				}
			}
			return nil
		})
		info, err = admin.Consumer(ctx, "JOBS", "W")
		if err != nil {
			t.Fatal(err)
		}
		if pg := info.CachedInfo().PriorityGroups; len(pg) != 1 || pg[0].PinnedClientID == "" || pg[0].PinnedClientID == oldPin {
			t.Errorf("%s: priority groups after the failover %+v, want a new pin (old %s)", s.name, pg, oldPin)
		}
	})
}

// TestPriorityGroupsCLI creates consumers with priority groups with the nats CLI, shows
// them and unpins one, on a real JetStream and on jetgres, and compares what it prints.
// The CLI's --overflow-groups is left out: v0.5.0 sends the policy without the groups,
// which JetStream refuses (10159) as jetgres does.
func TestPriorityGroupsCLI(t *testing.T) {
	t.Parallel()
	servers := []natsServer{startJetStream(t), {name: "jetgres", url: startWithDatabase(t, testDatabase(t)).natsURL}}
	var out [2][]string
	for i, s := range servers {
		natsAt(t, s, "stream", "add", "PG", "--subjects", "pg.>", "--defaults")
		for _, args := range [][]string{
			{"consumer", "add", "PG", "PIN", "--pull", "--pinned-groups", "jobs", "--pinned-ttl", "1m", "--defaults"},
			{"consumer", "add", "PG", "PRIO", "--pull", "--prioritized-groups", "jobs", "--defaults"},
		} {
			out[i] = append(out[i], natsAt(t, s, args...))
		}
		// The CLI unpins only a group that has a pinned client: a fetch in the group pins one.
		pinClient(t, s, "PG", "PIN", "jobs")
		for _, args := range [][]string{
			{"consumer", "info", "PG", "PIN"},
			{"consumer", "unpin", "PG", "PIN", "jobs", "-f"},
		} {
			out[i] = append(out[i], natsAt(t, s, args...))
		}
		var info struct {
			Config struct {
				Policy string        `json:"priority_policy"`
				Groups []string      `json:"priority_groups"`
				TTL    time.Duration `json:"priority_timeout"`
			} `json:"config"`
			Groups []struct {
				Group string `json:"group"`
			} `json:"priority_groups"`
		}
		if err := json.Unmarshal([]byte(natsAt(t, s, "consumer", "info", "PG", "PIN", "--json")), &info); err != nil {
			t.Fatalf("%s: consumer info: %v", s.name, err)
		}
		if info.Config.Policy != "pinned_client" || strings.Join(info.Config.Groups, ",") != "jobs" || info.Config.TTL != time.Minute ||
			len(info.Groups) != 1 || info.Groups[0].Group != "jobs" {
			t.Errorf("%s: consumer info %+v", s.name, info)
		}
	}
	for k := range out[0] {
		if a, b := cliVolatile.ReplaceAllString(out[0][k], "X"), cliVolatile.ReplaceAllString(out[1][k], "X"); a != b {
			t.Errorf("nats output %d differs:\n--- jetstream\n%s\n--- jetgres\n%s", k, out[0][k], out[1][k])
		}
	}
}

// pinClient publishes a message to stream and fetches it through consumer in group, which
// pins the fetching client.
func pinClient(t *testing.T, s natsServer, stream, consumer, group string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(connectURL(t, s.url))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, strings.ToLower(stream)+".x", []byte("m")); err != nil {
		t.Fatalf("%s: publish: %v", s.name, err)
	}
	cons, err := js.Consumer(ctx, stream, consumer)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchPriorityGroup(group), jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatalf("%s: fetch: %v", s.name, err)
	}
	n := 0
	for range batch.Messages() {
		n++
	}
	if n != 1 || batch.Error() != nil {
		t.Fatalf("%s: fetched %d messages, %v", s.name, n, batch.Error())
	}
}

// cliVolatile matches what the CLI prints that differs between any two servers: times,
// durations, pin ids, the server's name and version, the cluster block.
var cliVolatile = regexp.MustCompile(`\b[A-Za-z0-9]{22}\b|\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}\S*|[0-9.]+(ns|µs|ms|s)\b|\d{2}:\d{2}:\d{2}|(Cluster Name|Leader|Name|Version|Host Version|Required API Level|Created|Timestamp): .*`)

// TestPinnedConsumerAcrossReplicas: two replicas, a pinned consumer served by one of them,
// a client on each. The pin lives with the serving replica: the info and an unpin sent
// through the other replica reach it there. When the serving replica dies, the other
// takes the consumer over with no pin, as a new JetStream leader does, gives a new one to
// the client left, and that client receives the rest, the unacknowledged redelivered.
func TestPinnedConsumerAcrossReplicas(t *testing.T) {
	t.Parallel()
	reps := startCluster(t, testDatabase(t), 2)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var jss [2]jetstream.JetStream
	for i, r := range reps {
		_, jss[i] = r.connect(t)
	}
	if _, err := jss[0].CreateStream(ctx, jetstream.StreamConfig{Name: "PJOBS", Subjects: []string{"pjobs.>"}}); err != nil {
		t.Fatal(err)
	}
	// pinned_ttl is longer than the test: a new pin after the takeover is the takeover's.
	if _, err := jss[0].CreateOrUpdateConsumer(ctx, "PJOBS", jetstream.ConsumerConfig{
		Durable: "W", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 3 * time.Second,
		PriorityPolicy: jetstream.PriorityPolicyPinned, PriorityGroups: []string{"workers"}, PinnedTTL: 10 * time.Minute,
	}); err != nil {
		t.Fatal(err)
	}
	info := func(i int) *jetstream.ConsumerInfo {
		t.Helper()
		c, err := jss[i].Consumer(ctx, "PJOBS", "W")
		if err != nil {
			t.Fatalf("consumer info through r%d: %v", i+1, err)
		}
		return c.CachedInfo()
	}
	// Until its forwarding subscription reaches the other replica, that one answers from
	// PostgreSQL, which knows no pin: wait until both answer from the serving replica.
	var serving int
	testwait.For(t, 30*time.Second, func() error {
		l0, l1 := info(0).Cluster, info(1).Cluster
		if l0 == nil || l1 == nil || l0.Leader != l1.Leader || l0.Leader == "" {
			return fmt.Errorf("leaders %+v and %+v", l0, l1)
		}
		serving = map[string]int{"r1": 0, "r2": 1}[l0.Leader]
		return nil
	})
	other := 1 - serving
	clients := [2]*pinnedClient{{name: "on r1", got: map[int]bool{}}, {name: "on r2", got: map[int]bool{}}}
	for i, c := range clients {
		cons, err := jss[i].Consumer(ctx, "PJOBS", "W")
		if err != nil {
			t.Fatal(err)
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			var job int
			if _, err := fmt.Sscanf(string(m.Data()), "job %d", &job); err != nil {
				t.Errorf("received %q", m.Data())
			}
			c.mu.Lock()
			c.got[job] = true
			c.mu.Unlock()
			_ = m.Ack()
		}, jetstream.PullPriorityGroup("workers"), jetstream.PullExpiry(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cc.Stop)
	}
	// A publish that a route hands to the replica just killed is lost unanswered, so each
	// waits 5 s and is sent again, as an application does, with a message id that keeps
	// the retry from storing it twice.
	publish := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			for {
				pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := jss[other].Publish(pctx, "pjobs.x", fmt.Appendf(nil, "job %d", i), jetstream.WithMsgID(fmt.Sprintf("job-%d", i)))
				cancel()
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("publishing job %d: %v", i, err)
				}
			}
		}
	}
	received := func(from, to int) error {
		for i := from; i < to; i++ {
			if !clients[0].has(i, i+1) && !clients[1].has(i, i+1) {
				return fmt.Errorf("job %d received by neither client (%d and %d received)", i, clients[0].count(), clients[1].count())
			}
		}
		return nil
	}
	publish(0, 20)
	testwait.For(t, 30*time.Second, func() error { return received(0, 20) })
	if clients[0].count() > 0 && clients[1].count() > 0 {
		t.Fatalf("both clients received while one was pinned: %d and %d", clients[0].count(), clients[1].count())
	}
	pin := func(i int) string {
		if pg := info(i).PriorityGroups; len(pg) == 1 {
			return pg[0].PinnedClientID
		}
		return ""
	}
	first := pin(serving)
	if first == "" {
		t.Fatal("no pin through the serving replica")
	}
	// The other replica forwards the info to the serving one once its forwarding
	// subscription has reached it, and answers from the stored row, which has no pin, until
	// then (seen under CI load).
	testwait.For(t, 10*time.Second, func() error {
		if p := pin(other); p != first {
			return fmt.Errorf("pin through the serving replica %q, through the other %q", first, p)
		}
		return nil
	})

	// An unpin through the replica that does not serve the consumer is forwarded to the
	// one that does; the next request takes a new pin there.
	st, err := jss[other].Stream(ctx, "PJOBS")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.UnpinConsumer(ctx, "W", "workers"); err != nil {
		t.Fatalf("unpin through r%d: %v", other+1, err)
	}
	publish(20, 30)
	testwait.For(t, 30*time.Second, func() error {
		if p := pin(other); p == "" || p == first {
			return fmt.Errorf("pin after the unpin %q (before %q)", p, first)
		}
		return received(20, 30)
	})
	second := pin(serving)

	// The serving replica dies, and its client with it.
	reps[serving].kill(t)
	publish(30, 60)
	testwait.For(t, 60*time.Second, func() error {
		if !clients[other].has(30, 60) {
			return fmt.Errorf("the client on r%d received %d, not yet all of 30 to 59", other+1, clients[other].count())
		}
		return received(0, 60)
	})
	ci := info(other)
	if ci.Cluster == nil || ci.Cluster.Leader != fmt.Sprintf("r%d", other+1) {
		t.Errorf("after the takeover the consumer is served by %+v, want r%d", ci.Cluster, other+1)
	}
	if p := pin(other); p == "" || p == first || p == second {
		t.Errorf("pin after the takeover %q, want a new one (before %q, %q)", p, first, second)
	}
}
