package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/syncbuf"
	"github.com/jetgres/jetgres/internal/testwait"
)

// natsAt runs the nats CLI against s and returns its combined output, failing the test
// unless it exits 0 within cliTimeout.
func natsAt(t *testing.T, s natsServer, args ...string) string {
	t.Helper()
	natsCLI(t)
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	start := time.Now()
	out, err := natsCmdAt(t, ctx, s.url, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: nats %s: %v after %v\n%s", s.name, strings.Join(args, " "), err, time.Since(start).Round(time.Millisecond), out)
	}
	return string(out)
}

// cliProc is a nats CLI command that runs until the test stops it: a watch, a subscription.
type cliProc struct {
	args []string
	out  *syncbuf.Buffer
	stop context.CancelFunc
	done chan struct{}
}

// startCLI starts the nats CLI against s in the background; it is killed when the test ends.
func startCLI(t *testing.T, s natsServer, args ...string) *cliProc {
	t.Helper()
	natsCLI(t)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := natsCmdAt(t, ctx, s.url, args...)
	p := &cliProc{args: args, out: &syncbuf.Buffer{}, stop: cancel, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("nats %s: %v", strings.Join(args, " "), err)
	}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop()
		<-p.done
	})
	return p
}

// waitFor waits until the command has printed every one of want.
func (p *cliProc) waitFor(t *testing.T, within time.Duration, want ...string) {
	t.Helper()
	testwait.For(t, within, func() error {
		out := p.out.String()
		for _, w := range want {
			if !strings.Contains(out, w) {
				select {
				case <-p.done:
					t.Fatalf("nats %s exited without printing %q:\n%s", strings.Join(p.args, " "), w, out)
				default:
				}
				return fmt.Errorf("nats %s has not printed %q yet:\n%s", strings.Join(p.args, " "), w, out)
			}
		}
		return nil
	})
}

// TestPushNatsCLIKeyValue: `nats kv watch` prints the current values and then a change made
// while it runs, `kv history` lists every revision of a key, `kv ls BUCKET` the live keys,
// and `kv revert` and `kv compact` work.
func TestPushNatsCLIKeyValue(t *testing.T) {
	t.Parallel()
	onBoth(t, func(t *testing.T, s natsServer) {
		natsAt(t, s, "kv", "add", "CFG", "--history", "10")
		for _, v := range []string{"red", "blue", "green"} {
			natsAt(t, s, "kv", "put", "CFG", "color", v)
		}
		natsAt(t, s, "kv", "put", "CFG", "size", "L")
		natsAt(t, s, "kv", "put", "CFG", "shape", "round")
		natsAt(t, s, "kv", "del", "CFG", "size", "-f")

		out := natsAt(t, s, "kv", "history", "CFG", "color")
		for rev, v := range []string{"red", "blue", "green"} {
			wantMatch(t, s.name+": kv history", out, fmt.Sprintf(`\bcolor\W+%d\W+PUT\W.*\W%s\W`, rev+1, v))
		}

		out = natsAt(t, s, "kv", "ls", "CFG")
		if keys := strings.Fields(out); len(keys) != 2 || !strings.Contains(out, "color") || !strings.Contains(out, "shape") {
			t.Errorf("%s: kv ls CFG printed %q, want the live keys color and shape", s.name, out)
		}

		w := startCLI(t, s, "kv", "watch", "CFG")
		w.waitFor(t, cliTimeout, "color: green", "shape: round", "DELETE CFG > size")
		natsAt(t, s, "kv", "put", "CFG", "color", "purple")
		w.waitFor(t, cliTimeout, "color: purple")

		// revert reads the old revision back and puts it; compact walks the bucket with an
		// ordered consumer to find the delete markers (recent ones are kept).
		natsAt(t, s, "kv", "revert", "CFG", "color", "1", "--force")
		if out := natsAt(t, s, "kv", "get", "CFG", "color", "--raw"); strings.TrimSpace(out) != "red" {
			t.Errorf("%s: kv get after revert printed %q, want red", s.name, out)
		}
		w.waitFor(t, cliTimeout, "color: red")
		natsAt(t, s, "kv", "compact", "CFG", "-f")
		if out := natsAt(t, s, "kv", "ls", "CFG"); len(strings.Fields(out)) != 2 {
			t.Errorf("%s: kv ls CFG after compact printed %q, want color and shape", s.name, out)
		}
	})
}

