package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// TestMirrorFromHub moves a stream from a live JetStream onto jetgres, as the README's
// migration path does: jetgres joins the hub (JetStream domain "hub") with a leafnode
// remote, mirrors the hub's ORDERS through $JS.hub.API while publishers keep writing to it,
// and once the publishers stop and the lag is zero the mirror is promoted. Every message
// JetStream acknowledged is then in jetgres exactly once, under JetStream's sequence, with
// its data and store time.
// hubStallWait lets a publisher to the hub wait for its window of unacknowledged publishes
// to drain, rather than fail after nats.go's 200 ms, when a loaded machine slows the hub's
// acks: the tests are about what the copy holds, not the publishers' pace.
var hubStallWait = jetstream.WithStallWait(time.Minute)

func TestMirrorFromHub(t *testing.T) {
	j, hubJS := jetgresOnHub(t)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := hubJS.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	_, pgJS := j.connect(t)

	// Publishers on the hub, before and during the mirroring, at about 5,000 msg/s
	// together: 25 messages per 10 ms each.
	const publishers, perPublisher, perTick = 2, 10_000, 25
	acked := make([]map[uint64]string, publishers)
	var mu sync.Mutex // guards acked
	var wg, acks sync.WaitGroup
	began := time.Now()
	mirrorNow := make(chan struct{})
	for p := range publishers {
		acked[p] = make(map[uint64]string)
		wg.Go(func() {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for i := range perPublisher {
				if i%perTick == 0 {
					<-tick.C
				}
				if p == 0 && i == perPublisher/4 {
					close(mirrorNow)
				}
				data := fmt.Sprintf("p%d-%d", p, i)
				f, err := hubJS.PublishAsync(fmt.Sprintf("orders.%d", i%7), []byte(data), hubStallWait)
				if err != nil {
					t.Errorf("publish: %v", err)
					return
				}
				acks.Go(func() {
					select {
					case ack := <-f.Ok():
						mu.Lock()
						acked[p][ack.Sequence] = data
						mu.Unlock()
					case err := <-f.Err():
						t.Errorf("publish %s: %v", data, err)
					}
				})
			}
		})
	}
	<-mirrorNow
	if _, err := pgJS.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Mirror: &jetstream.StreamSource{
		Name: "ORDERS", External: &jetstream.ExternalStream{APIPrefix: "$JS.hub.API"}}}); err != nil {
		t.Fatal(err)
	}
	// The mirror copies while the publishers still publish.
	published := make(chan struct{})
	go func() { wg.Wait(); close(published) }()
	testwait.For(t, 30*time.Second, func() error {
		s, err := pgJS.Stream(ctx, "ORDERS")
		if err != nil {
			return err
		}
		if s.CachedInfo().State.Msgs == 0 {
			return fmt.Errorf("nothing mirrored yet")
		}
		return nil
	})
	select {
	case <-published:
		t.Error("the publishers were done before the mirror copied anything")
	default:
	}
	<-published
	acks.Wait()
	elapsed := time.Since(began)
	hubInfo, err := hubJS.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	total := hubInfo.CachedInfo().State.Msgs
	t.Logf("%d messages published to the hub in %s (%.0f msg/s)", total, elapsed.Round(time.Millisecond), float64(total)/elapsed.Seconds())

	// Watch the lag reach zero, then promote.
	testwait.For(t, 2*time.Minute, func() error {
		s, err := pgJS.Stream(ctx, "ORDERS")
		if err != nil {
			return err
		}
		info := s.CachedInfo()
		if info.Mirror == nil || info.Mirror.Error != nil || info.Mirror.Lag != 0 || info.State.LastSeq != total {
			return fmt.Errorf("mirror %+v at last sequence %d, hub at %d", info.Mirror, info.State.LastSeq, total)
		}
		return nil
	})
	if _, err := pgJS.UpdateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}

	s, err := pgJS.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	if st := s.CachedInfo().State; st.Msgs != total || st.FirstSeq != 1 || st.LastSeq != total {
		t.Fatalf("promoted stream state %+v, want %d messages from 1", st, total)
	}
	got := make(map[uint64]string, total)
	readEach(t, ctx, s, total, func(m jetstream.Msg) {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if _, dup := got[md.Sequence.Stream]; dup {
			t.Fatalf("sequence %d read twice", md.Sequence.Stream)
		}
		got[md.Sequence.Stream] = string(m.Data())
	})
	n := 0
	for p := range acked {
		for seq, data := range acked[p] {
			n++
			if got[seq] != data {
				t.Fatalf("sequence %d: jetgres has %q, JetStream acknowledged %q", seq, got[seq], data)
			}
		}
	}
	if uint64(n) != total {
		t.Fatalf("%d acknowledgements for %d messages", n, total)
	}
	// The promoted stream takes publishes, after JetStream's sequences.
	ack, err := pgJS.Publish(ctx, "orders.after", []byte("after promotion"))
	if err != nil || ack.Sequence != total+1 {
		t.Fatalf("publish after promotion: %+v, %v", ack, err)
	}
}

