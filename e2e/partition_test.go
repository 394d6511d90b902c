//go:build linux

package e2e

// Partitions rather than kills: a replica whose TCP connections to PostgreSQL fall silent,
// its process alive, and a replica cut off from the other replicas but not from PostgreSQL.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// partitionLease is the --lease of the partition test. PostgreSQL ends a silent session
// within the lease plus three one-second probes, which is within two leases from 3 s up;
// 6 s leaves the takeover room on a loaded machine, whose live replicas a shorter lease
// would fence.
const partitionLease = 6 * time.Second

// deliverySample is what one replica had delivered, by its metrics, as read between sent
// and recv. A consumer counts its deliveries after making them (at the latest when it
// stops), so a delivery a sample counts happened before recv.
type deliverySample struct {
	sent, recv time.Time
	delivered  float64
	fenced     float64
	takeovers  float64
}

// deliveryTrace samples every replica's delivered counter, each replica on its own so that
// a slow one holds up no other, and so puts each delivery down to the replica whose counter
// it raised, within one sampling interval.
type deliveryTrace struct {
	mu sync.Mutex
	by [][]deliverySample // by replica
}

func (d *deliveryTrace) run(ctx context.Context, c *cluster, n int) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				sent := time.Now()
				if m, err := c.rep(i).metrics(); err == nil {
					d.mu.Lock()
					d.by[i] = append(d.by[i], deliverySample{sent: sent, recv: time.Now(),
						delivered: m["jetgres_consumer_delivered_total"], fenced: m["jetgres_consumer_fencings_total"],
						takeovers: m["jetgres_consumer_takeovers_total"]})
					d.mu.Unlock()
				}
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		})
	}
	wg.Wait()
}

// of returns replica i's samples so far.
func (d *deliveryTrace) of(i int) []deliverySample {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.by[i])
}

// deliveredSince reports whether replica i has delivered more than base[i] by its latest
// sample.
func (d *deliveryTrace) deliveredSince(i int, base []float64) bool {
	s := d.of(i)
	return len(s) > 0 && s[len(s)-1].delivered > base[i]
}

// slowest is the longest any sample of replica i took.
func (d *deliveryTrace) slowest(i int) time.Duration {
	var most time.Duration
	for _, s := range d.of(i) {
		most = max(most, s.recv.Sub(s.sent))
	}
	return most
}

// partitionReceipts is what the clients of the partition test's consumers received.
type partitionReceipts struct {
	mu    sync.Mutex
	seen  map[string]map[uint64]int // by consumer, deliveries of each sequence
	times []time.Time
}

func (r *partitionReceipts) note(consumer string, seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen[consumer][seq]++
	r.times = append(r.times, time.Now())
}

func (r *partitionReceipts) distinct(consumer string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen[consumer])
}

func (r *partitionReceipts) firstAfter(t time.Time) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, at := range r.times {
		if at.After(t) {
			return at
		}
	}
	return time.Time{}
}

