//go:build soak

package e2e

// A day of load: three replicas on one PostgreSQL under mixed work for hours, sampled every
// minute, to show that what they hold (memory, goroutines, files, connections, tables) stays
// flat once warm. It runs only with the soak build tag, never in CI's time:
//
//	go test -c -tags soak -o soak.test ./e2e/
//	(cd e2e && ../soak.test -test.run TestDayOfLoad -test.v -test.timeout 0 \
//	    -soak.duration 2h2m -soak.out DIR)
//
// DIR then holds samples.csv and tables.csv (one row a minute), soak.md (the judgement, for
// BENCHMARKS.md) and docs/soak/*.png (the curves it links). SIGTERM or SIGINT ends the run
// early: the report is written from what was sampled, and the replicas and PostgreSQL stop.
// soak_replay_test.go writes the report again from samples.csv.

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

var (
	soakFlagDuration = flag.Duration("soak.duration", 3*time.Minute, "how long the load runs")
	soakFlagEvery    = flag.Duration("soak.sample", time.Minute, "time between two samples")
	soakFlagRestart  = flag.Duration("soak.restart", 10*time.Minute, "time between two replica restarts")
	soakFlagWarmup   = flag.Duration("soak.warmup", 15*time.Minute, "time before the samples the judgement compares")
	soakFlagRate     = flag.Int("soak.rate", 500, "stream publishes per second, all publishers together")
	soakFlagKVRate   = flag.Int("soak.kvrate", 100, "key-value puts and deletes per second, all workers together")
	soakFlagOut      = flag.String("soak.out", "", "directory for the samples, plots and report (default: a new one under the temporary directory, kept after the run)")
)

// The shape of the work. Every stream is bounded one way or another (a message limit, an age
// limit, or purges), and every bucket keeps one revision per key, so that the data held
// levels off: whatever grows after the warm-up is a leak, not the data.
const (
	soakStreams    = 500
	soakBuckets    = 50
	soakKeys       = 400 // per bucket
	soakKVWorkers  = 20  // a put waits for its ack: enough of them keep the rate when acks are slow
	soakPull       = 100 // durable pull consumers, on streams 0..99
	soakPush       = 100 // durable push consumers, on streams 100..199
	soakWatchers   = 25  // WatchAll on buckets 0..24
	soakConns      = 6
	soakMaxMsgs    = 1000
	soakMaxAge     = 5 * time.Minute
	soakPurgeEvery = 3 * time.Second
	soakPayload    = 256
)

// soakBound is how stream i is kept from growing: by limits or by the purger.
func soakBound(i int) string {
	switch i % 3 {
	case 0:
		return "max_msgs"
	case 1:
		return "max_age"
	default:
		return "purged"
	}
}

// soakCounters are the load's running totals, read by the sampler.
type soakCounters struct {
	published, pubErrors atomic.Int64
	acked, consumeErrors atomic.Int64
	kvOps, kvErrors      atomic.Int64
	watched              atomic.Int64
	purges, purgeErrors  atomic.Int64
	restarts             atomic.Int64
}

