package bridge

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/jstwin"
)

// createStreamsInPG creates n streams straight in PostgreSQL, several at a time, and has the
// bridge serve them: the API would take minutes for the numbers these tests need.
func createStreamsInPG(t testing.TB, tb *testBundle, prefix string, n int) {
	t.Helper()
	// Each new stream attaches a chunk table to jetgres.msgs, which costs more the more
	// partitions it has (about 80 ms at 10,000): 10,000 streams take minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	t.Cleanup(cancel)
	const workers = 8
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				name := fmt.Sprintf("%s%d", prefix, i)
				cfg, err := json.Marshal(server.StreamConfig{Name: name, Subjects: []string{fmt.Sprintf("%s.%d", prefix, i)}, Storage: server.FileStorage, Retention: server.LimitsPolicy, Replicas: 1})
				if err == nil {
					_, err = tb.db.CreateStream(ctx, name, cfg)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := tb.bridge.streams.Sync(ctx); err != nil {
		t.Fatal(err)
	}
}

// Account information counts every stream and consumer and adds up the bytes the streams'
// own infos report, for a few hundred streams, some holding messages.
func TestAccountInfoTotalsManyStreams(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	createStreamsInPG(t, tb, "ACCT", 300)
	consumers := 0
	for i := range 5 {
		name := fmt.Sprintf("FULL%d", i)
		s, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{fmt.Sprintf("full.%d.>", i)}})
		if err != nil {
			t.Fatal(err)
		}
		for j := range 10 * (i + 1) {
			if _, err := tb.js.Publish(ctx, fmt.Sprintf("full.%d.%d", i, j%3), make([]byte, 10*j)); err != nil {
				t.Fatal(err)
			}
		}
		for range i {
			// An ephemeral consumer goes after inactive_threshold (5 s by default) without
			// interest: on a loaded machine the test could outlast it.
			if _, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, InactiveThreshold: time.Hour}); err != nil {
				t.Fatal(err)
			}
			consumers++
		}
	}

	var bytes uint64
	var streams, infoConsumers int
	for info := range tb.js.ListStreams(ctx).Info() {
		streams++
		bytes += info.State.Bytes
		infoConsumers += info.State.Consumers
	}
	if streams != 305 || infoConsumers != consumers || bytes == 0 {
		t.Fatalf("stream infos: %d streams, %d consumers, %d bytes; want 305 streams, %d consumers, some bytes", streams, infoConsumers, bytes, consumers)
	}
	acct, err := tb.js.AccountInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if acct.Streams != streams || acct.Consumers != consumers || acct.Store != bytes || acct.Memory != 0 {
		t.Errorf("account info: %d streams, %d consumers, store %d, memory %d; stream infos: %d streams, %d consumers, %d bytes",
			acct.Streams, acct.Consumers, acct.Store, acct.Memory, streams, consumers, bytes)
	}
}

// BenchmarkAccountInfo10kStreams times $JS.API.INFO over 10,000 streams, which must answer
// well within the clients' 5 s default request timeout.
func BenchmarkAccountInfo10kStreams(b *testing.B) {
	tb := setup(b)
	createStreamsInPG(b, tb, "BENCH", 10_000)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for b.Loop() {
		acct, err := tb.js.AccountInfo(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if acct.Streams != 10_000 {
			b.Fatalf("account info counts %d streams, want 10000", acct.Streams)
		}
	}
}

// Account information counts usage and reservations by storage type as nats-server does: a
// stream with a byte limit reserves that limit of its storage type, and each stream's bytes
// count as file or memory storage, a memory stream's message as its memory store counts it
// (every publish compares each stream's bytes too).
func TestAccountInfoStorageMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "FL", Subjects: []string{"fl.>"}, MaxBytes: 1 << 20})
	tw.createStream(jetstream.StreamConfig{Name: "FU", Subjects: []string{"fu.>"}})
	tw.createStream(jetstream.StreamConfig{Name: "ML", Subjects: []string{"ml.>"}, Storage: jetstream.MemoryStorage, MaxBytes: 64 << 10})
	tw.createStream(jetstream.StreamConfig{Name: "MU", Subjects: []string{"mu.>"}, Storage: jetstream.MemoryStorage})
	tw.pubN("fl.x", 5, 100)
	tw.pubN("fu.x", 3, 10)
	tw.pubN("ml.x", 4, 50)
	tw.pubN("mu.x", 2, 0)
	var infos [2]*jetstream.AccountInfo
	for side, js := range tw.js {
		var err error
		if infos[side], err = js.AccountInfo(tw.ctx); err != nil {
			t.Fatalf("%s: %v", sideName[side], err)
		}
	}
	got, want := infos[ours].Tier, infos[theirs].Tier
	got.Limits, want.Limits = jetstream.AccountLimits{}, jetstream.AccountLimits{}
	if got != want {
		t.Fatalf("account info: jetgres %+v, JetStream %+v", got, want)
	}
}

