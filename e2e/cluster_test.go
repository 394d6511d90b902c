package e2e

// Several replicas: three jetgres processes on one PostgreSQL, their embedded servers routed
// into one NATS cluster with the clustering flags.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"gopkg.in/yaml.v3"

	"github.com/jetgres/jetgres/bridge"
	"github.com/jetgres/jetgres/embedded/localpg"
	"github.com/jetgres/jetgres/internal/testwait"
)

// freePorts returns n loopback ports free at the time of the call.
func freePorts(t testing.TB, n int) []int {
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

// cluster is n replicas on one database, each routed to all the others.
type cluster struct {
	t    testing.TB
	args [][]string
	mu   sync.Mutex // guards reps against the load generators' reads
	reps []*jetgres
}

// startCluster starts n replicas on dsn, each routed to all the others, and waits until
// each one's clients learn of the others' URLs (the cluster formed).
func startCluster(t testing.TB, dsn string, n int, args ...string) []*jetgres {
	return newCluster(t, dsn, n, args...).reps
}

func newCluster(t testing.TB, dsn string, n int, args ...string) *cluster {
	t.Helper()
	return newClusterOn(t, slices.Repeat([]string{dsn}, n), args...)
}

// newClusterOn starts one replica per database URL, all of one database.
func newClusterOn(t testing.TB, dsns []string, args ...string) *cluster {
	t.Helper()
	n := len(dsns)
	ports := freePorts(t, n)
	var routes []string
	for _, p := range ports {
		routes = append(routes, "nats://127.0.0.1:"+strconv.Itoa(p))
	}
	c := &cluster{t: t}
	for i, p := range ports {
		c.args = append(c.args, append([]string{"--database-url", dsns[i],
			"--replica-name", fmt.Sprintf("r%d", i+1),
			"--cluster", "127.0.0.1:" + strconv.Itoa(p),
			"--routes", strings.Join(routes, ","),
		}, args...))
		j := launchJetgres(t, options{Args: c.args[i]})
		failOnRace(t, j)
		c.reps = append(c.reps, j)
	}
	for _, j := range c.reps {
		j.waitReady(t)
	}
	for _, j := range c.reps {
		c.waitRouted(j)
	}
	return c
}

// waitRouted waits until a client of j learns of every other replica.
func (c *cluster) waitRouted(j *jetgres) {
	c.t.Helper()
	nc, err := nats.Connect(j.natsURL, nats.MaxReconnects(0))
	if err != nil {
		c.t.Fatal(err)
	}
	defer nc.Close()
	testwait.For(c.t, 30*time.Second, func() error {
		if got := len(nc.DiscoveredServers()); got < len(c.reps)-1 {
			return fmt.Errorf("%s knows %d other servers, want %d", j.natsURL, got, len(c.reps)-1)
		}
		return nil
	})
}

// restart starts replica i again, under its name and route port, after it stopped.
func (c *cluster) restart(i int) {
	c.t.Helper()
	j := startJetgres(c.t, options{Args: c.args[i]})
	failOnRace(c.t, j)
	c.mu.Lock()
	c.reps[i] = j
	c.mu.Unlock()
	c.waitRouted(j)
}

// stop stops every replica.
func (c *cluster) stop() {
	c.t.Helper()
	for i := range c.reps {
		if r := c.rep(i); !r.hasExited() {
			r.stop(c.t)
		}
	}
}

// rep returns replica i as it runs now.
func (c *cluster) rep(i int) *jetgres {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reps[i]
}

// urls lists the client URLs of the replicas running now.
func (c *cluster) urls() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, r := range c.reps {
		if !r.hasExited() {
			out = append(out, r.natsURL)
		}
	}
	return strings.Join(out, ",")
}

// serving returns the replica that serves count consumers, or -1.
func (c *cluster) serving(count float64) int {
	c.mu.Lock()
	reps := slices.Clone(c.reps)
	c.mu.Unlock()
	for i, r := range reps {
		if r.hasExited() {
			continue
		}
		code, body, err := r.get("/metrics")
		if err != nil || code != 200 {
			continue
		}
		if parseMetrics(body)["jetgres_consumers_served"] == count {
			return i
		}
	}
	return -1
}

// takeoverLease is the --lease of the replica tests, the default. A replica killed outright
// gives its consumers up at once (PostgreSQL ends its session and frees its locks), so they
// must be served again before a lease could have passed. A shorter lease makes a loaded
// machine fence replicas that are alive: their ownership statements time out at a tenth of
// it, and every consumer they serve moves.
const takeoverLease = bridge.LeaseDefault