// TestPushNatsCLIObjectStore: `nats object get` returns the very bytes put, for objects of
// 1 B, 128 KiB and 20 MiB (the CLI checks the stored SHA-256 digest, and so does the test),
// `object ls` lists them, and `object watch` prints an object put while it runs.
func TestPushNatsCLIObjectStore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sizes := map[string]int{"one-byte": 1, "chunk": 128 << 10, "large": 20 << 20}
	for name, size := range sizes {
		b := make([]byte, size)
		_, _ = rand.Read(b)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	onBoth(t, func(t *testing.T, s natsServer) {
		natsAt(t, s, "object", "add", "OBJ")
		w := startCLI(t, s, "object", "watch", "OBJ")
		for name := range sizes {
			// The CLI's 5 s default bounds each chunk's ack, and the last of 160 chunks sent
			// at once waits for every one before it to be stored: on a loaded machine that is
			// more than 5 s for either server.
			natsAt(t, s, "object", "put", "OBJ", filepath.Join(dir, name), "--name", name, "-f", "--timeout", cliTimeout.String())
		}
		w.waitFor(t, cliTimeout, "PUT OBJ > large", "PUT OBJ > chunk", "PUT OBJ > one-byte")

		out := natsAt(t, s, "object", "ls", "OBJ")
		wantAll(t, s.name+": object ls", out, "one-byte", "chunk", "large")

		got := t.TempDir()
		for name := range sizes {
			natsAt(t, s, "object", "get", "OBJ", name, "--output", filepath.Join(got, name), "-f")
			want, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			have, err := os.ReadFile(filepath.Join(got, name))
			if err != nil {
				t.Fatal(err)
			}
			if sha256.Sum256(have) != sha256.Sum256(want) || !bytes.Equal(have, want) {
				t.Errorf("%s: object get %s: %d bytes with SHA-256 %x, want %d bytes with %x",
					s.name, name, len(have), sha256.Sum256(have), len(want), sha256.Sum256(want))
			}
		}
	})
}

// TestPushNatsCLIConsumer: `nats consumer add --target X --deliver-group G` makes a push
// consumer, and `nats consumer sub` receives and acks through it (the CLI subscribes to the
// deliver subject in the group).
func TestPushNatsCLIConsumer(t *testing.T) {
	t.Parallel()
	onBoth(t, func(t *testing.T, s natsServer) {
		natsAt(t, s, "stream", "add", "ORDERS", "--subjects", "orders.>", "--defaults")
		for i := 1; i <= 10; i++ {
			natsAt(t, s, "req", "orders.new", fmt.Sprintf("hi %d", i))
		}
		out := natsAt(t, s, "consumer", "add", "ORDERS", "P", "--target", "deliver.p", "--deliver-group", "workers",
			"--ack", "explicit", "--defaults")
		wantAll(t, s.name+": consumer add", out, "Delivery Subject: deliver.p", "Deliver Queue Group: workers", "Ack Policy: Explicit")

		sub := startCLI(t, s, "consumer", "sub", "ORDERS", "P")
		var want []string
		for i := 1; i <= 10; i++ {
			want = append(want, fmt.Sprintf("cons seq: %d / str seq: %d / pending: %d\n", i, i, 10-i), fmt.Sprintf("hi %d\n", i))
		}
		sub.waitFor(t, cliTimeout, want...)
		testwait.For(t, cliTimeout, func() error {
			out := natsAt(t, s, "consumer", "info", "ORDERS", "P")
			for _, re := range []string{
				`Acknowledgment Floor: Consumer sequence: 10 Stream sequence: 10\b`,
				`Outstanding Acks: 0 out of maximum 1,000\b`,
				`Active Interest: Active using Queue Group workers`,
			} {
				if !regexp.MustCompile(re).MatchString(out) {
					return fmt.Errorf("%s: consumer info has no match for %s:\n%s", s.name, re, out)
				}
			}
			return nil
		})
		natsAt(t, s, "req", "orders.new", "live")
		sub.waitFor(t, cliTimeout, "cons seq: 11 / str seq: 11 / pending: 0\n", "live\n")
	})
}
