package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// recvTimeout bounds the wait for one push delivery or watcher update.
const recvTimeout = 10 * time.Second

// TestPushNatsGoSubscribe drives nats.go's push subscriptions (JetStreamContext.Subscribe,
// SubscribeSync, ChanSubscribe and Subscribe with nats.OrderedConsumer()): each gets every
// message in order, the acking ones move the ack floor to the end, and unsubscribing
// deletes the consumer each one created.
func TestPushNatsGoSubscribe(t *testing.T) {
	t.Parallel()
	const total = 50
	onBoth(t, func(t *testing.T, s natsServer) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		nc := connectURL(t, s.url)
		js, err := nc.JetStream()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.AddStream(&nats.StreamConfig{Name: "SUBS", Subjects: []string{"subs.>"}}); err != nil {
			t.Fatal(err)
		}
		for i := range total {
			if _, err := js.Publish("subs.x", []byte(strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
		}

		// inOrder checks that m is the k-th message, with the pending count that goes with it.
		inOrder := func(how string, k int, m *nats.Msg) {
			t.Helper()
			md, err := m.Metadata()
			if err != nil {
				t.Fatalf("%s: message %d: %v", how, k, err)
			}
			if string(m.Data) != strconv.Itoa(k) || md.Sequence.Stream != uint64(k+1) || md.NumPending != uint64(total-k-1) {
				t.Fatalf("%s: message %d is %q, stream seq %d, pending %d", how, k, m.Data, md.Sequence.Stream, md.NumPending)
			}
		}
		receive := func(how string, next func() (*nats.Msg, error)) {
			t.Helper()
			for k := range total {
				m, err := next()
				if err != nil {
					t.Fatalf("%s: message %d: %v", how, k, err)
				}
				inOrder(how, k, m)
				if how != "ordered" {
					if err := m.AckSync(); err != nil {
						t.Fatalf("%s: ack %d: %v", how, k, err)
					}
				}
			}
		}
		ackFloorAtEnd := func(how string, sub *nats.Subscription) {
			t.Helper()
			info, err := sub.ConsumerInfo()
			if err != nil {
				t.Fatalf("%s: consumer info: %v", how, err)
			}
			if info.AckFloor.Stream != total || info.NumAckPending != 0 || info.NumPending != 0 || info.Config.DeliverSubject == "" {
				t.Errorf("%s: consumer at the end: ack floor %d, ack pending %d, pending %d, deliver subject %q",
					how, info.AckFloor.Stream, info.NumAckPending, info.NumPending, info.Config.DeliverSubject)
			}
		}

		async := make(chan *nats.Msg, total)
		sub, err := js.Subscribe("subs.>", func(m *nats.Msg) { async <- m }, nats.ManualAck())
		if err != nil {
			t.Fatal(err)
		}
		receive("Subscribe", func() (*nats.Msg, error) { return recv(ctx, async) })
		ackFloorAtEnd("Subscribe", sub)
		unsubscribe(t, sub)

		sub, err = js.SubscribeSync("subs.>")
		if err != nil {
			t.Fatal(err)
		}
		receive("SubscribeSync", func() (*nats.Msg, error) { return sub.NextMsg(recvTimeout) })
		ackFloorAtEnd("SubscribeSync", sub)
		unsubscribe(t, sub)

		ch := make(chan *nats.Msg, total)
		sub, err = js.ChanSubscribe("subs.>", ch)
		if err != nil {
			t.Fatal(err)
		}
		receive("ChanSubscribe", func() (*nats.Msg, error) { return recv(ctx, ch) })
		ackFloorAtEnd("ChanSubscribe", sub)
		unsubscribe(t, sub)

		ordered := make(chan *nats.Msg, total)
		sub, err = js.Subscribe("subs.>", func(m *nats.Msg) { ordered <- m }, nats.OrderedConsumer())
		if err != nil {
			t.Fatal(err)
		}
		receive("ordered", func() (*nats.Msg, error) { return recv(ctx, ordered) })
		unsubscribe(t, sub)

		testwait.For(t, recvTimeout, func() error {
			var left []string
			for name := range js.ConsumerNames("SUBS") {
				left = append(left, name)
			}
			if len(left) > 0 {
				return fmt.Errorf("consumers left after every subscription ended: %v", left)
			}
			return nil
		})
	})
}

// recv takes one message from ch, or fails after recvTimeout.
func recv(ctx context.Context, ch <-chan *nats.Msg) (*nats.Msg, error) {
	select {
	case m := <-ch:
		return m, nil
	case <-time.After(recvTimeout):
		return nil, errors.New("no message within " + recvTimeout.String())
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func unsubscribe(t *testing.T, sub *nats.Subscription) {
	t.Helper()
	if err := sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
}

// TestPushNatsGoKeyValue drives the jetstream package's key-value and object store reads,
// which are ordered push consumers: a watcher sees the current values, then the nil marker
// that says they are done, then live updates; Keys, ListKeys and History; ObjectStore Get,
// List and Watch.
func TestPushNatsGoKeyValue(t *testing.T) {
	t.Parallel()
	onBoth(t, func(t *testing.T, s natsServer) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		nc := connectURL(t, s.url)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "WATCH", History: 5})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range [][2]string{{"a", "a1"}, {"b", "b1"}, {"a", "a2"}, {"c", "c1"}} {
			if _, err := kv.PutString(ctx, p[0], p[1]); err != nil {
				t.Fatal(err)
			}
		}
		if err := kv.Delete(ctx, "c"); err != nil {
			t.Fatal(err)
		}

		type entry struct {
			key, value string
			rev, delta uint64
			op         jetstream.KeyValueOp
		}
		next := func(w jetstream.KeyWatcher) *entry {
			t.Helper()
			select {
			case e := <-w.Updates():
				if e == nil {
					return nil
				}
				return &entry{e.Key(), string(e.Value()), e.Revision(), e.Delta(), e.Operation()}
			case <-time.After(recvTimeout):
				t.Fatal("no watcher update within " + recvTimeout.String())
			}
			return nil
		}
		expect := func(what string, w jetstream.KeyWatcher, want ...*entry) {
			t.Helper()
			for k, we := range want {
				got := next(w)
				if (got == nil) != (we == nil) || (got != nil && *got != *we) {
					t.Fatalf("%s: update %d is %+v, want %+v", what, k+1, got, we)
				}
			}
		}

		w, err := kv.WatchAll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		expect("WatchAll", w,
			&entry{"b", "b1", 2, 2, jetstream.KeyValuePut},
			&entry{"a", "a2", 3, 1, jetstream.KeyValuePut},
			&entry{"c", "", 5, 0, jetstream.KeyValueDelete},
			nil)
		if _, err := kv.PutString(ctx, "b", "b2"); err != nil {
			t.Fatal(err)
		}
		expect("WatchAll, live", w, &entry{"b", "b2", 6, 0, jetstream.KeyValuePut})
		if err := w.Stop(); err != nil {
			t.Fatal(err)
		}

		w, err = kv.Watch(ctx, "a", jetstream.IncludeHistory())
		if err != nil {
			t.Fatal(err)
		}
		expect("Watch a with history", w, &entry{"a", "a1", 1, 1, jetstream.KeyValuePut}, &entry{"a", "a2", 3, 0, jetstream.KeyValuePut}, nil)
		if err := w.Stop(); err != nil {
			t.Fatal(err)
		}
		// A watcher of a bucket with nothing to show gets the nil marker at once.
		empty, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "EMPTY"})
		if err != nil {
			t.Fatal(err)
		}
		w, err = empty.WatchAll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		expect("WatchAll of an empty bucket", w, nil)
		if err := w.Stop(); err != nil {
			t.Fatal(err)
		}

		keys, err := kv.Keys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, []string{"a", "b"}) {
			t.Errorf("Keys: %v, want [a b]", keys)
		}
		lister, err := kv.ListKeys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var listed []string
		for k := range lister.Keys() {
			listed = append(listed, k)
		}
		slices.Sort(listed)
		if !slices.Equal(listed, []string{"a", "b"}) {
			t.Errorf("ListKeys: %v, want [a b]", listed)
		}
		hist, err := kv.History(ctx, "b")
		if err != nil {
			t.Fatal(err)
		}
		var revs []uint64
		for _, e := range hist {
			revs = append(revs, e.Revision())
		}
		if !slices.Equal(revs, []uint64{2, 6}) {
			t.Errorf("History of b: revisions %v, want [2 6]", revs)
		}

		obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "OBJS"})
		if err != nil {
			t.Fatal(err)
		}
		blob := make([]byte, 300<<10)
		_, _ = rand.Read(blob)
		if _, err := obs.PutBytes(ctx, "blob", blob); err != nil {
			t.Fatal(err)
		}
		ow, err := obs.Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer ow.Stop()
		nextObject := func() string {
			t.Helper()
			select {
			case info := <-ow.Updates():
				if info == nil {
					return "<nil>"
				}
				return info.Name
			case <-time.After(recvTimeout):
				t.Fatal("no object watcher update within " + recvTimeout.String())
			}
			return ""
		}
		if a, b := nextObject(), nextObject(); a != "blob" || b != "<nil>" {
			t.Errorf("object Watch: %s, %s; want blob then the nil marker", a, b)
		}
		got, err := obs.GetBytes(ctx, "blob")
		if err != nil || !bytes.Equal(got, blob) {
			t.Errorf("object GetBytes: %d bytes (%v), want the %d put", len(got), err, len(blob))
		}
		if _, err := obs.PutString(ctx, "note", "hello"); err != nil {
			t.Fatal(err)
		}
		if n := nextObject(); n != "note" {
			t.Errorf("object Watch, live: %s, want note", n)
		}
		list, err := obs.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, info := range list {
			names = append(names, info.Name)
		}
		slices.Sort(names)
		if !slices.Equal(names, []string{"blob", "note"}) {
			t.Errorf("object List: %v, want [blob note]", names)
		}
	})
}

