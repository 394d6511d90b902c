package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Offered rates of the latency section, in messages per second.
var (
	ratesFull  = []int{1_000, 10_000}
	ratesQuick = []int{1_000}
)

const (
	// probePeriod and probeBatch pace the subscriber-latency probe below the lowest offered
	// rate (5 messages every 10 ms is 500 msg/s), so that it never catches up with the
	// producer: every pull it makes finds messages ready, which is what the subscriber
	// latency of three-latencies.md is about (how fast "next work" is found and returned),
	// not how long it takes for new work to arrive.
	probePeriod = 10 * time.Millisecond
	probeBatch  = 5
	// deliverTimeout bounds the wait for the end-to-end consumer to receive what was acked.
	deliverTimeout = 10 * time.Second
)

func (r *runner) rates() []int {
	if r.cfg.Quick {
		return ratesQuick
	}
	return ratesFull
}

// runLatency measures the three latencies on every NATS target at each offered rate.
func (r *runner) runLatency(ctx context.Context) {
	for _, rate := range r.rates() {
		for _, t := range r.targets {
			if t.naive != nil {
				continue
			}
			r.settle(ctx)
			res, err := r.threeLatencies(ctx, t, rate)
			if err != nil {
				r.fail(fmt.Sprintf("latency at %d msg/s", rate), t, err)
				continue
			}
			r.rep.Latency = append(r.rep.Latency, res)
		}
	}
}

// settle has PostgreSQL write back what the sections before left dirty (hundreds of
// megabytes after fetch and push), so that a latency phase, a few seconds at a low rate,
// measures the target rather than a checkpoint that happened to fall into it. Every
// target's phase starts settled alike. Without the right to CHECKPOINT (a database given by
// URL), it says so once and measures as things are.
func (r *runner) settle(ctx context.Context) {
	if r.probe == nil || r.noCheckpoint {
		return
	}
	if err := r.probe.Checkpoint(ctx); err != nil {
		r.noCheckpoint = true
		r.log.Warn("latency phases start without a checkpoint", "err", err)
	}
}

// threeLatencies offers rate messages per second for Duration and measures, separately:
//   - producer: send → PubAck, from the async ack callback;
//   - end-to-end: send → delivery, by a consumer reading with Messages on its own connection
//     that acks every message, from the send time stamped in the payload;
//   - subscriber: pull request → first message, by a probe on a second durable consumer that
//     starts halfway through, when a backlog is ready for it.
func (r *runner) threeLatencies(ctx context.Context, t *benchTarget, rate int) (LatResult, error) {
	r.prog.phase(fmt.Sprintf("latency %5d/s %s", rate, t.name), 0, r.cfg.Duration)
	var prodMu sync.Mutex
	prod := &Histogram{}
	var acked, failed atomic.Int64
	var firstErr firstError
	pc, err := dial(t.url, "jetgres-bench-producer",
		jetstream.WithPublishAsyncMaxPending(r.cfg.Window),
		jetstream.WithPublishAsyncTimeout(drainTimeout),
		jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, m *nats.Msg, _ *jetstream.PubAck) {
			now := time.Now()
			if ts, ok := stampOf(m.Data); ok {
				prodMu.Lock()
				prod.Record(now.Sub(ts))
				prodMu.Unlock()
			}
			acked.Add(1)
		}),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
			firstErr.set(err)
			failed.Add(1)
		}))
	if err != nil {
		return LatResult{}, err
	}
	defer pc.close()
	name := fmt.Sprintf("BENCH_LAT_%d", rate)
	s, err := pc.createStream(ctx, name, "bench.lat")
	if err != nil {
		return LatResult{}, err
	}
	defer r.cleanup(t, pc.deleteStream, name)
	for _, cc := range []jetstream.ConsumerConfig{
		{Durable: "E2E", AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy},
		{Durable: "SUB", AckPolicy: jetstream.AckAllPolicy, DeliverPolicy: jetstream.DeliverAllPolicy},
	} {
		cctx, cancel := context.WithTimeout(ctx, apiTimeout)
		_, err := s.CreateOrUpdateConsumer(cctx, cc)
		cancel()
		if err != nil {
			return LatResult{}, fmt.Errorf("create consumer %s: %w", cc.Durable, err)
		}
	}

	// The consumers get their own connection, so deliveries do not queue behind publishes.
	cc, err := dial(t.url, "jetgres-bench-consumer")
	if err != nil {
		return LatResult{}, err
	}
	defer cc.close()
	e2eCons, err := consumer(ctx, cc, name, "E2E")
	if err != nil {
		return LatResult{}, err
	}
	subCons, err := consumer(ctx, cc, name, "SUB")
	if err != nil {
		return LatResult{}, err
	}
	e2e := &Histogram{}
	var delivered atomic.Int64
	it, err := e2eCons.Messages()
	if err != nil {
		return LatResult{}, fmt.Errorf("consumer E2E: messages: %w", err)
	}
	var consumeErr error
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		consumeErr = readEndToEnd(it, e2e, &delivered)
	}()
	stopConsumer := func() error {
		it.Stop()
		<-consumed
		return consumeErr
	}

	start := time.Now()
	end := start.Add(r.cfg.Duration)
	probe := &Histogram{}
	probeDone := make(chan error, 1)
	go func() { probeDone <- probeSubscriber(ctx, subCons, start.Add(r.cfg.Duration/2), end, probe) }()

	sent, err := r.pacedPublish(ctx, pc, rate, end)
	sendTime := time.Since(start)
	probeErr := <-probeDone
	if err != nil {
		return LatResult{}, errors.Join(err, stopConsumer())
	}
	select {
	case <-pc.js.PublishAsyncComplete():
	case <-time.After(drainTimeout):
	case <-ctx.Done():
	}
	if n := failed.Load(); n > 0 {
		err := fmt.Errorf("%d of %d publishes failed, the first with: %w", n, sent, firstErr.err)
		return LatResult{}, errors.Join(err, stopConsumer())
	}
	want := acked.Load()
	for wait := time.Now().Add(deliverTimeout); delivered.Load() < want && time.Now().Before(wait) && ctx.Err() == nil; {
		time.Sleep(5 * time.Millisecond)
	}
	if err := stopConsumer(); err != nil {
		return LatResult{}, fmt.Errorf("end-to-end consumer: %w", err)
	}
	if probeErr != nil {
		return LatResult{}, fmt.Errorf("subscriber probe: %w", probeErr)
	}
	// A callback may still be running if the drain above timed out.
	prodMu.Lock()
	defer prodMu.Unlock()
	res := LatResult{
		Target:     t.name,
		Rate:       rate,
		Achieved:   float64(sent) / sendTime.Seconds(),
		Producer:   prod.Summary(),
		Subscriber: probe.Summary(),
		EndToEnd:   e2e.Summary(),
		Acked:      int(want),
		Delivered:  int(delivered.Load()),
		hists:      [3]*Histogram{prod, probe, e2e},
	}
	if res.Delivered < res.Acked {
		return res, fmt.Errorf("the consumer received %d of %d acknowledged messages within %s", res.Delivered, res.Acked, deliverTimeout)
	}
	return res, nil
}