// TestThreeReplicas runs three clustered replicas on one PostgreSQL: publishes through every
// replica are stored once each with dense sequences, every API call gets one answer, three
// clients of one durable pull consumer on different replicas share its messages without
// overlap, and after a SIGKILL of the replica serving it another delivers at once, not
// once a lease has run out (the time it takes is BenchmarkReplicas' business).
func TestThreeReplicas(t *testing.T) {
	t.Parallel()
	const stream = "TRIO"
	perReplica := 10_000
	if soak() {
		perReplica = 34_000
	}
	dsn := testDatabase(t)
	reps := startCluster(t, dsn, 3, "--lease", takeoverLease.String())
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
	// Each API request gets one answer, whichever replica the client is on.
	for i, r := range reps {
		nc, _ := r.connect(t)
		for _, subj := range []string{"$JS.API.INFO", "$JS.API.STREAM.INFO." + stream, "$JS.API.STREAM.NAMES"} {
			inbox := nats.NewInbox()
			sub, err := nc.SubscribeSync(inbox)
			if err != nil {
				t.Fatal(err)
			}
			if err := nc.PublishRequest(subj, inbox, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := sub.NextMsg(10 * time.Second); err != nil {
				t.Fatalf("%s through replica %d: %v", subj, i+1, err)
			}
			if m, err := sub.NextMsg(300 * time.Millisecond); err == nil {
				t.Fatalf("%s through replica %d answered twice: %s", subj, i+1, m.Data)
			}
			_ = sub.Unsubscribe()
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
	pulled := newReceipts(len(reps))
	fetchCtx, stopFetch := context.WithCancel(ctx)
	var fetchers sync.WaitGroup
	fetchErrs := make(chan error, len(reps))
	for i := range reps {
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
					pulled.note(i, md.Sequence.Stream, md.NumDelivered)
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
		if n := pulled.covered(); n < int(total) {
			return fmt.Errorf("%d of %d fetched", n, total)
		}
		return nil
	})
	stopFetch()
	fetchers.Wait()
	pulled.check(t, total, "pulled by the client on replica", fencedAny(t, reps))

	// A push consumer with a deliver group, its members on every replica.
	if _, err := jss[0].CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "pushwork",
		DeliverSubject: "deliver.trio", DeliverGroup: "grp", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	pushed := newReceipts(len(reps))
	for i, r := range reps {
		nc, _ := r.connect(t)
		if _, err := nc.QueueSubscribe("deliver.trio", "grp", func(m *nats.Msg) {
			md, err := m.Metadata()
			if err != nil {
				return
			}
			pushed.note(i, md.Sequence.Stream, md.NumDelivered)
			_ = m.Ack()
		}); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, 3*time.Minute, func() error {
		if n := pushed.covered(); n < int(total) {
			return fmt.Errorf("%d of %d pushed", n, total)
		}
		return nil
	})
	spread := pushed.check(t, total, "pushed to the group member on replica", fencedAny(t, reps))
	t.Logf("push deliveries per group member: %v", spread)

	// Update and pause the pull consumer through each replica in turn: the one that serves
	// it decides and answers, and every replica's info then agrees.
	leaderOf := func(info *jetstream.ConsumerInfo) string {
		if info.Cluster == nil {
			return ""
		}
		return info.Cluster.Leader
	}
	for i := range reps {
		desc := fmt.Sprintf("updated through replica %d", i+1)
		upd, err := jss[i].UpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "work", AckPolicy: jetstream.AckExplicitPolicy, Description: desc})
		if err != nil {
			t.Fatalf("updating the consumer through replica %d: %v", i+1, err)
		}
		if got := upd.CachedInfo(); got.Config.Description != desc || leaderOf(got) == "" {
			t.Fatalf("update through replica %d answered description %q, leader %q", i+1, got.Config.Description, leaderOf(got))
		}
		until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
		if p, err := jss[i].PauseConsumer(ctx, stream, "work", until); err != nil || !p.Paused || !p.PauseUntil.Equal(until) {
			t.Fatalf("pausing the consumer through replica %d: %+v %v", i+1, p, err)
		}
		leader := leaderOf(upd.CachedInfo())
		for j := range reps {
			c, err := jss[j].Consumer(ctx, stream, "work")
			if err != nil {
				t.Fatal(err)
			}
			got := c.CachedInfo()
			if got.Config.Description != desc || !got.Paused || got.Config.PauseUntil == nil || !got.Config.PauseUntil.Equal(until) || leaderOf(got) != leader {
				t.Fatalf("info through replica %d after changes through replica %d: description %q, paused %v until %v, leader %q; want %q, paused until %v, leader %q",
					j+1, i+1, got.Config.Description, got.Paused, got.Config.PauseUntil, leaderOf(got), desc, until, leader)
			}
		}
		if p, err := jss[(i+1)%len(reps)].ResumeConsumer(ctx, stream, "work"); err != nil || p.Paused {
			t.Fatalf("resuming the consumer through replica %d: %+v %v", (i+1)%len(reps)+1, p, err)
		}
	}
	for j := range reps {
		c, err := jss[j].Consumer(ctx, stream, "work")
		if err != nil {
			t.Fatal(err)
		}
		if c.CachedInfo().Paused {
			t.Fatalf("info through replica %d: still paused after the resume", j+1)
		}
	}

	// More consumers, so that the takeover below shows how the killed replica's spread.
	const spreadN = 11
	for k := range spreadN - 1 {
		if _, err := jss[k%len(reps)].CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: fmt.Sprintf("spread%d", k), AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
			t.Fatal(err)
		}
	}
	leaders := func(via int) (map[string]int, error) {
		out := make(map[string]int)
		st, err := jss[via].Stream(ctx, stream)
		if err != nil {
			return nil, err
		}
		l := st.ListConsumers(ctx)
		for info := range l.Info() {
			out[leaderOf(info)]++
		}
		return out, l.Err()
	}
	before, err := leaders(0)
	if err != nil {
		t.Fatal(err)
	}

	// SIGKILL the replica that serves the consumer; another serves it before a lease passes.
	info, err := jss[0].Consumer(ctx, stream, "work")
	if err != nil {
		t.Fatal(err)
	}
	cl := info.CachedInfo().Cluster
	serving := -1
	if cl != nil {
		_, _ = fmt.Sscanf(cl.Leader, "r%d", &serving)
		serving--
	}
	if serving < 0 || cl.Name != "jetgres" {
		t.Fatalf("consumer info's cluster block %+v names no replica of cluster jetgres", cl)
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
	if resumed >= takeoverLease {
		t.Errorf("delivery resumed %v after the SIGKILL, not before the lease of %v: the dead replica's consumer was not given up at once", resumed, takeoverLease)
	}

	// The killed replica's consumers spread over the two left: each takes no more than its
	// share while their leases run (one more when it looked twice before the other did).
	dead := fmt.Sprintf("r%d", serving+1)
	var after map[string]int
	testwait.For(t, 30*time.Second, func() error {
		var err error
		if after, err = leaders(other); err != nil {
			return err
		}
		if after[dead] > 0 || after[""] > 0 {
			return fmt.Errorf("served by: %v", after)
		}
		return nil
	})
	t.Logf("consumers per replica before the SIGKILL of %s: %v; after: %v", dead, before, after)
	all := 0
	for _, n := range before {
		all += n
	}
	share := (all + 1) / 2
	for name, n := range after {
		if n > max(share+1, before[name]) {
			t.Errorf("%s serves %d of %d consumers after the takeover (%d before), want at most %d", name, n, all, before[name], max(share+1, before[name]))
		}
	}
}

