package e2e

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// envBench turns on TestConsumerBench, which takes about a minute and wants a quiet machine.
const envBench = "JETGRES_BENCH"

// Sizes of the consumer benchmark.
const (
	benchFetchMsgs = 200_000
	benchMsgSize   = 128
	benchBatch     = 500
	benchRate      = 1000 // messages a second for the latency run
	benchLatency   = 10 * time.Second
	benchWarmUp    = time.Second // left out of the latency figures
)

// TestConsumerBench measures pull consumers through jetgres (the real binary, with its
// private PostgreSQL at default settings, and on a PostgreSQL without fsync, which shows
// what the commit's flush costs) and through nats-server's own JetStream (file storage,
// which flushes in the background), in one run with the same client code, and reports
// jetgres against JetStream:
//
//   - fetch + ack throughput: Fetch(500) and an Ack per message over 200,000 stored
//     messages of 128 B, until the consumer's ack floor reaches the last one;
//   - end-to-end latency at 1,000 msg/s: a publisher stamps the send time into each
//     payload, a Consume() consumer reads it on delivery.
//
// Run it with: JETGRES_BENCH=1 go test -run TestConsumerBench -v ./e2e/
func TestConsumerBench(t *testing.T) {
	if os.Getenv(envBench) != "1" {
		t.Skipf("set %s=1 to run the consumer benchmark", envBench)
	}
	if raceEnabled() {
		t.Skip("the race detector would measure itself")
	}
	targets := []struct{ name, url string }{
		{"JetStream", startJetStream(t)},
		{"jetgres", startJetgres(t, options{}).natsURL},
		{"jetgres, fsync off", startWithDatabase(t, testDatabase(t)).natsURL},
	}

	rates := make([]float64, len(targets))
	lats := make([][]time.Duration, len(targets))
	for i, tg := range targets {
		rates[i] = fetchAckRate(t, tg.url)
		t.Logf("%s: fetch+ack %.0f msg/s", tg.name, rates[i])
	}
	for i, tg := range targets {
		lats[i] = endToEndLatency(t, tg.url)
		t.Logf("%s: end-to-end at %d msg/s: p50 %v p99 %v (%d messages)", tg.name, benchRate,
			benchPercentile(lats[i], 50), benchPercentile(lats[i], 99), len(lats[i]))
	}

	t.Logf("against JetStream (fetch+ack of %d x %d B with batch %d; end-to-end at %d msg/s):",
		benchFetchMsgs, benchMsgSize, benchBatch, benchRate)
	for i := 1; i < len(targets); i++ {
		t.Logf("%s: fetch+ack %.2fx the rate; end-to-end p50 %.1fx, p99 %.1fx the latency", targets[i].name, rates[i]/rates[0],
			float64(benchPercentile(lats[i], 50))/float64(benchPercentile(lats[0], 50)),
			float64(benchPercentile(lats[i], 99))/float64(benchPercentile(lats[0], 99)))
	}
}

// startJetStream runs nats-server with JetStream on file storage in a temporary directory.
func startJetStream(t *testing.T) string {
	t.Helper()
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("JetStream server not ready")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s.ClientURL()
}

// benchConnect connects to url and creates stream name on subject, file storage.
func benchConnect(t *testing.T, ctx context.Context, url, name, subject string) (jetstream.JetStream, jetstream.Stream) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	return js, s
}

// fetchAckRate stores benchFetchMsgs messages, then fetches and acks them all and returns the
// rate, measured until the consumer's ack floor covers the last one.
func fetchAckRate(t *testing.T, url string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	js, s := benchConnect(t, ctx, url, "FETCHBENCH", "fetchbench")
	payload := make([]byte, benchMsgSize)
	publishAll(t, ctx, js, "fetchbench", benchFetchMsgs, func(int) []byte { return payload })
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for got := 0; got < benchFetchMsgs; {
		b, err := c.Fetch(min(benchBatch, benchFetchMsgs-got), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range b.Messages() {
			if err := m.Ack(); err != nil {
				t.Fatal(err)
			}
			n++
		}
		if err := b.Error(); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatalf("empty fetch after %d messages", got)
		}
		got += n
	}
	testwait.For(t, time.Minute, func() error {
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		if info.AckFloor.Stream != benchFetchMsgs {
			return fmt.Errorf("ack floor %d of %d", info.AckFloor.Stream, benchFetchMsgs)
		}
		return nil
	})
	return benchFetchMsgs / time.Since(start).Seconds()
}

// endToEndLatency publishes at benchRate for benchLatency, each payload stamped with its send
// time, to a Consume() consumer, and returns the latencies after the warm-up.
func endToEndLatency(t *testing.T, url string) []time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, s := benchConnect(t, ctx, url, "LATBENCH", "latbench")
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	total := int(benchLatency.Seconds() * benchRate)
	warm := int(benchWarmUp.Seconds() * benchRate)
	var mu sync.Mutex
	lats := make([]time.Duration, 0, total)
	last := false
	done := make(chan struct{})
	cc, err := c.Consume(func(m jetstream.Msg) {
		now := time.Now().UnixNano()
		d := m.Data()
		i, sent := binary.BigEndian.Uint64(d), int64(binary.BigEndian.Uint64(d[8:]))
		_ = m.Ack()
		mu.Lock()
		defer mu.Unlock()
		if int(i) >= warm {
			lats = append(lats, time.Duration(now-sent))
		}
		if int(i) == total-1 && !last {
			last = true
			close(done)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()

	start := time.Now()
	for i := range total {
		// Each message has its own payload: the client keeps it to resend on a retry.
		payload := make([]byte, benchMsgSize)
		// Paced against the start rather than by sleeping a fixed interval, so that a late
		// wake-up does not lower the rate.
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / benchRate)))
		binary.BigEndian.PutUint64(payload, uint64(i))
		binary.BigEndian.PutUint64(payload[8:], uint64(time.Now().UnixNano()))
		if _, err := js.PublishAsync("latbench", payload); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("the last of %d messages never arrived", total)
	}
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(lats)
}

// benchPercentile is the p-th percentile of ds, rounded to a microsecond.
func benchPercentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(int(float64(len(s))*p/100), len(s)-1)
	return s[i].Round(time.Microsecond)
}
