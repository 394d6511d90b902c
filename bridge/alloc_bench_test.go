package bridge

import (
	"context"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The benchmarks here report the memory that everything in the process (client, NATS
// server, link, bridge, pgx) allocates per message on the two hot paths, since the garbage
// collector pays for every byte, and the processor time the process spends per message,
// which leaves out what it waits for. Compare two versions by running them in turns.
// Throughput belongs to the project's bench command, which compares it with JetStream in
// the same run.

const allocBenchMsgs = 50000

// BenchmarkAsyncPublish sends asynchronous publishes through the whole path.
func BenchmarkAsyncPublish(b *testing.B) {
	tb := setup(b)
	js := allocBenchStream(b, tb)
	var m allocMeter
	for b.Loop() {
		m.start()
		publishAll(b, js)
		m.stop(allocBenchMsgs)
	}
	m.report(b)
}

// BenchmarkFetchAck drains a stream with a durable pull consumer, Fetch of 500 and an
// explicit ack per message, as the bench command's fetch + ack phase does.
func BenchmarkFetchAck(b *testing.B) {
	tb := setup(b)
	js := allocBenchStream(b, tb)
	publishAll(b, js)
	ctx := context.Background()
	s, err := tb.js.Stream(ctx, "ALLOC")
	if err != nil {
		b.Fatal(err)
	}
	var m allocMeter
	for b.Loop() {
		cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 2000})
		if err != nil {
			b.Fatal(err)
		}
		m.start()
		for got := 0; got < allocBenchMsgs; {
			batch, err := cons.Fetch(500, jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			n := 0
			for msg := range batch.Messages() {
				if err := msg.Ack(); err != nil {
					b.Fatal(err)
				}
				n++
			}
			if n == 0 {
				b.Fatalf("fetch after %d messages: %v", got, batch.Error())
			}
			got += n
		}
		if err := tb.nc.Flush(); err != nil {
			b.Fatal(err)
		}
		m.stop(allocBenchMsgs)
		if err := s.DeleteConsumer(ctx, "C"); err != nil {
			b.Fatal(err)
		}
	}
	m.report(b)
}

// BenchmarkPush drains a stream with nats.go's js.Subscribe in each of the bench
// command's push modes: an explicit ack per message, ack none, and an ordered consumer
// (flow control and heartbeats). Unsubscribing deletes the consumer.
func BenchmarkPush(b *testing.B) {
	tb := setup(b)
	js := allocBenchStream(b, tb)
	publishAll(b, js)
	legacy, err := tb.nc.JetStream()
	if err != nil {
		b.Fatal(err)
	}
	modes := []struct {
		name string
		opts []nats.SubOpt
		ack  bool
	}{
		{"AckExplicit", []nats.SubOpt{nats.ManualAck(), nats.AckExplicit()}, true},
		{"AckNone", []nats.SubOpt{nats.AckNone()}, false},
		{"Ordered", []nats.SubOpt{nats.OrderedConsumer()}, false},
	}
	for _, mode := range modes {
		b.Run(mode.name, func(b *testing.B) {
			var m allocMeter
			var wall time.Duration
			for b.Loop() {
				done := make(chan struct{})
				got := 0
				m.start()
				began := time.Now()
				sub, err := legacy.Subscribe("alloc.x", func(msg *nats.Msg) {
					if mode.ack {
						if err := msg.Ack(); err != nil {
							b.Error(err)
						}
					}
					if got++; got == allocBenchMsgs {
						close(done)
					}
				}, append([]nats.SubOpt{nats.DeliverAll()}, mode.opts...)...)
				if err != nil {
					b.Fatal(err)
				}
				select {
				case <-done:
				case <-time.After(time.Minute):
					b.Fatalf("%d of %d messages within a minute", got, allocBenchMsgs)
				}
				if err := tb.nc.Flush(); err != nil {
					b.Fatal(err)
				}
				wall += time.Since(began)
				m.stop(allocBenchMsgs)
				if err := sub.Unsubscribe(); err != nil {
					b.Fatal(err)
				}
			}
			m.report(b)
			b.ReportMetric(float64(m.msgs)/wall.Seconds(), "msgs/s")
		})
	}
}

func allocBenchStream(b *testing.B, tb *testBundle) jetstream.JetStream {
	if _, err := tb.js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "ALLOC", Subjects: []string{"alloc.>"}}); err != nil {
		b.Fatal(err)
	}
	js, err := jetstream.New(tb.nc, jetstream.WithPublishAsyncMaxPending(1000))
	if err != nil {
		b.Fatal(err)
	}
	return js
}

func publishAll(b *testing.B, js jetstream.JetStream) {
	data := make([]byte, 128)
	for range allocBenchMsgs {
		if _, err := js.PublishAsync("alloc.x", data); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("publishes not acknowledged within a minute")
	}
}

// allocMeter sums what the process allocates, and the processor time it uses, over the
// measured parts of a benchmark.
type allocMeter struct {
	before        runtime.MemStats
	cpuBefore     time.Duration
	bytes, allocs uint64
	cpu           time.Duration
	msgs          int
}

func (m *allocMeter) start() {
	runtime.ReadMemStats(&m.before)
	m.cpuBefore = processCPU()
}

func (m *allocMeter) stop(msgs int) {
	m.cpu += processCPU() - m.cpuBefore
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	m.bytes += after.TotalAlloc - m.before.TotalAlloc
	m.allocs += after.Mallocs - m.before.Mallocs
	m.msgs += msgs
}

func (m *allocMeter) report(b *testing.B) {
	b.ReportMetric(float64(m.bytes)/float64(m.msgs), "B/msg")
	b.ReportMetric(float64(m.allocs)/float64(m.msgs), "allocs/msg")
	b.ReportMetric(float64(m.cpu.Nanoseconds())/float64(m.msgs), "cpu-ns/msg")
}

// processCPU is the user and system time this process has used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