// TestPushDeliverGroup: three queue subscribers of one deliver group receive disjoint sets
// of messages that together cover the stream.
func TestPushDeliverGroup(t *testing.T) {
	t.Parallel()
	const total = 300
	onBoth(t, func(t *testing.T, s natsServer) {
		nc := connectURL(t, s.url)
		js, err := nc.JetStream()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.AddStream(&nats.StreamConfig{Name: "GROUP", Subjects: []string{"group.>"}}); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		by := map[int][]int{} // member → payload ids
		seen := map[int]int{} // payload id → deliveries
		for member := range 3 {
			mnc := connectURL(t, s.url)
			mjs, err := mnc.JetStream()
			if err != nil {
				t.Fatal(err)
			}
			sub, err := mjs.QueueSubscribe("group.>", "workers", func(m *nats.Msg) {
				id, _ := strconv.Atoi(string(m.Data))
				mu.Lock()
				by[member] = append(by[member], id)
				seen[id]++
				mu.Unlock()
				_ = m.Ack()
			}, nats.Durable("WORKERS"), nats.ManualAck())
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
		}
		for i := range total {
			if _, err := js.Publish("group.x", []byte(strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
		}
		testwait.For(t, 30*time.Second, func() error {
			mu.Lock()
			defer mu.Unlock()
			if len(seen) < total {
				return fmt.Errorf("%d of %d messages delivered", len(seen), total)
			}
			return nil
		})
		mu.Lock()
		defer mu.Unlock()
		for id, n := range seen {
			if n != 1 {
				t.Errorf("message %d delivered %d times", id, n)
			}
		}
		for member := range 3 {
			if len(by[member]) == 0 {
				t.Errorf("member %d received nothing: %d, %d, %d", member, len(by[0]), len(by[1]), len(by[2]))
			}
		}
		t.Logf("%s: the three members received %d, %d and %d messages", s.name, len(by[0]), len(by[1]), len(by[2]))
	})
}
