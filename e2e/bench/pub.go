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

// drainTimeout bounds the wait for acks still outstanding when a publish phase ends.
const drainTimeout = 30 * time.Second

// runPub measures async publish throughput on every target, then the lone sync publisher.
func (r *runner) runPub(ctx context.Context) {
	for _, t := range r.targets {
		res, err := r.asyncPublish(ctx, t)
		if err != nil {
			r.fail(SectionPub, t, err)
			continue
		}
		r.rep.Publish = append(r.rep.Publish, res)
	}
	for _, t := range r.targets {
		res, err := r.syncPublish(ctx, t)
		if err != nil {
			r.fail("sync publish", t, err)
			continue
		}
		r.rep.Sync = append(r.rep.Sync, res)
	}
}

// asyncPublish sends up to Msgs messages within Duration with at most Window unacknowledged,
// and reports acknowledged messages per second, up to the last ack.
func (r *runner) asyncPublish(ctx context.Context, t *benchTarget) (PubResult, error) {
	r.prog.phase(fmt.Sprintf("async publish  %s", t.name), int64(r.cfg.Msgs), 0)
	if t.naive != nil {
		return r.asyncNaive(ctx, t)
	}
	var acked, failed, last atomic.Int64
	var firstErr firstError
	c, err := dial(t.url, "jetgres-bench-pub",
		jetstream.WithPublishAsyncMaxPending(r.cfg.Window),
		jetstream.WithPublishAsyncTimeout(drainTimeout),
		jetstream.WithPublishAsyncAckHandler(func(jetstream.JetStream, *nats.Msg, *jetstream.PubAck) {
			acked.Add(1)
			last.Store(time.Now().UnixNano())
			r.prog.add(1)
		}),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
			firstErr.set(err)
			failed.Add(1)
		}))
	if err != nil {
		return PubResult{}, err
	}
	defer c.close()
	if _, err := c.createStream(ctx, "BENCH_PUB", "bench.pub"); err != nil {
		return PubResult{}, err
	}
	defer r.cleanup(t, c.deleteStream, "BENCH_PUB")

	payload := make([]byte, r.cfg.Size)
	before := t.sums()
	sent, start, err := r.publishAsync(ctx, c, "bench.pub", func(time.Time) []byte { return payload }, r.cfg.Msgs, r.cfg.Duration)
	if err != nil {
		return PubResult{}, err
	}
	if n := failed.Load(); n > 0 {
		return PubResult{}, fmt.Errorf("%d of %d publishes failed, the first with: %w", n, sent, firstErr.err)
	}
	res := PubResult{Target: t.name, Sent: sent, Acked: int(acked.Load()), Inside: inside(before, t.sums())}
	res.Seconds = time.Unix(0, last.Load()).Sub(start).Seconds()
	if res.Acked == 0 || res.Seconds <= 0 {
		return PubResult{}, errors.New("no publish was acknowledged")
	}
	res.MsgsPerSec = float64(res.Acked) / res.Seconds
	res.MBPerSec = res.MsgsPerSec * float64(r.cfg.Size) / 1e6
	return res, nil
}

// publishAsync sends up to n messages made by payload within d through PublishAsync, then
// waits (bounded) for the acks still outstanding. It returns how many it sent and when it
// started.
func (r *runner) publishAsync(ctx context.Context, c *client, subject string, payload func(time.Time) []byte, n int, d time.Duration) (int, time.Time, error) {
	start := time.Now()
	deadline := start.Add(d)
	sent := 0
	for sent < n && ctx.Err() == nil {
		now := time.Now()
		if now.After(deadline) {
			break
		}
		_, err := c.js.PublishAsync(subject, payload(now), jetstream.WithStallWait(time.Second))
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			continue // the window is full and stayed full for a second: the deadline decides
		}
		if err != nil {
			return sent, start, fmt.Errorf("publish %d to %s: %w", sent+1, subject, err)
		}
		sent++
	}
	select {
	case <-c.js.PublishAsyncComplete():
	case <-time.After(drainTimeout):
		return sent, start, fmt.Errorf("%d acks still outstanding %s after the last publish", c.js.PublishAsyncPending(), drainTimeout)
	case <-ctx.Done():
		return sent, start, ctx.Err()
	}
	return sent, start, ctx.Err()
}

