package e2e

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// freeAddr returns a loopback address with a port free right now, for a jetgres that must
// come back on the same one after a restart, where its clients reconnect.
func freeAddr(t *testing.T) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(freePorts(t, 1)[0]))
}

// TestPushDurableSurvivesSIGKILL kills jetgres while a durable push consumer (nats.go
// Subscribe with nats.Durable) is busy, starts it again on the same database, and binds a
// new subscription to the consumer: delivery resumes right after the persisted ack floor,
// and every message is acked at least once.
func TestPushDurableSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	const total = 5000
	dsn := testDatabase(t)
	// The same replica name takes the consumer's lease back at once.
	args := []string{"--replica-name", "e2e-push-sigkill"}
	j := startWithDatabase(t, dsn, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	_, pubJS := j.connect(t)
	if _, err := pubJS.CreateStream(ctx, jetstream.StreamConfig{Name: "PKILL", Subjects: []string{"pkill.>"}}); err != nil {
		t.Fatal(err)
	}
	publishAll(t, ctx, pubJS, "pkill.id", total, func(i int) []byte { return []byte(strconv.Itoa(i)) })

	var mu sync.Mutex
	acked := make(map[int]int) // payload id → acks sent
	handler := func(m *nats.Msg) {
		id, err := strconv.Atoi(string(m.Data))
		if err != nil {
			t.Errorf("payload %q", m.Data)
			return
		}
		if m.Ack() != nil {
			return
		}
		mu.Lock()
		acked[id]++
		mu.Unlock()
		// Stands for the work a client does per message: without it the stream is
		// consumed too fast to be killed midway.
		time.Sleep(time.Millisecond)
	}
	subOpts := []nats.SubOpt{nats.Durable("D"), nats.ManualAck(), nats.AckExplicit(), nats.MaxAckPending(100)}
	nc := connectURL(t, j.natsURL)
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Subscribe("pkill.>", handler, subOpts...); err != nil {
		t.Fatal(err)
	}
	probe := openProbe(t, dsn, 1)
	floorNow := func() uint64 {
		f, err := storedFloor(ctx, probe, "PKILL", "D")
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	testwait.For(t, time.Minute, func() error {
		if f := floorNow(); f < total/3 {
			return fmt.Errorf("stored ack floor %d", f)
		}
		return nil
	})
	j.kill(t)
	nc.Close()
	mu.Lock()
	before := len(acked)
	mu.Unlock()
	if before == total {
		t.Fatal("every message was acked before the kill")
	}
	floor := floorNow()

	j2 := startWithDatabase(t, dsn, args...)
	nc2 := connectURL(t, j2.natsURL)
	js2, err := nc2.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	for id := range int(floor) {
		if acked[id] == 0 {
			t.Fatalf("sequence %d is below the persisted floor %d but was never acked", id+1, floor)
		}
	}
	mu.Unlock()
	t.Logf("killed with %d of %d messages acked; persisted ack floor %d", before, total, floor)

	first := make(chan uint64, 1)
	sub, err := js2.Subscribe("pkill.>", func(m *nats.Msg) {
		if md, err := m.Metadata(); err == nil {
			select {
			case first <- md.Sequence.Stream:
			default:
			}
		}
		handler(m)
	}, subOpts...)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	select {
	case seq := <-first:
		if seq != floor+1 {
			t.Errorf("the first delivery after the restart is sequence %d, want %d (right after the persisted floor)", seq, floor+1)
		}
	case <-time.After(recvTimeout):
		t.Fatal("nothing delivered after the restart")
	}
	testwait.For(t, time.Minute, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(acked) < total {
			return fmt.Errorf("%d of %d messages acked", len(acked), total)
		}
		return nil
	})
	mu.Lock()
	twice := 0
	for _, n := range acked {
		if n > 1 {
			twice++
		}
	}
	mu.Unlock()
	t.Logf("all %d messages acked; %d of them more than once, acked before the kill but above the persisted floor", total, twice)
	testwait.For(t, recvTimeout, func() error {
		info, err := sub.ConsumerInfo()
		if err != nil {
			return err
		}
		if info.AckFloor.Stream != total || info.NumPending != 0 || info.NumAckPending != 0 {
			return fmt.Errorf("consumer at the end: floor %d, pending %d, ack pending %d", info.AckFloor.Stream, info.NumPending, info.NumAckPending)
		}
		return nil
	})
}

// TestPushOrderedAcrossRestart keeps an ordered consumer (nats.go Subscribe with
// nats.OrderedConsumer()) subscribed while jetgres restarts on the same address: the client
// reconnects and gets every message exactly once, in order, whether its consumer came back
// with jetgres (consumers live in PostgreSQL) or the client re-created it after the last
// message it saw, as it does on a gap or missing heartbeats.
func TestPushOrderedAcrossRestart(t *testing.T) {
	t.Parallel()
	const half = 1000
	dsn := testDatabase(t)
	args := []string{"--replica-name", "e2e-push-ordered", "--listen", freeAddr(t)}
	j := startWithDatabase(t, dsn, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	_, pubJS := j.connect(t)
	if _, err := pubJS.CreateStream(ctx, jetstream.StreamConfig{Name: "PORD", Subjects: []string{"pord.>"}}); err != nil {
		t.Fatal(err)
	}
	publishAll(t, ctx, pubJS, "pord.x", half, func(i int) []byte { return []byte(strconv.Itoa(i)) })

	nc := connectURL(t, j.natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	sub, err := js.Subscribe("pord.>", func(m *nats.Msg) {
		mu.Lock()
		got = append(got, string(m.Data))
		mu.Unlock()
	}, nats.OrderedConsumer(), nats.IdleHeartbeat(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	received := func(n int) func() error {
		return func() error {
			mu.Lock()
			defer mu.Unlock()
			if len(got) < n {
				return fmt.Errorf("%d of %d messages received", len(got), n)
			}
			return nil
		}
	}
	testwait.For(t, time.Minute, received(half))
	before, err := sub.ConsumerInfo()
	if err != nil {
		t.Fatal(err)
	}

	j.stop(t)
	j2 := startWithDatabase(t, dsn, args...)
	_, pubJS2 := j2.connect(t)
	publishAll(t, ctx, pubJS2, "pord.x", half, func(i int) []byte { return []byte(strconv.Itoa(half + i)) })
	testwait.For(t, time.Minute, received(2*half))
	if after, err := sub.ConsumerInfo(); err == nil {
		t.Logf("ordered consumer %s before the restart, %s after", before.Name, after.Name)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, d := range got {
		if d != strconv.Itoa(i) {
			t.Fatalf("message %d is %q: the ordered consumer lost or repeated a message across the restart", i, d)
		}
	}
	if len(got) != 2*half {
		t.Errorf("%d messages received, want %d", len(got), 2*half)
	}
}
