package bridge

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// The ordered readers that applications start up on, each over a backlog larger than the
// stream's tail cache, so that most of it comes from PostgreSQL: js.Subscribe's ordered
// consumer, kv.WatchAll until its initial values are done, and an object get. Besides the
// processor time and allocations per message they report, per run, what the consumer's
// pace depends on: the flow-control requests it sent, the times it stopped for an answer,
// its idle heartbeats, and the consumers the client created, of which every one beyond the
// first is a re-creation after a gap or a missed heartbeat.

const (
	orderedBenchMsgs   = 200000
	orderedBenchKeys   = 100000
	orderedBenchObject = 64 << 20
)

// BenchmarkOrderedBacklog drains a backlog of orderedBenchMsgs messages of 128 B with
// js.Subscribe and OrderedConsumer.
func BenchmarkOrderedBacklog(b *testing.B) {
	tb := setup(b)
	if _, err := tb.js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "ORD", Subjects: []string{"ord.>"}}); err != nil {
		b.Fatal(err)
	}
	fillOrdered(b, tb)
	legacy, err := tb.nc.JetStream()
	if err != nil {
		b.Fatal(err)
	}
	o := newOrderedMeter(b, tb)
	for b.Loop() {
		done := make(chan struct{})
		var got int
		o.start()
		sub, err := legacy.Subscribe("ord.x", func(*nats.Msg) {
			if got++; got == orderedBenchMsgs {
				close(done)
			}
		}, nats.DeliverAll(), nats.OrderedConsumer())
		if err != nil {
			b.Fatal(err)
		}
		select {
		case <-done:
		case <-time.After(time.Minute):
			b.Fatalf("%d of %d messages within a minute", got, orderedBenchMsgs)
		}
		o.stop(orderedBenchMsgs)
		if err := sub.Unsubscribe(); err != nil {
			b.Fatal(err)
		}
	}
	o.report()
}

// BenchmarkOrderedConsume drains the same backlog with the jetstream package's ordered
// consumer, which pulls: Consume keeps batches of 500 requested.
func BenchmarkOrderedConsume(b *testing.B) {
	tb := setup(b)
	ctx := context.Background()
	s, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORD", Subjects: []string{"ord.>"}})
	if err != nil {
		b.Fatal(err)
	}
	fillOrdered(b, tb)
	o := newOrderedMeter(b, tb)
	for b.Loop() {
		done := make(chan struct{})
		var got atomic.Int64
		o.start()
		cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
		if err != nil {
			b.Fatal(err)
		}
		cc, err := cons.Consume(func(jetstream.Msg) {
			if got.Add(1) == orderedBenchMsgs {
				close(done)
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		select {
		case <-done:
		case <-time.After(time.Minute):
			b.Fatalf("%d of %d messages within a minute", got.Load(), orderedBenchMsgs)
		}
		o.stop(orderedBenchMsgs)
		cc.Stop()
	}
	o.report()
}

// fillOrdered publishes orderedBenchMsgs messages of 128 B to ord.x.
func fillOrdered(b *testing.B, tb *testBundle) {
	js, err := jetstream.New(tb.nc, jetstream.WithPublishAsyncMaxPending(1000))
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 128)
	for range orderedBenchMsgs {
		if _, err := js.PublishAsync("ord.x", data, jetstream.WithStallWait(time.Minute)); err != nil {
			b.Fatal(err)
		}
	}
	waitPublished(b, js)
}

// BenchmarkOrderedKVWatch reads the initial values of a bucket of orderedBenchKeys keys,
// each put once, with kv.WatchAll.
func BenchmarkOrderedKVWatch(b *testing.B) {
	tb := setup(b)
	ctx := context.Background()
	kv, err := tb.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "ORDKV"})
	if err != nil {
		b.Fatal(err)
	}
	js, err := jetstream.New(tb.nc, jetstream.WithPublishAsyncMaxPending(1000))
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 128)
	for i := range orderedBenchKeys {
		if _, err := js.PublishAsync(fmt.Sprintf("$KV.ORDKV.k%d", i), data, jetstream.WithStallWait(time.Minute)); err != nil {
			b.Fatal(err)
		}
	}
	waitPublished(b, js)
	o := newOrderedMeter(b, tb)
	for b.Loop() {
		o.start()
		w, err := kv.WatchAll(ctx)
		if err != nil {
			b.Fatal(err)
		}
		timeout := time.After(time.Minute)
		got := 0
	initial:
		for {
			select {
			case e := <-w.Updates():
				if e == nil {
					break initial
				}
				got++
			case <-timeout:
				b.Fatalf("%d of %d initial values within a minute", got, orderedBenchKeys)
			}
		}
		o.stop(orderedBenchKeys)
		if got != orderedBenchKeys {
			b.Fatalf("%d initial values, want %d", got, orderedBenchKeys)
		}
		if err := w.Stop(); err != nil {
			b.Fatal(err)
		}
	}
	o.report()
}

