package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// TestAtomicBatchCLI publishes atomic batches with `nats pub --atomic` to a real JetStream
// and to jetgres, and compares what the CLI prints, with times taken out, and what the
// streams then hold: the CLI asks jetgres (its API level lets it), and jetgres stores the
// batch whole.
func TestAtomicBatchCLI(t *testing.T) {
	t.Parallel()
	servers := []natsServer{startJetStream(t), {name: "jetgres", url: startWithDatabase(t, testDatabase(t)).natsURL}}
	var out [2]string
	var msgs [2]uint64
	for i, s := range servers {
		natsAt(t, s, "stream", "add", "AT", "--subjects", "at.>", "--allow-batch", "--defaults")
		out[i] = pubAtomic(t, s, 100)
		var info struct {
			State struct {
				Msgs uint64 `json:"messages"`
			} `json:"state"`
		}
		if err := json.Unmarshal([]byte(natsAt(t, s, "stream", "info", "AT", "--json")), &info); err != nil {
			t.Fatalf("%s: stream info: %v", s.name, err)
		}
		msgs[i] = info.State.Msgs
	}
	if a, b := cliTimes.ReplaceAllString(out[0], "T"), cliTimes.ReplaceAllString(out[1], "T"); a != b {
		t.Errorf("nats pub --atomic differs:\n--- jetstream\n%s\n--- jetgres\n%s", out[0], out[1])
	}
	if msgs[0] != 100 || msgs[1] != msgs[0] {
		t.Errorf("streams hold: jetstream %d, jetgres %d messages, want 100", msgs[0], msgs[1])
	}
}

// cliTimes matches the durations and times the CLI prints, and the batch id it draws.
var cliTimes = regexp.MustCompile(`[0-9.]+(ns|µs|ms|s)\b|\d{2}:\d{2}:\d{2}|batch ID: \S+`)

// pubAtomic publishes n lines as one atomic batch with the nats CLI, which reads a batch's
// messages from its standard input, and returns what it prints.
func pubAtomic(t *testing.T, s natsServer, n int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	var in strings.Builder
	for i := range n {
		fmt.Fprintf(&in, "m %d\n", i)
	}
	cmd := natsCmdAt(t, ctx, s.url, "pub", "at.x", "--atomic", "--send-on", "newline")
	cmd.Stdin = strings.NewReader(in.String())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: nats pub --atomic: %v\n%s", s.name, err, out)
	}
	return string(out)
}
