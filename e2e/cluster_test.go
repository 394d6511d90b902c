package e2e

// Several replicas: three jetgres processes on one PostgreSQL, their embedded servers routed
// into one NATS cluster with the clustering flags.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// freePorts returns n loopback ports free at the time of the call.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var out []int
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		_ = ln.Close()
	}
	return out
}

// startCluster starts n replicas on dsn, each routed to all the others, and waits until
// each one's clients learn of the others' URLs (the cluster formed).
func startCluster(t *testing.T, dsn string, n int, args ...string) []*jetgres {
	t.Helper()
	ports := freePorts(t, n)
	var routes []string
	for _, p := range ports {
		routes = append(routes, "nats://127.0.0.1:"+strconv.Itoa(p))
	}
	var js []*jetgres
	for i, p := range ports {
		a := append([]string{"--database-url", dsn,
			"--replica-name", fmt.Sprintf("r%d", i+1),
			"--cluster", "127.0.0.1:" + strconv.Itoa(p),
			"--routes", strings.Join(routes, ","),
		}, args...)
		j := launchJetgres(t, options{Args: a})
		failOnRace(t, j)
		js = append(js, j)
	}
	for _, j := range js {
		j.waitReady(t)
	}
	for _, j := range js {
		nc, err := nats.Connect(j.natsURL, nats.MaxReconnects(0))
		if err != nil {
			t.Fatal(err)
		}
		testwait.For(t, 30*time.Second, func() error {
			if got := len(nc.DiscoveredServers()); got < n-1 {
				return fmt.Errorf("%s knows %d other servers, want %d", j.natsURL, got, n-1)
			}
			return nil
		})
		nc.Close()
	}
	return js
}

// TestThreeReplicas runs three clustered replicas on one PostgreSQL: publishes through every
// replica are stored once each with dense sequences, every API call gets one answer, three
// clients of one durable pull consumer on different replicas share its messages without
// overlap, and after a SIGKILL of the replica serving it another delivers within 2 s.
func TestThreeReplicas(t *testing.T) {
	t.Parallel()
	const stream = "TRIO"
	perReplica := 10_000
	if soak() {
		perReplica = 34_000
	}
	dsn := testDatabase(t)
	reps := startCluster(t, dsn, 3, "--lease", "2s")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// One answer per API call: the CLI fails on a second, contradicting one.
	out := reps[1].nats(t, "stream", "add", stream, "--subjects", "trio.>", "--defaults")
	if strings.Contains(out, "already in use") {
		t.Fatalf("nats stream add answered twice:\n%s", out)
	}
	jss := make([]jetstream.JetStream, len(reps))
	for i, r := range reps {
		_, jss[i] = r.connect(t)
		// Seen at once by every replica.
		if _, err := jss[i].Stream(ctx, stream); err != nil {
			t.Fatalf("stream info through replica %d: %v", i+1, err)
		}
	}
	// Two overlapping streams are refused whichever replica is asked.
	if _, err := jss[2].CreateStream(ctx, jetstream.StreamConfig{Name: "OVER", Subjects: []string{"trio.a"}}); err == nil {
		t.Fatal("a stream overlapping TRIO was created")
	}

	var wg sync.WaitGroup
	for i := range reps {
		wg.Go(func() {
			publishAll(t, ctx, jss[i], fmt.Sprintf("trio.r%d", i+1), perReplica, func(k int) []byte { return []byte(strconv.Itoa(k)) })
		})
	}
	wg.Wait()
	total := uint64(3 * perReplica)
	for i := range reps {
		s, err := jss[i].Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		if st := s.CachedInfo().State; st.Msgs != total || st.FirstSeq != 1 || st.LastSeq != total {
			t.Fatalf("through replica %d: %d messages, sequences %d..%d; want %d stored once, 1..%d",
				i+1, st.Msgs, st.FirstSeq, st.LastSeq, total, total)
		}
	}

	if _, err := jss[0].CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "work", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	seen := make([]map[uint64]bool, len(reps))
	var seenMu sync.Mutex
	countAll := func() int {
		seenMu.Lock()
		defer seenMu.Unlock()
		n := 0
		for _, m := range seen {
			n += len(m)
		}
		return n
	}
	fetchCtx, stopFetch := context.WithCancel(ctx)
	var fetchers sync.WaitGroup
	fetchErrs := make(chan error, len(reps))
	for i := range reps {
		seen[i] = make(map[uint64]bool)
		fetchers.Go(func() {
			cons, err := jss[i].Consumer(ctx, stream, "work")
			if err != nil {
				fetchErrs <- err
				return
			}
			for fetchCtx.Err() == nil {
				batch, err := cons.Fetch(100, jetstream.FetchMaxWait(time.Second))
				if err != nil {
					continue
				}
				for m := range batch.Messages() {
					md, err := m.Metadata()
					if err != nil {
						fetchErrs <- err
						return
					}
					seenMu.Lock()
					seen[i][md.Sequence.Stream] = true
					seenMu.Unlock()
					_ = m.Ack()
				}
			}
		})
	}
	testwait.For(t, 3*time.Minute, func() error {
		select {
		case err := <-fetchErrs:
			t.Fatalf("fetch: %v", err)
		default:
		}
		if n := countAll(); n < int(total) {
			return fmt.Errorf("%d of %d fetched", n, total)
		}
		return nil
	})
	stopFetch()
	fetchers.Wait()
	union := make(map[uint64]int)
	for i, m := range seen {
		if len(m) == 0 {
			t.Errorf("the client on replica %d received nothing", i+1)
		}
		for seq := range m {
			union[seq]++
		}
	}
	for seq := uint64(1); seq <= total; seq++ {
		if union[seq] != 1 {
			t.Fatalf("sequence %d was received by %d clients, want 1", seq, union[seq])
		}
	}

	// SIGKILL the replica that serves the consumer; another serves it within 2 s.
	serving := -1
	for i, r := range reps {
		_, body := r.mustGet(t, "/metrics")
		if metricValue(t, body, "jetgres_consumers_served") == 1 {
			serving = i
		}
	}
	if serving < 0 {
		t.Fatal("no replica reports serving the consumer")
	}
	other := (serving + 1) % len(reps)
	if _, err := jss[other].Publish(ctx, "trio.after", []byte("x")); err != nil {
		t.Fatal(err)
	}
	cons, err := jss[other].Consumer(ctx, stream, "work")
	if err != nil {
		t.Fatal(err)
	}
	reps[serving].kill(t)
	killed := time.Now()
	var resumed time.Duration
	for resumed == 0 {
		if time.Since(killed) > 30*time.Second {
			t.Fatal("no delivery within 30 s of the SIGKILL")
		}
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(250*time.Millisecond))
		if err != nil && !errors.Is(err, nats.ErrTimeout) {
			continue
		}
		for m := range batch.Messages() {
			resumed = time.Since(killed)
			_ = m.Ack()
		}
	}
	t.Logf("FIGURES replicas=3 published=%d takeover_after_sigkill=%v", total, resumed.Round(time.Millisecond))
	if resumed > 2*time.Second {
		t.Errorf("delivery resumed %v after the SIGKILL, want within 2 s", resumed)
	}
}
