package e2e

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestCounterCLI drives a counter stream with `nats counter` against a real JetStream and
// against jetgres, with eight nats.go publishers incrementing one counter at once in
// between, and compares everything the CLI prints: the totals after each increment, the
// value, the counter's metadata and the list of counters.
func TestCounterCLI(t *testing.T) {
	t.Parallel()
	servers := []natsServer{startJetStream(t), {name: "jetgres", url: startWithDatabase(t, testDatabase(t)).natsURL}}
	const publishers, each = 8, 50
	var out [2]string
	for i, s := range servers {
		natsAt(t, s, "stream", "add", "CTR", "--subjects", "ctr.>", "--allow-counter", "--allow-direct", "--defaults")
		out[i] += natsAt(t, s, "counter", "incr", "ctr.hits", "5")
		out[i] += natsAt(t, s, "counter", "decr", "ctr.hits", "7")
		out[i] += natsAt(t, s, "counter", "incr", "ctr.hits", "100000000000000000000000")
		incrementAtOnce(t, s, "ctr.hits", publishers, each)
		out[i] += natsAt(t, s, "counter", "get", "ctr.hits")
		out[i] += natsAt(t, s, "counter", "view", "ctr.hits")
		out[i] += natsAt(t, s, "counter", "list", "--stream", "CTR")
	}
	if out[0] != out[1] {
		t.Errorf("nats counter differs:\n--- jetstream\n%s\n--- jetgres\n%s", out[0], out[1])
	}
	// 10^23 - 2 + 400, as get prints it.
	if want := "\n100000000000000000000398\n"; !strings.Contains(out[1], want) {
		t.Errorf("jetgres: the total is not %s:\n%s", want, out[1])
	}
}

// incrementAtOnce has publishers nats.go clients increment subject by one, each times, all
// at once, and fails unless every increment is acknowledged with a total no other had.
func incrementAtOnce(t *testing.T, s natsServer, subject string, publishers, each int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	seen := make(map[string]bool)
	errs := make(chan error, publishers)
	var wg sync.WaitGroup
	for range publishers {
		nc, err := nats.Connect(s.url)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for range each {
				m := nats.NewMsg(subject)
				m.Header.Set(server.JSMessageIncr, "1")
				ack, err := js.PublishMsg(ctx, m)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				seen[ack.Value] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("%s: increment: %v", s.name, err)
	}
	if len(seen) != publishers*each {
		t.Fatalf("%s: %d distinct totals in %d PubAcks", s.name, len(seen), publishers*each)
	}
}