// BenchmarkOrderedObjectGet reads an object of orderedBenchObject bytes; a message is one
// of nats.go's chunks of 128 KiB.
func BenchmarkOrderedObjectGet(b *testing.B) {
	tb := setup(b)
	ctx := context.Background()
	obs, err := tb.js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "ORDOBJ"})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := obs.Put(ctx, jetstream.ObjectMeta{Name: "o"}, bytes.NewReader(make([]byte, orderedBenchObject))); err != nil {
		b.Fatal(err)
	}
	chunks := orderedBenchObject / (128 << 10)
	o := newOrderedMeter(b, tb)
	for b.Loop() {
		o.start()
		r, err := obs.Get(ctx, "o")
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, r)
		if err != nil || n != orderedBenchObject {
			b.Fatalf("read %d of %d bytes: %v", n, orderedBenchObject, err)
		}
		o.stop(chunks)
		if err := r.Close(); err != nil {
			b.Fatal(err)
		}
	}
	o.report()
}

func waitPublished(b *testing.B, js jetstream.JetStream) {
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(2 * time.Minute):
		b.Fatal("publishes not acknowledged within two minutes")
	}
}

// orderedMeter is an allocMeter with the wall time and the push counters of each run, and
// the consumers the client created meanwhile.
type orderedMeter struct {
	allocMeter
	b       *testing.B
	reg     *prometheus.Registry
	wall    time.Duration
	began   time.Time
	creates atomic.Int64
	runs    int
	before  map[string]float64
	counts  map[string]float64
	link    *leaf.Conn
	full    uint64 // publishes the link refused for want of room, before the run
	fulls   uint64
	// postmaster is the PostgreSQL server's pid, 0 when its processes cannot be read;
	// pgBefore its CPU time before the run and pgCPU the sum over the runs.
	postmaster int
	pgBefore   time.Duration
	pgCPU      time.Duration
}

// orderedCounters are the push consumer counters the meter reports per run.
var orderedCounters = map[string]string{
	"jetgres_push_flow_control_requests_total":      "fc-requests/op",
	"jetgres_push_flow_control_stalls_total":        "fc-stalls/op",
	"jetgres_push_heartbeats_total":                 "heartbeats/op",
	"jetgres_push_flow_control_stall_seconds_total": "fc-stall-s/op",
	"jetgres_consumer_read_wait_seconds_total":      "read-wait-s/op",
}

func newOrderedMeter(b *testing.B, tb *testBundle) *orderedMeter {
	o := &orderedMeter{b: b, reg: tb.reg, counts: map[string]float64{}, link: tb.link, postmaster: postmasterOf(b, tb)}
	// Every consumer creation passes the client's server on its way to the bridge.
	sub, err := tb.nc.Subscribe("$JS.API.CONSUMER.CREATE.>", func(*nats.Msg) { o.creates.Add(1) })
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := tb.nc.Flush(); err != nil {
		b.Fatal(err)
	}
	return o
}