// receipts is what the clients of one consumer, one per replica, received.
type receipts struct {
	mu    sync.Mutex
	by    []map[uint64]bool // the sequences each client received
	fresh map[uint64]int    // deliveries of each sequence that were not redeliveries
	all   map[uint64]bool
	again int
}

func newReceipts(clients int) *receipts {
	r := &receipts{fresh: make(map[uint64]int), all: make(map[uint64]bool)}
	for range clients {
		r.by = append(r.by, make(map[uint64]bool))
	}
	return r
}

func (r *receipts) note(client int, seq, delivered uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.by[client][seq] = true
	r.all[seq] = true
	if delivered == 1 {
		r.fresh[seq]++
	} else {
		r.again++
	}
}

// fencedAny reports whether any of reps stopped its consumers for want of a confirmed lease.
func fencedAny(t *testing.T, reps []*jetgres) bool {
	t.Helper()
	for _, r := range reps {
		m, err := r.metrics()
		if err != nil {
			t.Fatalf("/metrics: %v", err)
		}
		if m["jetgres_consumer_fencings_total"] > 0 {
			return true
		}
	}
	return false
}

// covered counts the distinct sequences received.
func (r *receipts) covered() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.all)
}

// check fails t unless every sequence up to total was received, every client received some,
// and no sequence was delivered as new twice: the consumer is served by one replica. A
// redelivery is no such proof: when a loaded replica cannot confirm its ownership in time
// it stops serving, and the next one redelivers what was delivered but whose ack it lost, as
// JetStream does after a leader change. It returns how many sequences each client received.
//
// A replica fenced on a loaded machine is the one case where a takeover delivers as new
// what the fenced one delivered without its ack being written, as after a crash (the README
// says so): with fenced set, such sequences are logged rather than failed.
func (r *receipts) check(t *testing.T, total uint64, what string, fenced bool) []int {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	spread := make([]int, len(r.by))
	for i, m := range r.by {
		if spread[i] = len(m); spread[i] == 0 {
			t.Errorf("nothing was %s %d", what, i+1)
		}
	}
	for seq := uint64(1); seq <= total; seq++ {
		if !r.all[seq] {
			t.Fatalf("sequence %d was never received", seq)
		}
		if n := r.fresh[seq]; n > 1 {
			if !fenced {
				t.Fatalf("sequence %d was delivered as new %d times, want once", seq, n)
			}
			t.Logf("sequence %d was delivered as new %d times, after a fencing", seq, n)
		}
	}
	if r.again > 0 {
		t.Logf("%d redeliveries %s", r.again, strings.TrimSuffix(what, " on replica"))
	}
	return spread
}

