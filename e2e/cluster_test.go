package e2e

// Several replicas: three jetgres processes on one PostgreSQL, their embedded servers routed
// into one NATS cluster with the clustering flags. This file is the harness the cluster_*
// tests share: replicas started, routed, restarted and stopped, and records of what their
// clients received.

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetgres/jetgres/bridge"
	"github.com/jetgres/jetgres/internal/testwait"
)

// freePorts returns n loopback ports free at the time of the call, below the kernel's range
// of ephemeral ports: a port of that range, free when picked, may become the source port of
// any concurrent test's outgoing connection before the replica binds it ("address already
// in use"), while ports below it are only ever bound on purpose.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	const lowest = 10000
	top := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if lo, err := strconv.Atoi(f[0]); err == nil && lo > lowest+1000 {
				top = lo
			}
		}
	}
	var out []int
	var lns []net.Listener
	for tries := 0; len(out) < n; tries++ {
		if tries > 1000 {
			t.Fatalf("no free port below %d", top)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(lowest+rand.IntN(top-lowest)))
		if err != nil {
			continue
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