func (o *orderedMeter) counters() map[string]float64 {
	mfs, err := o.reg.Gather()
	if err != nil {
		o.b.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if _, ok := orderedCounters[mf.GetName()]; ok {
			for _, m := range mf.GetMetric() {
				got[mf.GetName()] += m.GetCounter().GetValue()
			}
		}
	}
	return got
}

func (o *orderedMeter) start() {
	o.before = o.counters()
	o.full = o.link.Stats().SlowConsumer
	o.pgBefore = serverCPU(o.postmaster)
	o.allocMeter.start()
	o.began = time.Now()
}

func (o *orderedMeter) stop(msgs int) {
	o.wall += time.Since(o.began)
	o.pgCPU += serverCPU(o.postmaster) - o.pgBefore
	o.allocMeter.stop(msgs)
	o.runs++
	o.fulls += o.link.Stats().SlowConsumer - o.full
	for name, v := range o.counters() {
		o.counts[name] += v - o.before[name]
	}
}

func (o *orderedMeter) report() {
	o.allocMeter.report(o.b)
	o.b.ReportMetric(float64(o.msgs)/o.wall.Seconds(), "msgs/s")
	if o.postmaster != 0 {
		o.b.ReportMetric(float64(o.pgCPU.Nanoseconds())/float64(o.msgs), "pg-cpu-ns/msg")
		// Cores busy: what the process and PostgreSQL spent, over the time it took. Below
		// what the machine has, the readers waited rather than worked.
		o.b.ReportMetric((o.cpu+o.pgCPU).Seconds()/o.wall.Seconds(), "cores")
	}
	for name, unit := range orderedCounters {
		o.b.ReportMetric(o.counts[name]/float64(o.runs), unit)
	}
	o.b.ReportMetric(float64(o.fulls)/float64(o.runs), "link-full/op")
	// Each run creates one consumer; more are the client's re-creations.
	o.b.ReportMetric(float64(o.creates.Load())/float64(o.runs)-1, "recreates/op")
}

// postmasterOf finds the pid of the test's PostgreSQL server through its data directory,
// 0 when that cannot be read.
func postmasterOf(b *testing.B, tb *testBundle) int {
	ctx := context.Background()
	probe, err := pgtest.OpenProbe(ctx, tb.dbURL)
	if err != nil {
		b.Fatal(err)
	}
	defer probe.Close()
	dir, err := probe.Setting(ctx, "data_directory")
	if err != nil {
		b.Fatal(err)
	}
	pidFile, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(pidFile), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0
	}
	return pid
}

// serverCPU is the CPU time the PostgreSQL server's processes used so far: the
// postmaster's own and its reaped children's, and that of every child still running.
func serverCPU(postmaster int) time.Duration {
	if postmaster == 0 {
		return 0
	}
	_, own, reaped := procTimes(postmaster)
	total := own + reaped
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == postmaster {
			continue
		}
		if ppid, own, _ := procTimes(pid); ppid == postmaster {
			total += own
		}
	}
	return total
}

// procTimes reads a process's parent and its CPU time and that of its reaped children from
// /proc/<pid>/stat, in clock ticks of 10 ms.
func procTimes(pid int) (ppid int, own, reaped time.Duration) {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, 0
	}
	// The fields after the command, which may hold spaces, in parentheses.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 > len(stat) {
		return 0, 0, 0
	}
	f := strings.Fields(string(stat[i+2:]))
	if len(f) < 15 {
		return 0, 0, 0
	}
	n := func(s string) time.Duration {
		v, _ := strconv.ParseInt(s, 10, 64)
		return time.Duration(v) * 10 * time.Millisecond
	}
	ppid, _ = strconv.Atoi(f[1])
	return ppid, n(f[11]) + n(f[12]), n(f[13]) + n(f[14])
}