func TestDayOfLoad(t *testing.T) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	out := *soakFlagOut
	var err error
	if out == "" {
		out, err = os.MkdirTemp("", "jetgres-soak-")
	} else {
		err = os.MkdirAll(out, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}

	pg := startPGServer(t)
	// Each replica names its connections, so that PostgreSQL counts them per replica.
	var dsns []string
	for i := range 3 {
		dsns = append(dsns, fmt.Sprintf("%s application_name=soak-r%d", pg.dsn(), i+1))
	}
	// Info, not the harness's debug: the harness keeps each replica's output in memory.
	c := newClusterOn(t, dsns, "--lease", takeoverLease.String(), "--log-level", "info")
	t.Logf("soak: 3 replicas up; output in %s", out)

	var n soakCounters
	conns := make([]*nats.Conn, soakConns)
	jss := make([]jetstream.JetStream, soakConns)
	for i := range conns {
		nc, err := nats.Connect(c.urls(), nats.Name(fmt.Sprintf("soak-%d", i)), nats.MaxReconnects(-1),
			nats.ReconnectWait(250*time.Millisecond), nats.RetryOnFailedConnect(true))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		conns[i] = nc
		js, err := jetstream.New(nc,
			jetstream.WithPublishAsyncMaxPending(500),
			jetstream.WithPublishAsyncTimeout(30*time.Second),
			jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { n.pubErrors.Add(1) }))
		if err != nil {
			t.Fatal(err)
		}
		jss[i] = js
	}
	setupCtx, setupDone := context.WithTimeout(ctx, 10*time.Minute)
	defer setupDone()
	kvs := soakSetup(t, setupCtx, jss)
	t.Logf("soak: %d streams, %d buckets, %d pull and %d push consumers created", soakStreams, soakBuckets, soakPull, soakPush)

	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopLoad()
	soakConsume(t, loadCtx, &wg, conns, jss, &n)
	soakWatch(loadCtx, &wg, kvs, &n)
	for i, js := range jss {
		wg.Go(func() { soakPublish(loadCtx, js, i, &n) })
	}
	for range soakKVWorkers {
		wg.Go(func() { soakKV(loadCtx, kvs, &n) })
	}
	wg.Go(func() { soakPurge(loadCtx, jss[0], &n) })

	s, err := newSoakSampler(t, out, c, pg.dsn(), &n)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.finish(*soakFlagWarmup); err != nil {
			t.Error(err)
		}
		t.Logf("soak: report in %s", out)
	}()

	s.take(ctx)
	sampleT := time.NewTicker(*soakFlagEvery)
	defer sampleT.Stop()
	restartT := time.NewTicker(*soakFlagRestart)
	defer restartT.Stop()
	end := time.After(*soakFlagDuration)
	// r1 is never restarted, so that a leak slower than the restart period still shows in
	// one replica's curves; r2 and r3 take turns.
	next := 1
	for {
		select {
		case <-ctx.Done():
			t.Logf("soak: stopped by a signal after %v", time.Since(s.start).Round(time.Second))
			return
		case <-end:
			return
		case <-sampleT.C:
			s.take(ctx)
		case <-restartT.C:
			soakRestartReplica(t, c, next)
			n.restarts.Add(1)
			next = 3 - next
		}
	}
}

// soakSetup creates the streams, buckets and durable consumers, several calls at a time.
func soakSetup(t *testing.T, ctx context.Context, jss []jetstream.JetStream) []jetstream.KeyValue {
	t.Helper()
	kvs := make([]jetstream.KeyValue, soakBuckets)
	work := make(chan func() error)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for f := range work {
				if err := f(); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	for i := range soakStreams {
		js := jss[i%len(jss)]
		work <- func() error {
			cfg := jetstream.StreamConfig{Name: fmt.Sprintf("SOAK%03d", i), Subjects: []string{fmt.Sprintf("soak.%03d.>", i)}}
			switch soakBound(i) {
			case "max_msgs":
				cfg.MaxMsgs = soakMaxMsgs
			case "max_age":
				cfg.MaxAge = soakMaxAge
			}
			if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
				return fmt.Errorf("stream %s: %w", cfg.Name, err)
			}
			if i >= soakPull+soakPush {
				return nil
			}
			cc := jetstream.ConsumerConfig{Durable: "work", AckPolicy: jetstream.AckExplicitPolicy}
			if i >= soakPull {
				cc.Durable = "pushwork"
				cc.DeliverSubject = fmt.Sprintf("deliver.soak.%03d", i)
			}
			if _, err := js.CreateOrUpdateConsumer(ctx, cfg.Name, cc); err != nil {
				return fmt.Errorf("consumer %s on %s: %w", cc.Durable, cfg.Name, err)
			}
			return nil
		}
	}
	for i := range soakBuckets {
		js := jss[i%len(jss)]
		work <- func() error {
			kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: fmt.Sprintf("soak-kv-%02d", i)})
			kvs[i] = kv
			return err
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatalf("soak setup: %v", err)
	default:
	}
	return kvs
}

// soakConsume starts the pull consumers' Consume loops and the push consumers' subscribers,
// spread over the connections; every message is acknowledged.
func soakConsume(t *testing.T, ctx context.Context, wg *sync.WaitGroup, conns []*nats.Conn, jss []jetstream.JetStream, n *soakCounters) {
	t.Helper()
	ack := func(m jetstream.Msg) {
		if m.Ack() == nil {
			n.acked.Add(1)
		}
	}
	for i := range soakPull {
		js := jss[i%len(jss)]
		cons, err := js.Consumer(ctx, fmt.Sprintf("SOAK%03d", i), "work")
		if err != nil {
			t.Fatal(err)
		}
		cc, err := cons.Consume(ack, jetstream.ConsumeErrHandler(func(jetstream.ConsumeContext, error) { n.consumeErrors.Add(1) }))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			<-ctx.Done()
			cc.Stop()
		})
	}
	for i := soakPull; i < soakPull+soakPush; i++ {
		nc := conns[i%len(conns)]
		sub, err := nc.Subscribe(fmt.Sprintf("deliver.soak.%03d", i), func(m *nats.Msg) {
			if m.Ack() == nil {
				n.acked.Add(1)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			<-ctx.Done()
			_ = sub.Unsubscribe()
		})
	}
}