// TestHubMirrorsJetgres is the other direction, a team moving back: the hub's JetStream
// mirrors a jetgres stream through $JS.pg.API. jetgres answers the consumer create as
// nats-server does (a sourcing consumer needs an API level it does not serve, so the hub
// asks again for a direct one), and the hub's mirror ends up with jetgres's messages under
// jetgres's sequences.
func TestHubMirrorsJetgres(t *testing.T) {
	j, hubJS := jetgresOnHub(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, pgJS := j.connect(t)
	if _, err := pgJS.CreateStream(ctx, jetstream.StreamConfig{Name: "PGORD", Subjects: []string{"pgord.>"}}); err != nil {
		t.Fatal(err)
	}
	const n = 500
	publishAll(t, ctx, pgJS, "pgord.x", n, func(i int) []byte { return fmt.Appendf(nil, "m%d", i) })
	m, err := hubJS.CreateStream(ctx, jetstream.StreamConfig{Name: "PGORD", Mirror: &jetstream.StreamSource{
		Name: "PGORD", External: &jetstream.ExternalStream{APIPrefix: "$JS.pg.API"}}})
	if err != nil {
		t.Fatal(err)
	}
	testwait.For(t, time.Minute, func() error {
		info, err := m.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != n || info.State.LastSeq != n {
			return fmt.Errorf("hub mirror: %+v, mirror block %+v", info.State, info.Mirror)
		}
		return nil
	})
	o, err := pgJS.Stream(ctx, "PGORD")
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= n; seq += 49 {
		a, err := o.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		b, err := m.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if string(a.Data) != string(b.Data) || !a.Time.Equal(b.Time) {
			t.Fatalf("seq %d: jetgres %q %s, hub %q %s", seq, a.Data, a.Time, b.Data, b.Time)
		}
	}
}

// TestSourcesFromHub aggregates two streams of a live JetStream hub into one jetgres stream
// with sources over the leafnode remote, while publishers write to both: once they stop
// and both lags are zero, every message JetStream acknowledged is in the jetgres stream
// exactly once, named by its Nats-Stream-Source header (origin and origin sequence).
func TestSourcesFromHub(t *testing.T) {
	j, hubJS := jetgresOnHub(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	origins := []string{"ORDERS", "RETURNS"}
	for _, o := range origins {
		if _, err := hubJS.CreateStream(ctx, jetstream.StreamConfig{Name: o, Subjects: []string{strings.ToLower(o) + ".>"}}); err != nil {
			t.Fatal(err)
		}
	}
	_, pgJS := j.connect(t)
	ext := &jetstream.ExternalStream{APIPrefix: "$JS.hub.API"}
	if _, err := pgJS.CreateStream(ctx, jetstream.StreamConfig{Name: "ALL", Sources: []*jetstream.StreamSource{
		{Name: "ORDERS", External: ext}, {Name: "RETURNS", External: ext}}}); err != nil {
		t.Fatal(err)
	}

	// One publisher per origin, about 2,500 msg/s each.
	const perOrigin, perTick = 8_000, 25
	var mu sync.Mutex // guards acked
	acked := make(map[string]string)
	var wg, acks sync.WaitGroup
	for _, o := range origins {
		wg.Go(func() {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for i := range perOrigin {
				if i%perTick == 0 {
					<-tick.C
				}
				data := fmt.Sprintf("%s-%d", o, i)
				f, err := hubJS.PublishAsync(strings.ToLower(o)+".new", []byte(data), hubStallWait)
				if err != nil {
					t.Errorf("publish: %v", err)
					return
				}
				acks.Go(func() {
					select {
					case ack := <-f.Ok():
						mu.Lock()
						acked[fmt.Sprintf("%s %d", o, ack.Sequence)] = data
						mu.Unlock()
					case err := <-f.Err():
						t.Errorf("publish %s: %v", data, err)
					}
				})
			}
		})
	}
	wg.Wait()
	acks.Wait()
	total := uint64(len(acked))
	testwait.For(t, 2*time.Minute, func() error {
		s, err := pgJS.Stream(ctx, "ALL")
		if err != nil {
			return err
		}
		info := s.CachedInfo()
		for _, si := range info.Sources {
			if si.Error != nil || si.Lag != 0 {
				return fmt.Errorf("source %+v", si)
			}
		}
		if info.State.Msgs != total {
			return fmt.Errorf("%d messages sourced, want %d", info.State.Msgs, total)
		}
		return nil
	})
	s, err := pgJS.Stream(ctx, "ALL")
	if err != nil {
		t.Fatal(err)
	}
	seen := make(map[string]bool, total)
	readEach(t, ctx, s, total, func(m jetstream.Msg) {
		f := strings.Fields(m.Headers().Get("Nats-Stream-Source"))
		if len(f) < 2 {
			t.Fatalf("message %q without a source header: %v", m.Data(), m.Headers())
		}
		key := strings.SplitN(f[0], ":", 2)[0] + " " + f[1]
		if seen[key] {
			t.Fatalf("%s sourced twice", key)
		}
		seen[key] = true
		if acked[key] != string(m.Data()) {
			t.Fatalf("%s: jetgres has %q, JetStream acknowledged %q", key, m.Data(), acked[key])
		}
	})
}

// readEach reads total messages of s with an ordered consumer and hands each to fn; it
// fails t when a fetch brings nothing before all were read.
func readEach(t *testing.T, ctx context.Context, s jetstream.Stream, total uint64, fn func(jetstream.Msg)) {
	t.Helper()
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for read := uint64(0); read < total; {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			fn(m)
			n++
		}
		if n == 0 {
			t.Fatalf("read %d of %d messages, then nothing", read, total)
		}
		read += uint64(n)
	}
}

// jetgresOnHub starts a JetStream hub (domain "hub") and a jetgres (domain "pg") joined to
// it by a leafnode remote, returns once the link is up, with a client of the hub's
// JetStream.
func jetgresOnHub(t *testing.T) (*jetgres, jetstream.JetStream) {
	t.Helper()
	hub := startDomainHub(t)
	conf := filepath.Join(t.TempDir(), "leaf.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, "leafnodes { remotes: [ { url: %q } ] }\n", hub.leafURL(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	j := startJetgres(t, options{Args: []string{"--nats-config", conf, "--js-domain", "pg"}})
	testwait.For(t, 30*time.Second, func() error { _, err := hub.leaf(); return err })
	hubNC, err := nats.Connect(hub.ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hubNC.Close)
	hubJS, err := jetstream.New(hubNC, jetstream.WithPublishAsyncMaxPending(512))
	if err != nil {
		t.Fatal(err)
	}
	return j, hubJS
}