// deliveryLog is what the fetchers of one consumer received.
type deliveryLog struct {
	mu     sync.Mutex
	times  []time.Time
	counts map[uint64]int
	again  int // deliveries the server marked as redeliveries
}

func (d *deliveryLog) note(seq uint64, redelivered bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.times = append(d.times, time.Now())
	d.counts[seq]++
	if redelivered {
		d.again++
	}
}

// firstAfter returns the first delivery at or after t, or the zero time.
func (d *deliveryLog) firstAfter(t time.Time) time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, at := range d.times {
		if !at.Before(t) {
			return at
		}
	}
	return time.Time{}
}

func (d *deliveryLog) distinct() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.counts)
}

// TestReplicaKillsUnderLoad SIGKILLs the replica serving a durable pull consumer, under
// publish load spread over all three replicas, five times in a row, starting it again after
// each. Publishers retry what was not acknowledged with the same Nats-Msg-Id, wherever they
// can connect. Every round, delivery resumes on another replica before a lease passes; in the end every
// acknowledged publish is stored exactly once, with no gap, and was delivered.
func TestReplicaKillsUnderLoad(t *testing.T) {
	t.Parallel()
	const stream = "KILLS"
	rounds := 5
	dsn := testDatabase(t)
	c := newCluster(t, dsn, 3, "--lease", takeoverLease.String())
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	_, js := c.rep(0).connect(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"kills.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "work", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}

	pubCtx, stopPub := context.WithCancel(ctx)
	defer stopPub()
	var pubWG sync.WaitGroup
	var pubs []*publisher
	for i := range 3 {
		p := newPublisher(fmt.Sprintf("p%d", i+1), stream, fmt.Sprintf("kills.p%d", i+1), 64, 256)
		p.rate.Store(1000)
		p.ackTimeout = 3 * time.Second
		pubs = append(pubs, p)
		pubWG.Go(func() {
			for k := i; pubCtx.Err() == nil; k++ {
				r := c.rep(k % 3)
				if r.hasExited() {
					continue
				}
				if err := p.run(pubCtx, r.natsURL, time.Second); err != nil {
					time.Sleep(50 * time.Millisecond) // a replica starting again
				}
			}
		})
	}

	log := &deliveryLog{counts: make(map[uint64]int)}
	fetchCtx, stopFetch := context.WithCancel(ctx)
	defer stopFetch()
	var fetchWG sync.WaitGroup
	var fetchErrs atomic.Int64 // a Fetch refused at once, while the client reconnects
	for range 2 {
		nc, err := nats.Connect(c.urls(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		fjs, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		cons, err := fjs.Consumer(ctx, stream, "work")
		if err != nil {
			t.Fatal(err)
		}
		fetchWG.Go(func() {
			for fetchCtx.Err() == nil {
				// A pull waiting at the killed replica is lost with it; the client pulls again
				// after the wait plus a second, so a short wait leaves the 2 s bound room on a
				// loaded machine.
				batch, err := cons.Fetch(50, jetstream.FetchMaxWait(250*time.Millisecond))
				if err != nil {
					fetchErrs.Add(1)
					continue
				}
				for m := range batch.Messages() {
					md, err := m.Metadata()
					if err != nil {
						continue
					}
					log.note(md.Sequence.Stream, md.NumDelivered > 1)
					_ = m.Ack()
				}
			}
		})
	}

	var resumes, takeovers []time.Duration
	for round := range rounds {
		before := log.distinct()
		testwait.For(t, time.Minute, func() error {
			if log.distinct() < before+500 {
				return fmt.Errorf("round %d: %d delivered, waiting for 500 more under load", round+1, log.distinct()-before)
			}
			return nil
		})
		victim := c.serving(1)
		if victim < 0 {
			t.Fatalf("round %d: no replica reports serving the consumer", round+1)
		}
		c.rep(victim).kill(t)
		killed := time.Now()
		var taken time.Time
		testwait.For(t, 30*time.Second, func() error {
			if c.serving(1) < 0 {
				return errors.New("no replica serves the consumer yet")
			}
			taken = time.Now()
			return nil
		})
		var resumed time.Time
		testwait.For(t, 30*time.Second, func() error {
			if resumed = log.firstAfter(taken); resumed.IsZero() {
				return errors.New("no delivery since the takeover")
			}
			return nil
		})
		resumes = append(resumes, resumed.Sub(killed))
		takeovers = append(takeovers, taken.Sub(killed))
		c.restart(victim)
	}

	waitAllAcked(t, pubs, 2*time.Minute)
	stopPub()
	pubWG.Wait()
	acked := ackedSeqs(pubs)
	testwait.For(t, 2*time.Minute, func() error {
		if n := log.distinct(); n < len(acked) {
			return fmt.Errorf("%d of %d acknowledged publishes delivered", n, len(acked))
		}
		return nil
	})
	stopFetch()
	fetchWG.Wait()

	_, ajs := c.rep(0).connect(t)
	r := auditStream(t, ctx, ajs, stream, acked)
	log.mu.Lock()
	deliveries, again := len(log.times), log.again
	log.mu.Unlock()
	t.Logf("FIGURES rounds=%d acked=%d stored=%d lost=%d stored_twice=%d deliveries=%d redelivered=%d fetch_refused=%d takeover_seen_after=%v resume_after_sigkill=%v",
		rounds, len(acked), r.msgs, r.lost, r.dupIDs, deliveries, again, fetchErrs.Load(), takeovers, resumes)
	if r.lost != 0 || r.dupIDs != 0 || r.wrongSeq != 0 || r.foreign != 0 {
		t.Errorf("%d acknowledged publishes lost, %d stored twice, %d at another sequence, %d foreign", r.lost, r.dupIDs, r.wrongSeq, r.foreign)
	}
	for i, d := range resumes {
		if d >= takeoverLease {
			t.Errorf("round %d: delivery resumed %v after the SIGKILL, not before the lease of %v", i+1, d, takeoverLease)
		}
	}
}

// BenchmarkReplicas measures async publish and fetch throughput of one replica against three
// on the same PostgreSQL, in one run, and the time from the SIGKILL of the replica serving
// a consumer to its first delivery from another (pulls of 100 ms, so that a pull lost with
// the dead replica costs the client little):
//
//	go test -run '^$' -bench BenchmarkReplicas -benchtime 20000x ./e2e/
//
// Publishes and fetches are spread over the replicas' clients evenly. On one small machine
// the replicas share its cores with PostgreSQL: three must not be slower than one.
func BenchmarkReplicas(b *testing.B) {
	pgs := startPGServer(b)
	for _, n := range []int{1, 3} {
		stream := fmt.Sprintf("BENCH%d", n)
		c := newCluster(b, pgs.dsn(), n, "--lease", "2s")
		ctx := context.Background()
		jss := make([]jetstream.JetStream, n)
		for i := range n {
			_, jss[i] = c.rep(i).connect(b)
		}
		if _, err := jss[0].CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{strings.ToLower(stream) + ".>"}}); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("replicas=%d/publish", n), func(b *testing.B) {
			b.SetBytes(128)
			var wg sync.WaitGroup
			for i := range n {
				share := b.N / n
				if i == 0 {
					share += b.N % n
				}
				wg.Go(func() {
					publishAll(b, ctx, jss[i], fmt.Sprintf("%s.r%d", strings.ToLower(stream), i), share, func(int) []byte { return make([]byte, 128) })
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
		b.Run(fmt.Sprintf("replicas=%d/fetch", n), func(b *testing.B) {
			b.StopTimer()
			name := fmt.Sprintf("f%d", b.N)
			if _, err := jss[0].CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
				b.Fatal(err)
			}
			conses := make([]jetstream.Consumer, n)
			for i := range n {
				var err error
				if conses[i], err = jss[i].Consumer(ctx, stream, name); err != nil {
					b.Fatal(err)
				}
			}
			b.StartTimer()
			// The last message ends every fetcher's pull at once: the others would otherwise
			// wait for theirs to expire.
			fctx, done := context.WithCancel(ctx)
			defer done()
			var got atomic.Int64
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					for fctx.Err() == nil {
						pull, cancel := context.WithTimeout(fctx, time.Second)
						batch, err := conses[i].Fetch(500, jetstream.FetchContext(pull))
						if err != nil {
							cancel()
							if fctx.Err() == nil {
								b.Error(err)
							}
							return
						}
						for m := range batch.Messages() {
							_ = m.Ack()
							if got.Add(1) == int64(b.N) {
								done()
							}
						}
						cancel()
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
		if n < 3 {
			// Nothing of it may run beside the next cluster.
			c.stop()
			continue
		}
		b.Run("replicas=3/takeover", func(b *testing.B) {
			b.StopTimer()
			if _, err := jss[0].CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "takeover", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
				b.Fatal(err)
			}
			// Each round kills a replica and starts it again: five are enough, whatever
			// -benchtime asks of the publish and fetch runs.
			rounds := min(b.N, 5)
			var total time.Duration
			for range rounds {
				nc, err := nats.Connect(c.urls())
				if err != nil {
					b.Fatal(err)
				}
				js, _ := jetstream.New(nc)
				cons, err := js.Consumer(ctx, stream, "takeover")
				if err != nil {
					b.Fatal(err)
				}
				var victim int
				if _, err := fmt.Sscanf(cons.CachedInfo().Cluster.Leader, "r%d", &victim); err != nil {
					b.Fatalf("consumer leader %q: %v", cons.CachedInfo().Cluster.Leader, err)
				}
				victim--
				killed := time.Now()
				c.rep(victim).kill(b)
				for {
					if time.Since(killed) > 30*time.Second {
						b.Fatal("no delivery within 30 s of the SIGKILL")
					}
					batch, err := cons.Fetch(1, jetstream.FetchMaxWait(100*time.Millisecond))
					if err == nil {
						if _, ok := <-batch.Messages(); ok {
							break
						}
					}
				}
				total += time.Since(killed)
				nc.Close()
				c.restart(victim)
			}
			b.ReportMetric(float64(total.Microseconds())/1000/float64(rounds), "ms/takeover")
		})
	}
}

// Consumer info through a replica that does not serve the consumer reports the serving
// replica's live state, what it delivered and what waits for an ack, not the ack floor
// PostgreSQL holds.
func TestConsumerInfoThroughAnyReplica(t *testing.T) {
	t.Parallel()
	const stream = "INFOS"
	reps := startCluster(t, testDatabase(t), 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	jss := make([]jetstream.JetStream, len(reps))
	for i, r := range reps {
		_, jss[i] = r.connect(t)
	}
	if _, err := jss[0].CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"infos.>"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := jss[i%len(reps)].Publish(ctx, "infos.a", nil); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := jss[0].CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "live", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// The queue group spread the publishes over the replicas at random: the one that serves
	// the consumer most often stored some of them, not the last.
	if n := cons.CachedInfo().NumPending; n != 10 {
		t.Fatalf("created with %d pending, want 10", n)
	}
	batch, err := cons.Fetch(4, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []jetstream.Msg
	for m := range batch.Messages() {
		got = append(got, m)
	}
	if len(got) != 4 {
		t.Fatalf("fetched %d messages, want 4", len(got))
	}
	// Acknowledging the second leaves the first, and so the ack floor, where they were.
	if err := got[1].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	// A replica reaches the serving one through the NATS cluster once the serving one's
	// forwarding subscription has reached it, which under a loaded machine can trail the
	// routes' forming: until then it answers from PostgreSQL, as it must when the serving
	// replica cannot be reached. Wait until each has answered with the live state once.
	for i := range reps {
		testwait.For(t, 30*time.Second, func() error {
			c, err := jss[i].Consumer(ctx, stream, "live")
			if err != nil {
				return err
			}
			if d := c.CachedInfo().Delivered; d.Stream != 4 {
				return fmt.Errorf("replica %d answers delivered %+v, not the serving replica's state yet", i+1, d)
			}
			return nil
		})
	}
	// From then on every replica answers with the serving one's state, every time: asked
	// several times, as the API queue group may pick another replica's member.
	var leader string
	for i := range reps {
		for range 5 {
			c, err := jss[i].Consumer(ctx, stream, "live")
			if err != nil {
				t.Fatalf("consumer info through replica %d: %v", i+1, err)
			}
			info := c.CachedInfo()
			if info.Cluster != nil && leader == "" {
				leader = info.Cluster.Leader
			}
			if info.Delivered.Stream != 4 || info.Delivered.Consumer != 4 || info.NumAckPending != 3 || info.NumPending != 6 ||
				info.AckFloor.Stream != 0 || info.Cluster == nil || info.Cluster.Leader != leader {
				t.Fatalf("info through replica %d: delivered %+v, ack floor %+v, %d ack pending, %d pending, cluster %+v; want delivered 4/4, floor 0/0, 3 ack pending, 6 pending, leader %q",
					i+1, info.Delivered, info.AckFloor, info.NumAckPending, info.NumPending, info.Cluster, leader)
			}
		}
	}
}

// cutProxy forwards TCP connections to PostgreSQL's Unix socket until it is cut: then it
// forwards nothing more, in either direction, and keeps every connection open, as a network
// partition does. sever closes them, as PostgreSQL does once its keepalives give up; heal
// lets new connections through again.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	healed chan struct{} // closed by heal
	conns  []net.Conn
}

func startCutProxy(t *testing.T, socket string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: socket, healed: make(chan struct{})}
	t.Cleanup(func() {
		_ = ln.Close()
		p.sever()
	})
	go p.accept()
	return p
}

func (p *cutProxy) port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *cutProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

func (p *cutProxy) serve(c net.Conn) {
	p.mu.Lock()
	cut, healed := p.cut, p.healed
	p.conns = append(p.conns, c)
	p.mu.Unlock()
	if cut {
		<-healed
	}
	up, err := net.Dial("unix", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, up)
	p.mu.Unlock()
	go p.pipe(up, c)
	p.pipe(c, up)
}

// pipe copies from src to dst until either fails; once cut, what it reads goes nowhere and
// it reads no more.
func (p *cutProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			_ = dst.Close()
			return
		}
		p.mu.Lock()
		cut, healed := p.cut, p.healed
		p.mu.Unlock()
		if cut {
			<-healed
			_ = dst.Close()
			_ = src.Close()
			return
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			_ = src.Close()
			return
		}
	}
}

func (p *cutProxy) cutOff() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
}

func (p *cutProxy) sever() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

func (p *cutProxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		p.cut = false
		close(p.healed)
		p.healed = make(chan struct{})
	}
}

// TestReplicaCutFromDatabase cuts the replica serving a consumer off from PostgreSQL (each
// replica reaches it through a proxy of its own) while its NATS side lives and it still
// holds messages in memory: it stops delivering within the
// lease, and no other replica delivers until PostgreSQL has ended the cut replica's session.
func TestReplicaCutFromDatabase(t *testing.T) {
	t.Parallel()
	const (
		stream = "CUT"
		lease  = 2 * time.Second
	)
	pgs := startPGServer(t)
	var proxies []*cutProxy
	var dsns []string
	for range 3 {
		p := startCutProxy(t, filepath.Join(pgs.dir, ".s.PGSQL.5432"))
		proxies = append(proxies, p)
		dsns = append(dsns, fmt.Sprintf("host=127.0.0.1 port=%d user=%s dbname=%s sslmode=disable", p.port(), localpg.Superuser, localpg.Database))
	}
	c := newClusterOn(t, dsns, "--lease", lease.String())
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	_, js1 := c.rep(0).connect(t)
	if _, err := js1.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"cut.>"}}); err != nil {
		t.Fatal(err)
	}
	cons1, err := js1.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "work", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	victim := -1
	if l := cons1.CachedInfo().Cluster; l != nil {
		_, _ = fmt.Sscanf(l.Leader, "r%d", &victim)
		victim--
	}
	if victim < 0 {
		t.Fatalf("consumer info names no serving replica: %+v", cons1.CachedInfo().Cluster)
	}
	proxy := proxies[victim]
	publishAll(t, ctx, js1, "cut.x", 3000, func(int) []byte { return []byte("x") })

	log := &deliveryLog{counts: make(map[uint64]int)}
	_, js2 := c.rep((victim + 1) % 3).connect(t)
	cons, err := js2.Consumer(ctx, stream, "work")
	if err != nil {
		t.Fatal(err)
	}
	fetchCtx, stopFetch := context.WithCancel(ctx)
	defer stopFetch()
	var fetchWG sync.WaitGroup
	fetchWG.Go(func() {
		for fetchCtx.Err() == nil {
			batch, err := cons.Fetch(5, jetstream.FetchMaxWait(200*time.Millisecond))
			if err != nil {
				continue
			}
			for m := range batch.Messages() {
				if md, err := m.Metadata(); err == nil {
					log.note(md.Sequence.Stream, md.NumDelivered > 1)
				}
				_ = m.Ack()
			}
			time.Sleep(20 * time.Millisecond) // a slow client, so that r1 still holds most
		}
	})
	testwait.For(t, time.Minute, func() error {
		if n := log.distinct(); n < 200 {
			return fmt.Errorf("%d delivered", n)
		}
		return nil
	})
	proxy.cutOff()
	cutAt := time.Now()
	// Past the lease, nothing is delivered any more, by anyone.
	testwait.For(t, time.Minute, func() error {
		if time.Since(cutAt) < lease+time.Second {
			return errors.New("within the lease")
		}
		return nil
	})
	log.mu.Lock()
	last := log.times[len(log.times)-1]
	cutSeqs := make(map[uint64]bool, len(log.counts))
	for seq := range log.counts {
		cutSeqs[seq] = true
	}
	log.mu.Unlock()
	stoppedAfter := last.Sub(cutAt)
	if stoppedAfter > lease {
		t.Errorf("the replica cut from the database delivered %v after the cut, beyond the lease (%v)", stoppedAfter, lease)
	}
	_, body := c.rep(victim).mustGet(t, "/metrics")
	if f := metricValue(t, body, "jetgres_consumer_fencings_total"); f < 1 {
		t.Errorf("jetgres_consumer_fencings_total = %v on the cut replica", f)
	}

	// PostgreSQL ends the cut replica's sessions; another replica takes over.
	severedAt := time.Now()
	proxy.sever()
	proxy.heal()
	testwait.For(t, 30*time.Second, func() error {
		if log.firstAfter(severedAt).IsZero() {
			return errors.New("no delivery since the sessions ended")
		}
		return nil
	})
	resumed := log.firstAfter(severedAt).Sub(severedAt)
	stopFetch()
	fetchWG.Wait()
	log.mu.Lock()
	again := 0
	for seq, n := range log.counts {
		if n > 1 && cutSeqs[seq] {
			again++
		}
	}
	log.mu.Unlock()
	t.Logf("FIGURES lease=%v delivered_after_cut=%v resumed_after_session_end=%v delivered_again_from_floor=%d", lease, stoppedAfter.Round(time.Millisecond), resumed.Round(time.Millisecond), again)
}