func consumer(ctx context.Context, c *client, stream, name string) (jetstream.Consumer, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	cons, err := c.js.Consumer(ctx, stream, name)
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", name, err)
	}
	return cons, nil
}

// maxIterErrors bounds the transient errors (missed heartbeats and the like) the end-to-end
// reader tolerates before it gives up, so that a broken target cannot keep it spinning.
const maxIterErrors = 100

// readEndToEnd records send → delivery for every message until the iterator is stopped.
func readEndToEnd(it jetstream.MessagesContext, h *Histogram, delivered *atomic.Int64) error {
	var errs int
	for {
		m, err := it.Next()
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			return nil
		}
		if err != nil {
			if errs++; errs > maxIterErrors {
				return fmt.Errorf("%d errors, the last: %w", errs, err)
			}
			continue
		}
		now := time.Now()
		if ts, ok := stampOf(m.Data()); ok {
			h.Record(now.Sub(ts))
		}
		if err := m.Ack(); err != nil {
			return fmt.Errorf("ack: %w", err)
		}
		delivered.Add(1)
	}
}

// probeSubscriber pulls small batches from from until until, recording the time from each
// pull request to its first message, and acks each batch with its last message. A target
// whose stores stalled for the whole window (sync_always on a busy disk can) is probed on,
// for at most deliverTimeout, until one sample is in: the producer's backlog is still there.
func probeSubscriber(ctx context.Context, cons jetstream.Consumer, from, until time.Time, h *Histogram) error {
	select {
	case <-time.After(time.Until(from)):
	case <-ctx.Done():
		return ctx.Err()
	}
	tick := time.NewTicker(probePeriod)
	defer tick.Stop()
	giveUp := until.Add(deliverTimeout)
	for ctx.Err() == nil && time.Now().Before(giveUp) && (time.Now().Before(until) || h.Count() == 0) {
		t0 := time.Now()
		b, err := cons.Fetch(probeBatch, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return fmt.Errorf("fetch: %w", err)
		}
		var last jetstream.Msg
		for m := range b.Messages() {
			if last == nil {
				h.Record(time.Since(t0))
			}
			last = m
		}
		if err := b.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !isTimeout(err) {
			return fmt.Errorf("fetch: %w", err)
		}
		if last != nil {
			if err := last.Ack(); err != nil {
				return fmt.Errorf("ack: %w", err)
			}
		}
		<-tick.C
	}
	return nil
}

// pacedPublish offers rate messages per second until end, each stamped with its send time,
// through PublishAsync. It sends in millisecond steps whatever is due, so the offered load
// stays on schedule despite timer granularity; a target that cannot keep up stalls the
// window and the achieved rate shows it.
func (r *runner) pacedPublish(ctx context.Context, c *client, rate int, end time.Time) (int, error) {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	sent := 0
	for ctx.Err() == nil {
		now := time.Now()
		if !now.Before(end) {
			break
		}
		due := int(float64(rate) * now.Sub(start).Seconds())
		for sent < due && time.Now().Before(end) {
			_, err := c.js.PublishAsync("bench.lat", stamped(r.cfg.Size, time.Now()), jetstream.WithStallWait(time.Second))
			if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				continue
			}
			if err != nil {
				return sent, fmt.Errorf("publish %d: %w", sent+1, err)
			}
			sent++
			r.prog.add(1)
		}
		<-tick.C
	}
	return sent, ctx.Err()
}
