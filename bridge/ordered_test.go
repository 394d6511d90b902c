package bridge

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/pg"
)

// TestPushKeyValueWatchBehindTail watches a bucket whose values lie mostly behind the tail
// cache, with more keys than one read takes, several revisions of some and deletes of
// others: the watcher gets the last revision of every key in the order they were stored,
// then the nil entry, and the consumer reads its start list from PostgreSQL in batches,
// not a read per key.
func TestPushKeyValueWatchBehindTail(t *testing.T) {
	t.Parallel()
	const keys = 2500
	val := make([]byte, 100)
	msgSize := int((&pg.Message{Subject: "$KV.BIG.k0000", Data: val}).Size())
	tb := setup(t, setupOpts{config: func(c *Config) { c.TailTotalBytes = 300 * msgSize }})
	ctx := testContext(t)
	kv, err := tb.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "BIG", History: 3})
	if err != nil {
		t.Fatal(err)
	}
	// Every key once, then every seventh again; every eleventh is deleted at the end.
	var order []string
	last := map[string]jetstream.KeyValueOp{}
	put := func(i int) {
		k := fmt.Sprintf("k%04d", i)
		if _, err := tb.js.PublishAsync("$KV.BIG."+k, val); err != nil {
			t.Fatal(err)
		}
		order, last[k] = append(order, k), jetstream.KeyValuePut
	}
	for i := range keys {
		put(i)
	}
	for i := 0; i < keys; i += 7 {
		put(i)
	}
	<-tb.js.PublishAsyncComplete()
	for i := 0; i < keys; i += 11 {
		k := fmt.Sprintf("k%04d", i)
		if err := kv.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
		order, last[k] = append(order, k), jetstream.KeyValueDelete
	}
	var want []string
	for i, k := range order {
		if !slices.Contains(order[i+1:], k) {
			want = append(want, k+"/"+last[k].String())
		}
	}
	if start := tb.bridge.streams.Lookup("KV_BIG").Tail().Start(); start <= 2*ReadAheadMsgs {
		t.Fatalf("the tail starts at %d: the test wants most values well behind it", start)
	}

	misses := counterValue(t, tb.reg, "jetgres_tail_cache_misses_total")
	w, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	var got []string
	timeout := time.After(30 * time.Second)
	for done := false; !done; {
		select {
		case e := <-w.Updates():
			if e == nil {
				done = true
				break
			}
			got = append(got, e.Key()+"/"+e.Operation().String())
		case <-timeout:
			t.Fatalf("%d initial values of %d, and no end of them", len(got), len(want))
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("%d initial values, want %d; first difference at %d", len(got), len(want), firstDiff(got, want))
	}
	// A read per key would miss the cache for each of the 2,000 or so behind it.
	if n := counterValue(t, tb.reg, "jetgres_tail_cache_misses_total") - misses; n > 10 {
		t.Fatalf("%v reads behind the tail cache for %d keys", n, len(want))
	}
}

// TestPushOrderedBehindTail drains with an ordered consumer a backlog of which the tail
// cache holds only the newest messages, several reads' worth behind it: with several reads in
// flight, every message arrives once and in order, and no read is wasted on a span that a
// read before it did not reach.
func TestPushOrderedBehindTail(t *testing.T) {
	t.Parallel()
	const total = 6000
	data := make([]byte, 100)
	msgSize := int((&pg.Message{Subject: "ob.x", Data: data}).Size())
	tb := setup(t, setupOpts{config: func(c *Config) { c.TailTotalBytes = 300 * msgSize }})
	ctx := testContext(t)
	newStream(t, ctx, tb, "OB", "ob.>")
	publishBacklog(t, tb, "ob.x", data, total)
	start := tb.bridge.streams.Lookup("OB").Tail().Start()
	if start <= 4*ReadAheadMsgs {
		t.Fatalf("the tail starts at %d: the test wants several reads behind it", start)
	}
	reads := counterValue(t, tb.reg, "jetgres_consumer_db_reads_total")
	sub, err := legacyJS(t, tb.nc).SubscribeSync("ob.>", nats.OrderedConsumer(), nats.DeliverAll())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	wantAllInOrder(t, sub, total)
	// Each read takes at least seven eighths of what one read may: more reads than that
	// would be reads thrown away.
	n := counterValue(t, tb.reg, "jetgres_consumer_db_reads_total") - reads
	if most := float64((start-1)/(ReadAheadMsgs*7/8) + 2); n > most {
		t.Fatalf("%v reads of PostgreSQL for %d messages behind the tail, want at most %v", n, start-1, most)
	}
}

// firstDiff is the first index at which a and b differ.
func firstDiff(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