// TestReplicaPartitionedFromDatabase cuts the replica serving a pull and a push consumer off
// from PostgreSQL by dropping its packets, its process and its NATS side alive, while
// clients on another replica consume and a publisher there goes on publishing. The cut
// replica stops delivering before any other starts (each replica's deliveries traced from
// its metrics), PostgreSQL ends its sessions on its own and another replica takes the
// consumers over within two leases, and every acknowledged publish reaches both consumers.
func TestReplicaPartitionedFromDatabase(t *testing.T) {
	t.Parallel()
	const stream = "PART"
	cut := newSilencer(t)
	pgs := startPGServer(t)
	var fronts []*pgFront
	var dsns []string
	for range 3 {
		f := startPGFront(t, filepath.Join(pgs.dir, ".s.PGSQL.5432"))
		fronts = append(fronts, f)
		dsns = append(dsns, loopbackDSN(f.port()))
	}
	c := newClusterOn(t, dsns, "--lease", partitionLease.String())
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// The victim serves both consumers and the others serve nothing, so that a delivered
	// counter that moves names the replica delivering: a push consumer served elsewhere is
	// deleted and created again until the pull consumer's replica serves it.
	_, js1 := c.rep(0).connect(t)
	retryUnavailable(t, func() error {
		_, err := js1.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"part.>"}})
		return err
	})
	var pullCons jetstream.Consumer
	retryUnavailable(t, func() (err error) {
		pullCons, err = js1.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
			Durable: "pull", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
		return err
	})
	victim := servedBy(t, pullCons.CachedInfo())
	for try := 0; ; try++ {
		name := fmt.Sprintf("push%d", try)
		var push jetstream.Consumer
		retryUnavailable(t, func() (err error) {
			push, err = js1.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
				Durable: name, DeliverSubject: "deliver.part", AckPolicy: jetstream.AckExplicitPolicy,
				AckWait: time.Minute, MaxAckPending: 50})
			return err
		})
		if servedBy(t, push.CachedInfo()) == victim {
			break
		}
		if try == 20 {
			t.Fatalf("the push consumer was served elsewhere than r%d 20 times", victim+1)
		}
		// The replica answering the delete may not have read the creation yet.
		testwait.For(t, 30*time.Second, func() error { return js1.DeleteConsumer(ctx, stream, name) })
	}
	var others []int
	for i := range 3 {
		if i != victim {
			others = append(others, i)
		}
	}
	publishAll(t, ctx, js1, "part.msg", 4000, func(int) []byte { return []byte("m") })

	trace := &deliveryTrace{by: make([][]deliverySample, 3)}
	traceCtx, stopTrace := context.WithCancel(ctx)
	defer stopTrace()
	var bg sync.WaitGroup
	bg.Go(func() { trace.run(traceCtx, c, 3) })

	rec := &partitionReceipts{seen: map[string]map[uint64]int{"pull": {}, "push": {}}}
	var slow atomic.Bool
	slow.Store(true)
	nc2, js2 := c.rep(others[0]).connect(t)
	pull, err := js2.Consumer(ctx, stream, "pull")
	if err != nil {
		t.Fatal(err)
	}
	fetchCtx, stopFetch := context.WithCancel(ctx)
	defer stopFetch()
	bg.Go(func() {
		for fetchCtx.Err() == nil {
			batch, err := pull.Fetch(10, jetstream.FetchMaxWait(500*time.Millisecond))
			if err != nil {
				continue
			}
			for m := range batch.Messages() {
				if md, err := m.Metadata(); err == nil {
					rec.note("pull", md.Sequence.Stream)
				}
				_ = m.Ack()
			}
			if slow.Load() {
				time.Sleep(40 * time.Millisecond) // a slow client, so that a backlog outlives the takeover
			}
		}
	})
	sub, err := nc2.Subscribe("deliver.part", func(m *nats.Msg) {
		md, err := m.Metadata()
		if err != nil {
			return
		}
		rec.note("push", md.Sequence.Stream)
		_ = m.Ack()
		if slow.Load() {
			time.Sleep(4 * time.Millisecond)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	// A publisher on another replica goes on through the partition; what it got
	// acknowledged must reach both consumers. The cut replica still gets its share of
	// publishes, which it cannot store: their clients give up on them (the count is logged).
	var published, unanswered atomic.Uint64
	pubCtx, stopPub := context.WithCancel(ctx)
	defer stopPub()
	bg.Go(func() {
		for pubCtx.Err() == nil {
			pctx, cancel := context.WithTimeout(pubCtx, 2*time.Second)
			ack, err := js2.Publish(pctx, "part.msg", []byte("during"))
			cancel()
			if err == nil {
				published.Store(ack.Sequence)
			} else if pubCtx.Err() == nil {
				unanswered.Add(1)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})

	testwait.For(t, time.Minute, func() error {
		if p, q := rec.distinct("pull"), rec.distinct("push"); p < 200 || q < 200 {
			return fmt.Errorf("pull %d, push %d delivered", p, q)
		}
		return nil
	})
	base, baseTakeovers := servingBeforeCut(t, c, victim)
	cut.silence(fronts[victim].port())
	// Should the test fail, the cut replica's goroutines show where it stands: SIGQUIT makes
	// the Go runtime print them to its log, which the failed test shows. This cleanup runs
	// before the silencer's, while the replica is still cut off.
	t.Cleanup(func() {
		if v := c.rep(victim); t.Failed() && !v.hasExited() {
			_ = v.cmd.Process.Signal(syscall.SIGQUIT)
			_ = v.wait(10 * time.Second)
		}
	})
	cutAt := time.Now()
	t.Logf("r%d cut off from PostgreSQL (packets dropped on port %d)", victim+1, fronts[victim].port())

	testwait.For(t, 3*partitionLease, func() error {
		if !trace.deliveredSince(others[0], base) && !trace.deliveredSince(others[1], base) {
			return fmt.Errorf("no other replica delivers, %v after the cut", time.Since(cutAt).Round(time.Millisecond))
		}
		return nil
	})
	slow.Store(false)
	atTakeover := published.Load()
	testwait.For(t, time.Minute, func() error {
		if n := published.Load(); n < atTakeover+20 {
			return fmt.Errorf("%d published since the takeover", n-atTakeover)
		}
		return nil
	})
	stopPub()
	want := published.Load()
	testwait.For(t, 2*time.Minute, func() error {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for name, seen := range rec.seen {
			for seq := uint64(1); seq <= want; seq++ {
				if seen[seq] == 0 {
					return fmt.Errorf("%s: sequence %d of %d not received (%d distinct)", name, seq, want, len(seen))
				}
			}
		}
		return nil
	})
	stopFetch()
	_ = sub.Unsubscribe()
	stopTrace()
	bg.Wait()

	checkMovedAfterCut(t, trace, others, baseTakeovers, cutAt)
	counting, stopped, started := checkOneDeliverer(t, trace, victim, others, base)
	var fencedAt time.Time
	for _, s := range trace.of(victim) {
		if s.fenced > 0 {
			fencedAt = s.recv
			break
		}
	}
	if fencedAt.IsZero() {
		t.Errorf("r%d never fenced itself", victim+1)
	}
	// The victim counts its last deliveries when its fence stops its consumers, at the
	// latest: a sample that does not count them yet, sent later than a second past the
	// fencing deadline, shows a replica still delivering then. A slow sample proves less,
	// not a false failure.
	if counting.Sub(cutAt) > partitionLease/5+time.Second {
		t.Errorf("r%d had not counted its last delivery %v after the cut, beyond its fence (%v)", victim+1, counting.Sub(cutAt).Round(time.Millisecond), partitionLease/5)
	}
	takeover := started.Sub(cutAt)
	if takeover > 2*partitionLease {
		t.Errorf("the consumers were served again %v after the cut, beyond two leases (%v)", takeover.Round(time.Millisecond), 2*partitionLease)
	}
	rec.mu.Lock()
	again := 0
	for _, seen := range rec.seen {
		for _, n := range seen {
			if n > 1 {
				again++
			}
		}
	}
	rec.mu.Unlock()
	var byReplica []float64
	for i := range 3 {
		s := trace.of(i)
		byReplica = append(byReplica, s[len(s)-1].delivered)
	}
	var slowest []time.Duration
	for i := range 3 {
		slowest = append(slowest, trace.slowest(i).Round(time.Millisecond))
	}
	t.Logf("FIGURES lease=%v victim=r%d victim_last_delivery_by=%v victim_fenced_by=%v takeover_after=%v (all after the cut) client_delivery_after_takeover=%v delivered_by_replica=%v published=%d publishes_failed=%d sequences_delivered_twice=%d slowest_sample_by_replica=%v",
		partitionLease, victim+1, stopped.Sub(cutAt).Round(time.Millisecond), fencedAt.Sub(cutAt).Round(time.Millisecond),
		takeover.Round(time.Millisecond), rec.firstAfter(started).Sub(cutAt).Round(time.Millisecond), byReplica, want, unanswered.Load(), again, slowest)
}

// checkOneDeliverer fails t unless the victim, the only replica serving when it was cut,
// had delivered its last message before any other replica delivered more than it had by
// the cut (base). It returns the sent time of the victim's last sample that did not count
// its last delivery (which it counted later), the time by which it had delivered its
// last, and the time after which another replica delivered its first.
func checkOneDeliverer(t *testing.T, trace *deliveryTrace, victim int, others []int, base []float64) (counting, stopped, started time.Time) {
	t.Helper()
	vs := trace.of(victim)
	final := vs[len(vs)-1].delivered
	for _, s := range vs {
		if s.delivered == final {
			stopped = s.recv
			break
		}
		counting = s.sent
	}
	for _, i := range others {
		// The sent time of the last sample to show nothing delivered since the cut.
		series := trace.of(i)
		if len(series) == 0 || series[len(series)-1].delivered == base[i] {
			continue
		}
		var idle time.Time
		for _, s := range series {
			if s.delivered > base[i] {
				break
			}
			idle = s.sent
		}
		if started.IsZero() || idle.Before(started) {
			started = idle
		}
	}
	if !stopped.Before(started) {
		t.Errorf("r%d delivered until %v, another replica from %v on: two replicas may have delivered at once",
			victim+1, stopped.Format(time.StampMilli), started.Format(time.StampMilli))
	}
	return counting, stopped, started
}

// servingBeforeCut fails t unless, just before the cut, the victim serves both consumers
// and the others none, and returns what each replica had delivered and taken over by
// then. The deliveries the trace puts down to another replica are those it made since.
func servingBeforeCut(t *testing.T, c *cluster, victim int) (delivered, takeovers []float64) {
	t.Helper()
	delivered, takeovers = make([]float64, 3), make([]float64, 3)
	var fencings []float64
	var wrong []string
	for i := range 3 {
		var m map[string]float64
		// A scrape may outlast the client's timeout on a loaded machine.
		testwait.For(t, time.Minute, func() (err error) {
			m, err = c.rep(i).metrics()
			return err
		})
		want := 0.0
		if i == victim {
			want = 2
		}
		if got := m["jetgres_consumers_served"]; got != want {
			wrong = append(wrong, fmt.Sprintf("r%d serves %v consumers, want %v", i+1, got, want))
		}
		fencings = append(fencings, m["jetgres_consumer_fencings_total"])
		delivered[i] = m["jetgres_consumer_delivered_total"]
		takeovers[i] = m["jetgres_consumer_takeovers_total"]
	}
	if len(wrong) > 0 {
		// A replica that could not confirm its session in time (a loaded machine) fenced
		// and the others took its consumers: what would follow is no partition's doing.
		t.Fatalf("before the cut: %s (fencings by replica %v): the consumers moved before the partition", strings.Join(wrong, ", "), fencings)
	}
	return delivered, takeovers
}

// checkMovedAfterCut fails t at once if another replica took a consumer over within a
// lease of the cut, by a sample received by then: PostgreSQL frees a silent session's locks
// only after a lease of silence and its probes, so such a takeover began before the cut,
// after the victim fenced on a loaded machine, between the reads of servingBeforeCut and
// the cut. What the trace shows then is no partition's doing.
func checkMovedAfterCut(t *testing.T, trace *deliveryTrace, others []int, base []float64, cutAt time.Time) {
	t.Helper()
	for _, i := range others {
		for _, s := range trace.of(i) {
			if s.recv.Before(cutAt.Add(partitionLease)) && s.takeovers > base[i] {
				t.Fatalf("r%d had taken a consumer over by %v after the cut, before PostgreSQL could free the cut session's locks: the consumers moved before the partition",
					i+1, s.recv.Sub(cutAt).Round(time.Millisecond))
			}
		}
	}
}

// servedBy returns the index of the replica that serves a consumer, by its info.
func servedBy(t *testing.T, info *jetstream.ConsumerInfo) int {
	t.Helper()
	n := 0
	if info.Cluster != nil {
		_, _ = fmt.Sscanf(info.Cluster.Leader, "r%d", &n)
	}
	if n < 1 || n > 3 {
		t.Fatalf("consumer %s names no serving replica: %+v", info.Name, info.Cluster)
	}
	return n - 1
}

// clusterPort is the route port of replica i, from its --cluster flag.
func (c *cluster) clusterPort(i int) int {
	c.t.Helper()
	at := slices.Index(c.args[i], "--cluster")
	if at < 0 || at+1 >= len(c.args[i]) {
		c.t.Fatalf("replica %d has no --cluster flag", i+1)
	}
	_, p, _ := strings.Cut(c.args[i][at+1], ":")
	n, err := strconv.Atoi(p)
	if err != nil {
		c.t.Fatalf("replica %d: --cluster %s: %v", i+1, c.args[i][at+1], err)
	}
	return n
}

// TestReplicaCutFromReplicas drops the packets of the routes between two replicas, neither
// cut off from PostgreSQL: each keeps serving the consumers it owns to its own clients,
// takes none of the other's, fences nothing, and stores what its clients publish.
func TestReplicaCutFromReplicas(t *testing.T) {
	t.Parallel()
	const stream = "ROUTES"
	cut := newSilencer(t)
	c := newCluster(t, testDatabase(t), 2, "--lease", partitionLease.String())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, js := c.rep(0).connect(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"routes.>"}}); err != nil {
		t.Fatal(err)
	}
	// Consumers are created, through each replica in turn, until each replica serves one.
	_, jsOther := c.rep(1).connect(t)
	creators := []jetstream.JetStream{js, jsOther}
	own := make([]string, 2)
	for n := 0; own[0] == "" || own[1] == ""; n++ {
		if n == 40 {
			t.Fatalf("40 consumers, and a replica serves none: %q", own)
		}
		name := fmt.Sprintf("c%d", n)
		cons, err := creators[n%2].CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			t.Fatal(err)
		}
		if i := servedBy(t, cons.CachedInfo()); own[i] == "" {
			own[i] = name
		}
	}
	publishAll(t, ctx, js, "routes.x", 3000, func(int) []byte { return []byte("x") })

	served := make([]float64, 2)
	for i := range 2 {
		m, err := c.rep(i).metrics()
		if err != nil {
			t.Fatal(err)
		}
		served[i] = m["jetgres_consumers_served"]
	}
	// One slow client per replica, on the consumer that replica serves.
	var mu sync.Mutex
	last := make([]time.Time, 2)
	got := make([]int, 2)
	jss := make([]jetstream.JetStream, 2)
	workCtx, stopWork := context.WithCancel(ctx)
	defer stopWork()
	var wg sync.WaitGroup
	for i := range 2 {
		_, jsi := c.rep(i).connect(t)
		jss[i] = jsi
		cons, err := jsi.Consumer(ctx, stream, own[i])
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for workCtx.Err() == nil {
				batch, err := cons.Fetch(5, jetstream.FetchMaxWait(500*time.Millisecond))
				if err != nil {
					continue
				}
				for m := range batch.Messages() {
					mu.Lock()
					last[i], got[i] = time.Now(), got[i]+1
					mu.Unlock()
					_ = m.Ack()
				}
				time.Sleep(50 * time.Millisecond) // slow, so that the backlog lasts
			}
		})
	}
	testwait.For(t, time.Minute, func() error {
		mu.Lock()
		defer mu.Unlock()
		if got[0] < 50 || got[1] < 50 {
			return fmt.Errorf("received %v", got)
		}
		return nil
	})
	ports := []int{c.clusterPort(0), c.clusterPort(1)}
	cut.silence(ports...)
	cutAt := time.Now()
	t.Logf("routes cut (packets dropped on ports %v)", ports)

	// Past a lease and a half, each replica still delivers to its own client.
	testwait.For(t, time.Minute, func() error {
		mu.Lock()
		defer mu.Unlock()
		for i := range 2 {
			if since := last[i].Sub(cutAt); since < partitionLease*3/2 {
				return fmt.Errorf("r%d last delivered %v after the cut", i+1, since.Round(time.Millisecond))
			}
		}
		return nil
	})
	for i := range 2 {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ack, err := jss[i].Publish(pctx, "routes.x", []byte("after the cut"))
		cancel()
		if err != nil {
			t.Errorf("publish through r%d after the routes were cut: %v", i+1, err)
		} else {
			t.Logf("publish through r%d after the routes were cut stored at %d", i+1, ack.Sequence)
		}
	}
	stopWork()
	wg.Wait()
	for i := range 2 {
		m, err := c.rep(i).metrics()
		if err != nil {
			t.Fatal(err)
		}
		if f := m["jetgres_consumer_fencings_total"]; f != 0 {
			t.Errorf("r%d fenced %v times", i+1, f)
		}
		if s := m["jetgres_consumers_served"]; s != served[i] {
			t.Errorf("r%d serves %v consumers, %v before the cut", i+1, s, served[i])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("FIGURES received_by_client_of_replica=%v served=%v", got, served)
}

// retryUnavailable calls f until it succeeds, for up to a minute, while it fails with
// "JetStream system temporarily unavailable" (503, err_code 10008), which clients retry:
// on a loaded machine a database call of the replica answering may time out.
func retryUnavailable(t *testing.T, f func() error) {
	t.Helper()
	testwait.For(t, time.Minute, func() error {
		err := f()
		if apiErr, ok := errors.AsType[*jetstream.APIError](err); ok && apiErr.ErrorCode == 10008 {
			return err
		}
		if err != nil {
			t.Fatal(err)
		}
		return nil
	})
}