// A memory stream's max_bytes evicts as nats-server's memory store does: its messages count
// 16 bytes besides their subject, headers and payload, where a file stream's count 30 or 34.
func TestMemoryStreamMaxBytesMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "MB", Subjects: []string{"mb.>"}, Storage: jetstream.MemoryStorage, MaxBytes: 500})
	for range 12 {
		tw.pub("mb.x", make([]byte, 50)) // every publish compares messages, bytes and first sequence
	}
	tw.want("MB", 7, 6, 12, 0)
}

// The JetStream resources of the NATS configuration (max_memory_store, max_file_store) bound
// jetgres as they bound nats-server: a stream whose max_bytes would take its storage type's
// reservations past the bound is refused (10047 for file, 10028 for memory), and once the
// streams of a type hold more than it, the next publish is refused (10023).
func TestStorageBoundsMatchJetStream(t *testing.T) {
	t.Parallel()
	const maxMemory, maxStore = 1 << 20, 2 << 20
	tb := setup(t, setupOpts{config: func(c *Config) { c.MaxMemory, c.MaxStore = maxMemory, maxStore }})
	tw := &twin{t: t, ctx: testContext(t), tb: tb, js: [2]jetstream.JetStream{tb.js,
		startJetStreamWith(t, jstwin.Config{MaxMemory: maxMemory, MaxStore: maxStore})}}
	create := func(cfg jetstream.StreamConfig) jetstream.ErrorCode {
		t.Helper()
		var code [2]jetstream.ErrorCode
		for side, js := range tw.js {
			_, err := js.CreateStream(tw.ctx, cfg)
			code[side] = errCode(t, side, err)
		}
		if code[ours] != code[theirs] {
			t.Fatalf("create %s: jetgres err_code %d, JetStream %d", cfg.Name, code[ours], code[theirs])
		}
		if code[ours] == 0 {
			tw.streams = append(tw.streams, cfg.Name)
		}
		return code[ours]
	}
	if code := create(jetstream.StreamConfig{Name: "BIG", Subjects: []string{"big"}, MaxBytes: 3 << 20}); code != 10047 {
		t.Fatalf("a file stream reserving more than max_file_store: err_code %d, want 10047", code)
	}
	create(jetstream.StreamConfig{Name: "R1", Subjects: []string{"r1"}, MaxBytes: 1536 << 10})
	if code := create(jetstream.StreamConfig{Name: "R2", Subjects: []string{"r2"}, MaxBytes: 1 << 20}); code != 10047 {
		t.Fatalf("reservations past max_file_store: err_code %d, want 10047", code)
	}
	if code := create(jetstream.StreamConfig{Name: "MB", Subjects: []string{"mb"}, Storage: jetstream.MemoryStorage, MaxBytes: 2 << 20}); code != 10028 {
		t.Fatalf("a memory stream reserving more than max_memory_store: err_code %d, want 10028", code)
	}
	create(jetstream.StreamConfig{Name: "U", Subjects: []string{"u"}})
	create(jetstream.StreamConfig{Name: "M", Subjects: []string{"m"}, Storage: jetstream.MemoryStorage})
	data := make([]byte, 100<<10)
	for _, subject := range []string{"u", "m"} {
		refused := false
		for range 40 {
			if _, code := tw.pub(subject, data); code != 0 { // both refuse the same publish, or fail the test
				if code != 10023 {
					t.Fatalf("publish to %s past the bound: err_code %d, want 10023", subject, code)
				}
				refused = true
				break
			}
		}
		if !refused {
			t.Fatalf("no publish to %s was refused", subject)
		}
	}
}