// asyncNaive is the baseline's async publish: Window INSERTs in flight at once, each committed
// on its own, which is the most a client can get out of one-row transactions.
func (r *runner) asyncNaive(ctx context.Context, t *benchTarget) (PubResult, error) {
	if err := t.naive.Reset(ctx); err != nil {
		return PubResult{}, err
	}
	payload := make([]byte, r.cfg.Size)
	var next, acked atomic.Int64
	var last atomic.Int64
	start := time.Now()
	deadline := start.Add(r.cfg.Duration)
	workers := min(r.cfg.Window, r.cfg.Msgs)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for next.Add(1) <= int64(r.cfg.Msgs) && time.Now().Before(deadline) && ctx.Err() == nil {
				octx, cancel := context.WithTimeout(ctx, opTimeout)
				err := t.naive.Insert(octx, "bench.pub", payload)
				cancel()
				if err != nil {
					errs <- err
					return
				}
				acked.Add(1)
				last.Store(time.Now().UnixNano())
				r.prog.add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return PubResult{}, fmt.Errorf("INSERT: %w", err)
	}
	n := int(acked.Load())
	res := PubResult{Target: t.name, Sent: n, Acked: n, Seconds: time.Unix(0, last.Load()).Sub(start).Seconds()}
	if n == 0 || res.Seconds <= 0 {
		return PubResult{}, errors.New("no INSERT committed")
	}
	res.MsgsPerSec = float64(n) / res.Seconds
	res.MBPerSec = res.MsgsPerSec * float64(r.cfg.Size) / 1e6
	return res, nil
}

// syncWarmup publishes are not recorded: they pay for connection set-up and cold caches.
const syncWarmup = 50

// syncPublish measures one publisher that waits for each PubAck (or COMMIT) before the next.
func (r *runner) syncPublish(ctx context.Context, t *benchTarget) (SyncResult, error) {
	r.prog.phase(fmt.Sprintf("sync publish   %s", t.name), 0, r.cfg.Duration)
	var c *client
	if t.naive == nil {
		var err error
		if c, err = dial(t.url, "jetgres-bench-sync"); err != nil {
			return SyncResult{}, err
		}
		defer c.close()
		if _, err := c.createStream(ctx, "BENCH_SYNC", "bench.sync"); err != nil {
			return SyncResult{}, err
		}
		defer r.cleanup(t, c.deleteStream, "BENCH_SYNC")
	} else if err := t.naive.Reset(ctx); err != nil {
		return SyncResult{}, err
	}
	before := t.sums()
	h, n, elapsed, err := r.loneLoop(ctx, r.publisher(t, c), "bench.sync", r.cfg.Duration, r.cfg.Msgs)
	if err != nil {
		return SyncResult{}, err
	}
	return SyncResult{Target: t.name, MsgsPerSec: float64(n) / elapsed.Seconds(), Latency: h.Summary(),
		Inside: inside(before, t.sums()), hist: h}, nil
}

// loneLoop runs one closed-loop publisher for d or n recorded publishes, whichever ends
// first, after syncWarmup unrecorded ones.
func (r *runner) loneLoop(ctx context.Context, pub publishFunc, subject string, d time.Duration, n int) (*Histogram, int, time.Duration, error) {
	payload := make([]byte, r.cfg.Size)
	h := &Histogram{}
	var start time.Time
	for i := 0; ; i++ {
		if i == syncWarmup {
			start = time.Now()
		}
		if i > syncWarmup && (i-syncWarmup >= n || time.Since(start) >= d) {
			break
		}
		if err := ctx.Err(); err != nil {
			return nil, 0, 0, err
		}
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		t0 := time.Now()
		err := pub(octx, subject, payload)
		lat := time.Since(t0)
		cancel()
		if err != nil {
			return nil, 0, 0, fmt.Errorf("sync publish %d: %w", i+1, err)
		}
		if i >= syncWarmup {
			h.Record(lat)
			r.prog.add(1)
		}
	}
	return h, int(h.Count()), time.Since(start), nil
}
