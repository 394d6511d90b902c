package e2e

import (
	"context"
	"strings"
	"testing"
)

// TestConsumerResetCLI resets a consumer with `nats consumer reset`, back to its ack floor
// and to a sequence, on a real JetStream and on jetgres, and compares what the CLI prints,
// its refusal of a sequence the deliver policy does not allow included.
func TestConsumerResetCLI(t *testing.T) {
	t.Parallel()
	servers := []natsServer{startJetStream(t), {name: "jetgres", url: startWithDatabase(t, testDatabase(t)).natsURL}}
	var out [2][]string
	for i, s := range servers {
		natsAt(t, s, "stream", "add", "RC", "--subjects", "rc.>", "--defaults")
		for range 5 {
			natsAt(t, s, "pub", "rc.x", "m")
		}
		natsAt(t, s, "consumer", "add", "RC", "ALL", "--pull", "--deliver", "all", "--ack", "explicit", "--defaults")
		natsAt(t, s, "consumer", "add", "RC", "NEW", "--pull", "--deliver", "new", "--ack", "explicit", "--defaults")
		natsAt(t, s, "consumer", "next", "RC", "ALL", "--count", "3")
		for _, args := range [][]string{
			{"consumer", "reset", "RC", "ALL", "-f"},
			{"consumer", "reset", "RC", "ALL", "--sequence", "4", "-f"},
			{"consumer", "info", "RC", "ALL"},
		} {
			out[i] = append(out[i], natsAt(t, s, args...))
		}
		out[i] = append(out[i], natsFailsAt(t, s, "consumer", "reset", "RC", "NEW", "--sequence", "2", "-f"))
	}
	for k := range out[0] {
		if a, b := cliVolatile.ReplaceAllString(out[0][k], "X"), cliVolatile.ReplaceAllString(out[1][k], "X"); a != b {
			t.Errorf("nats output %d differs:\n--- jetstream\n%s\n--- jetgres\n%s", k, out[0][k], out[1][k])
		}
	}
}

// natsFailsAt runs the nats CLI against s and returns its combined output, failing the test
// unless it exits with an error within cliTimeout.
func natsFailsAt(t *testing.T, s natsServer, args ...string) string {
	t.Helper()
	natsCLI(t)
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	out, err := natsCmdAt(t, ctx, s.url, args...).CombinedOutput()
	if err == nil {
		t.Fatalf("%s: nats %s succeeded, want it refused\n%s", s.name, strings.Join(args, " "), out)
	}
	return string(out)
}
