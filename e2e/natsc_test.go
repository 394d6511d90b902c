package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// natsC builds a program against nats.c (Debian's libnats-dev), or skips the test when the
// machine has no C compiler or no nats.c.
func natsC(t *testing.T, source string) string {
	t.Helper()
	if _, err := os.Stat("/usr/include/nats/nats.h"); err != nil {
		t.Skip("nats.c is not installed (Debian: apt-get install libnats-dev); the C client is not tried")
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler; the C client is not tried")
	}
	bin := filepath.Join(t.TempDir(), strings.TrimSuffix(filepath.Base(source), ".c"))
	if out, err := exec.Command(cc, "-o", bin, source, "-lnats").CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", source, err, out)
	}
	return bin
}

// nats.c's js_SubscribeSync on a filtered consumer reads the positions JetStream reports: the
// last message the consumer took, not the other subjects' messages stored after it.
func TestNatsCFilteredConsumerPositions(t *testing.T) {
	t.Parallel()
	bin := natsC(t, filepath.Join("testdata", "filtered_positions.c"))
	var out [2]string
	for i, s := range []natsServer{startJetStream(t), {name: "jetgres", url: startWithDatabase(t, testDatabase(t)).natsURL}} {
		ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
		b, err := exec.CommandContext(ctx, bin, s.url).CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("%s: %v\n%s", s.name, err, b)
		}
		out[i] = strings.TrimSpace(string(b))
	}
	if out[0] != out[1] || out[1] != "delivered=5 ack_floor=5" {
		t.Fatalf("nats.c reads jetstream %q, jetgres %q; want delivered=5 ack_floor=5 from both", out[0], out[1])
	}
}
