package e2e

// Helpers most end-to-end tests share beside the harness (e2e_test.go): jetgres on a database
// of the test's own, watched for data races; the nats CLI and nats.go clients; publishing in
// bulk; reading /metrics and command output; the switch for the long variants.

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// cliTimeout bounds one nats CLI command; benchTimeout one `nats bench` run, whose tens of
// thousands of messages take half a minute on a loaded machine under the race detector.
// Both only guard against a hang: speed is the bench command's business.
const (
	cliTimeout   = 30 * time.Second
	benchTimeout = 5 * time.Minute
)

// startWithDatabase starts jetgres on dsn, with extra flags.
func startWithDatabase(t *testing.T, dsn string, args ...string) *jetgres {
	t.Helper()
	j := startJetgres(t, options{Args: append([]string{"--database-url", dsn}, args...)})
	failOnRace(t, j)
	return j
}

// failOnRace fails the test if jetgres, built with the race detector when the tests are,
// reports a data race: the process keeps running after one, so nothing else would notice.
// The harness prints jetgres's output for a failed test.
func failOnRace(t testing.TB, j *jetgres) {
	t.Cleanup(func() {
		if strings.Contains(j.logs.String(), "WARNING: DATA RACE") {
			t.Error("jetgres reported a data race")
		}
	})
}

// nats runs the nats CLI against j and returns its combined output, failing the test unless
// it exits 0 within cliTimeout.
func (j *jetgres) nats(t *testing.T, args ...string) string {
	t.Helper()
	return j.natsWithin(t, cliTimeout, args...)
}

// natsWithin is nats with its own bound.
func (j *jetgres) natsWithin(t *testing.T, within time.Duration, args ...string) string {
	t.Helper()
	// Finding the CLI may mean installing it, which must not count against the command.
	natsCLI(t)
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	start := time.Now()
	out, err := j.natsCmd(t, ctx, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("nats %s: %v after %v\n%s", strings.Join(args, " "), err, time.Since(start).Round(time.Millisecond), out)
	}
	return string(out)
}

// connect opens a nats.go connection to j, closed when the test ends.
func (j *jetgres) connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(j.natsURL, nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("connect to %s: %v", j.natsURL, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// publishWindow bounds the asynchronous publishes awaiting their PubAck: nats.go gives up
// on a publish that finds its own limit (4,000) reached for 200 ms, which a busy machine
// can make happen.
const publishWindow = 1000

// publishAll publishes n messages to subject, payload(i) for the i-th, and waits for every
// PubAck, failing the test on any publish error.
func publishAll(t testing.TB, ctx context.Context, js jetstream.JetStream, subject string, n int, payload func(i int) []byte) {
	t.Helper()
	futures := make([]jetstream.PubAckFuture, 0, publishWindow)
	settle := func() {
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			t.Fatalf("PubAcks for %s did not arrive: %v", subject, ctx.Err())
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				t.Fatalf("publish to %s: %v", subject, err)
			}
		}
		futures = futures[:0]
	}
	for i := range n {
		f, err := js.PublishAsync(subject, payload(i))
		if err != nil {
			t.Fatalf("publish %d to %s: %v", i, subject, err)
		}
		if futures = append(futures, f); len(futures) == publishWindow {
			settle()
		}
	}
	settle()
}

// metricValue reads one sample, named with its labels as /metrics prints them, from body.
func metricValue(t *testing.T, body, series string) float64 {
	t.Helper()
	for line := range strings.Lines(body) {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("/metrics: %s: %v", series, err)
			}
			return v
		}
	}
	t.Fatalf("/metrics has no %s", series)
	return 0
}

// wantAll fails the test unless out contains every one of want.
func wantAll(t *testing.T, what, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("%s: no %q in:\n%s", what, w, out)
		}
	}
}

// wantMatch fails the test unless out matches the regular expression re.
func wantMatch(t *testing.T, what, out, re string) {
	t.Helper()
	if !regexp.MustCompile(re).MatchString(out) {
		t.Errorf("%s: no match for %s in:\n%s", what, re, out)
	}
}

// soak reports whether the long variants run (JETGRES_SOAK=1).
func soak() bool { return os.Getenv("JETGRES_SOAK") == "1" }
