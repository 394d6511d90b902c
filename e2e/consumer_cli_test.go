package e2e

// Streams, pull consumers and key-value buckets driven by the unmodified nats CLI, its bench
// command included.

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/internal/testwait"
)

// TestNatsCLIStreamsAndConsumers drives streams and a pull consumer with the unmodified
// nats CLI, as the README's quick start does.
func TestNatsCLIStreamsAndConsumers(t *testing.T) {
	t.Parallel()
	j := startWithDatabase(t, testDatabase(t))

	out := j.nats(t, "stream", "add", "ORDERS", "--subjects", "orders.>", "--defaults")
	wantAll(t, "stream add", out, "Stream ORDERS was created", "orders.>")
	j.nats(t, "pub", "orders.new", "hi {{Count}}", "--count", "10")

	// A publish without a reply is stored without an answer, so the CLI exits before the
	// last of them commit: wait until all ten are there.
	testwait.For(t, 10*time.Second, func() error {
		out = j.nats(t, "stream", "info", "ORDERS")
		if !regexp.MustCompile(`Messages: 10\b`).MatchString(out) {
			return fmt.Errorf("stream info shows fewer than 10 messages:\n%s", out)
		}
		return nil
	})
	wantMatch(t, "stream info", out, `First Sequence: 1\b`)
	wantMatch(t, "stream info", out, `Last Sequence: 10\b`)
	out = j.nats(t, "stream", "ls")
	wantAll(t, "stream ls", out, "ORDERS")

	out = j.nats(t, "consumer", "add", "ORDERS", "C1", "--pull", "--defaults")
	wantAll(t, "consumer add", out, "C1", "Pull Mode: true")

	out = j.nats(t, "consumer", "next", "ORDERS", "C1", "--count", "5")
	for i := 1; i <= 5; i++ {
		wantMatch(t, "consumer next", out, fmt.Sprintf(`subj: orders\.new / tries: 1 / cons seq: %d / str seq: %d / pending: %d\b`, i, i, 10-i))
		wantAll(t, "consumer next", out, fmt.Sprintf("hi %d\n", i))
	}
	if n := strings.Count(out, "Acknowledged message"); n != 5 {
		t.Errorf("consumer next acknowledged %d messages, want 5:\n%s", n, out)
	}

	// The CLI's acks are fire-and-forget: the floor moves a moment after it exits.
	testwait.For(t, 10*time.Second, func() error {
		out = j.nats(t, "consumer", "info", "ORDERS", "C1")
		for _, re := range []string{
			`Last Delivered Message: Consumer sequence: 5 Stream sequence: 5\b`,
			`Acknowledgment Floor: Consumer sequence: 5 Stream sequence: 5\b`,
			`Outstanding Acks: 0 out of maximum 1,000\b`,
			`Unprocessed Messages: 5\b`,
			`Redelivered Messages: 0\b`,
		} {
			if !regexp.MustCompile(re).MatchString(out) {
				return fmt.Errorf("consumer info has no match for %s:\n%s", re, out)
			}
		}
		return nil
	})
	out = j.nats(t, "consumer", "ls", "ORDERS")
	wantAll(t, "consumer ls", out, "C1")
	j.nats(t, "consumer", "rm", "ORDERS", "C1", "-f")
	out = j.nats(t, "consumer", "ls", "ORDERS")
	if strings.Contains(out, "C1") {
		t.Errorf("consumer ls after rm still lists C1:\n%s", out)
	}

	out = j.nats(t, "req", "orders.new", "hi")
	wantMatch(t, "req", out, `\{"stream":"ORDERS",\s*"seq":11\}`)
	out = j.nats(t, "stream", "get", "ORDERS", "3")
	wantAll(t, "stream get", out, "orders.new", "hi 3")
	out = j.nats(t, "stream", "purge", "ORDERS", "-f")
	wantMatch(t, "stream purge", out, `Messages: 0\b`)
	wantMatch(t, "stream purge", out, `First Sequence: 12\b`)
	j.nats(t, "stream", "rm", "ORDERS", "-f")
	out = j.nats(t, "stream", "ls")
	if strings.Contains(out, "ORDERS") {
		t.Errorf("stream ls after rm still lists ORDERS:\n%s", out)
	}
}