// soakWatch runs a WatchAll on each of the first buckets and counts the updates.
func soakWatch(ctx context.Context, wg *sync.WaitGroup, kvs []jetstream.KeyValue, n *soakCounters) {
	for i := range soakWatchers {
		wg.Go(func() {
			w, err := kvs[i].WatchAll(ctx, jetstream.UpdatesOnly())
			if err != nil {
				n.kvErrors.Add(1)
				return
			}
			defer func() { _ = w.Stop() }()
			for {
				select {
				case <-ctx.Done():
					return
				case e := <-w.Updates():
					if e != nil {
						n.watched.Add(1)
					}
				}
			}
		})
	}
}

// soakPublish publishes its share of the rate to random streams, asynchronously, in small
// batches every 20 ms.
func soakPublish(ctx context.Context, js jetstream.JetStream, id int, n *soakCounters) {
	const tick = 20 * time.Millisecond
	perTick := float64(*soakFlagRate) / soakConns * tick.Seconds()
	payload := []byte(strings.Repeat("x", soakPayload))
	t := time.NewTicker(tick)
	defer t.Stop()
	var owed float64
	for k := 0; ; {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for owed += perTick; owed >= 1; owed-- {
			subj := fmt.Sprintf("soak.%03d.p%d.%d", rand.IntN(soakStreams), id, k%10)
			k++
			if _, err := js.PublishAsync(subj, payload); err != nil {
				n.pubErrors.Add(1)
				continue
			}
			n.published.Add(1)
		}
	}
}

// soakKV puts (and now and then deletes) random keys of random buckets, one operation at a
// time, at its share of the key-value rate.
func soakKV(ctx context.Context, kvs []jetstream.KeyValue, n *soakCounters) {
	t := time.NewTicker(time.Second * soakKVWorkers / time.Duration(max(1, *soakFlagKVRate)))
	defer t.Stop()
	value := []byte(strings.Repeat("v", 64))
	for k := 0; ; k++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		kv := kvs[rand.IntN(len(kvs))]
		key := fmt.Sprintf("k.%03d", rand.IntN(soakKeys))
		opCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var err error
		if k%10 == 9 {
			err = kv.Delete(opCtx, key)
		} else {
			_, err = kv.Put(opCtx, key, value)
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		n.kvOps.Add(1)
		if err != nil {
			n.kvErrors.Add(1)
		}
	}
}

// soakPurge purges the purged streams in turn, every third purge keeping the newest 100
// messages and every third one subject only, as users do.
func soakPurge(ctx context.Context, js jetstream.JetStream, n *soakCounters) {
	t := time.NewTicker(soakPurgeEvery)
	defer t.Stop()
	var purged []int
	for i := range soakStreams {
		if soakBound(i) == "purged" {
			purged = append(purged, i)
		}
	}
	for k := 0; ; k++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		i := purged[k%len(purged)]
		var opts []jetstream.StreamPurgeOpt
		switch k % 3 {
		case 1:
			opts = append(opts, jetstream.WithPurgeKeep(100))
		case 2:
			opts = append(opts, jetstream.WithPurgeSubject(fmt.Sprintf("soak.%03d.p0.>", i)))
		}
		opCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		s, err := js.Stream(opCtx, fmt.Sprintf("SOAK%03d", i))
		if err == nil {
			err = s.Purge(opCtx, opts...)
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		n.purges.Add(1)
		if err != nil {
			n.purgeErrors.Add(1)
		}
	}
}

// soakRestartReplica stops replica i with SIGTERM, as an orchestrator does, and starts it
// again under its name.
func soakRestartReplica(t *testing.T, c *cluster, i int) {
	t.Helper()
	r := c.rep(i)
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Logf("soak: SIGTERM to r%d: %v", i+1, err)
	}
	if err := r.wait(stopTimeout); err != nil {
		t.Logf("soak: r%d after SIGTERM: %v", i+1, err)
	}
	start := time.Now()
	c.restart(i)
	t.Logf("soak: r%d restarted, ready and routed in %v", i+1, time.Since(start).Round(time.Millisecond))
}