// TestReplicasComposeFile checks docker-compose.replicas.yml, which no test can run here:
// three jetgres services on one PostgreSQL, each routed to the three, with distinct names and
// ports, setting only variables and flags the binary has.
func TestReplicasComposeFile(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../docker-compose.replicas.yml")
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(raw, &cf); err != nil {
		t.Fatalf("docker-compose.replicas.yml: %v", err)
	}
	flags := binaryFlags(t)
	envs := map[string]bool{}
	for _, f := range flags {
		for _, e := range f.env {
			envs[e] = true
		}
	}
	if pg, ok := cf.Services["postgres"]; !ok || pg.Healthcheck == nil {
		t.Fatal("no postgres service with a healthcheck")
	}
	names, ports := map[string]bool{}, map[string]bool{}
	for _, svc := range []string{"jetgres1", "jetgres2", "jetgres3"} {
		s, ok := cf.Services[svc]
		if !ok {
			t.Fatalf("no %s service", svc)
		}
		for k := range s.Environment {
			if !envs[k] {
				t.Errorf("%s sets %s, which is no flag's environment variable", svc, k)
			}
		}
		if !strings.Contains(s.Environment["JETGRES_ROUTES"], "nats://"+svc+":6222") || s.Environment["JETGRES_CLUSTER"] != "0.0.0.0:6222" {
			t.Errorf("%s: cluster %q, routes %q do not route to it", svc, s.Environment["JETGRES_CLUSTER"], s.Environment["JETGRES_ROUTES"])
		}
		if s.DependsOn["postgres"].Condition != "service_healthy" {
			t.Errorf("%s does not wait for a healthy postgres", svc)
		}
		args := s.Command
		if len(args) != 3 || args[0] != "serve" || args[1] != "--replica-name" {
			t.Fatalf("%s: command %v, want serve --replica-name <name>", svc, args)
		}
		names[args[2]] = true
		for _, p := range s.Ports {
			if ports[p] {
				t.Errorf("%s: port %s published twice", svc, p)
			}
			ports[p] = true
		}
	}
	if len(names) != 3 {
		t.Errorf("replica names %v are not distinct", names)
	}
}