// TestNatsBenchFetch runs `nats bench js pub` and then `nats bench js fetch` with every ack
// mode. Each fetch run creates the durable consumer nats-bench anew (the CLI creates it with
// the ack mode asked for, and an ack policy cannot be updated), so it is removed in between.
func TestNatsBenchFetch(t *testing.T) {
	t.Parallel()
	msgs := 200_000
	if raceEnabled() {
		// The race detector slows jetgres (built with it too) several times over.
		msgs = 50_000
	}
	j := startWithDatabase(t, testDatabase(t))
	count := strconv.Itoa(msgs)
	start := time.Now()
	out := j.natsWithin(t, benchTimeout, "bench", "js", "pub", "async", "bench.x", "--create", "--msgs", count, "--size", "128", "--no-progress")
	wantAll(t, "bench js pub", out, "msgs/sec")
	t.Logf("bench js pub async: %d messages in %v: %s", msgs, time.Since(start).Round(time.Millisecond), benchSummary(out))
	out = j.nats(t, "stream", "info", "benchstream", "--json")
	var si server.StreamInfo
	if err := json.Unmarshal([]byte(out), &si); err != nil || si.State.Msgs != uint64(msgs) {
		t.Fatalf("benchstream after the bench publish: %d messages (%v)\n%s", si.State.Msgs, err, out)
	}

	runs := []struct {
		name string
		args []string
		msgs int
	}{
		{"explicit", []string{"--acks", "explicit"}, msgs},
		{"all", []string{"--acks", "all"}, msgs},
		{"none", []string{"--acks", "none"}, msgs},
		// A double ack waits for its cursor write to commit, one message at a time: a few
		// thousand a second, so fewer of them.
		{"doubleack", []string{"--acks", "explicit", "--doubleack"}, msgs / 10},
	}
	for _, r := range runs {
		start := time.Now()
		args := append([]string{"bench", "js", "fetch", "--msgs", strconv.Itoa(r.msgs), "--batch", "500", "--no-progress"}, r.args...)
		out := j.natsWithin(t, benchTimeout, args...)
		wantAll(t, "bench js fetch "+r.name, out, "msgs/sec")
		t.Logf("bench js fetch %s: %d messages in %v: %s", r.name, r.msgs, time.Since(start).Round(time.Millisecond), benchSummary(out))

		// Plain acks are fire-and-forget: the last ones may land after the CLI exits.
		testwait.For(t, time.Minute, func() error {
			var ci server.ConsumerInfo
			if err := json.Unmarshal([]byte(j.nats(t, "consumer", "info", "benchstream", "nats-bench", "--json")), &ci); err != nil {
				return err
			}
			if ci.Delivered.Stream != uint64(r.msgs) {
				return fmt.Errorf("%s: delivered through %d, want %d", r.name, ci.Delivered.Stream, r.msgs)
			}
			if r.name != "none" && ci.AckFloor.Stream != uint64(r.msgs) {
				return fmt.Errorf("%s: ack floor %d, want %d", r.name, ci.AckFloor.Stream, r.msgs)
			}
			return nil
		})
		j.nats(t, "consumer", "rm", "benchstream", "nats-bench", "-f")
	}
}

// benchSummary is the line of a nats bench report with the rate.
func benchSummary(out string) string {
	for line := range strings.Lines(out) {
		if strings.Contains(line, "msgs/sec") {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

// A key-value bucket through the unmodified CLI: buckets are streams with allow_direct, and
// the CLI reads keys with direct gets. (Watching, history and key listing are ordered push
// consumers: TestPushNatsCLIKeyValue.)
func TestNatsCLIKeyValue(t *testing.T) {
	t.Parallel()
	j := startWithDatabase(t, testDatabase(t))
	wantAll(t, "kv add", j.nats(t, "kv", "add", "CFG"), "KV_CFG")
	j.nats(t, "kv", "put", "CFG", "color", "red")
	j.nats(t, "kv", "put", "CFG", "color", "blue")
	wantAll(t, "kv get", j.nats(t, "kv", "get", "CFG", "color"), "blue", "revision: 2")
	if out := j.nats(t, "kv", "get", "CFG", "color", "--raw"); strings.TrimSpace(out) != "blue" {
		t.Errorf("kv get --raw printed %q, want blue", out)
	}
	j.nats(t, "kv", "create", "CFG", "size", "L")
	wantAll(t, "kv update", j.nats(t, "kv", "update", "CFG", "size", "XL", "3"), "XL")
	j.nats(t, "kv", "del", "CFG", "color", "-f")
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	out, err := j.natsCmd(t, ctx, "kv", "get", "CFG", "color").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "key not found") {
		t.Errorf("kv get of a deleted key: %v\n%s", err, out)
	}
}
