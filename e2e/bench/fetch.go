package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// runFetch measures fetch + ack on the NATS targets. JetStream's sync_always setting changes
// only its write path, so the read side is measured once, on the default store.
func (r *runner) runFetch(ctx context.Context) {
	for _, t := range r.targets {
		if t.naive != nil || t.name == TargetJetStreamSync {
			continue
		}
		res, err := r.fetchAck(ctx, t)
		if err != nil {
			r.fail(SectionFetch, t, err)
			continue
		}
		r.rep.Fetch = append(r.rep.Fetch, res)
	}
}

// fetchAck fills a stream with up to Msgs messages (not timed), then drains it with a durable
// pull consumer: Fetch a batch, ack every message explicitly, repeat, until every stored
// message was received or Duration ran out. The time runs until the last ack is flushed to
// the server.
func (r *runner) fetchAck(ctx context.Context, t *target) (FetchResult, error) {
	c, err := dial(t.url, "jetgres-bench-fetch", jetstream.WithPublishAsyncMaxPending(r.cfg.Window))
	if err != nil {
		return FetchResult{}, err
	}
	defer c.close()
	s, err := c.createStream(ctx, "BENCH_FETCH", "bench.fetch")
	if err != nil {
		return FetchResult{}, err
	}
	defer r.cleanup(t, c.deleteStream, "BENCH_FETCH")

	r.prog.phase(fmt.Sprintf("fetch: filling %s", t.name), 0, 3*r.cfg.Duration)
	payload := make([]byte, r.cfg.Size)
	if _, _, err := r.publishAsync(ctx, c, "bench.fetch", func(time.Time) []byte { return payload }, r.cfg.Msgs, 3*r.cfg.Duration); err != nil {
		return FetchResult{}, fmt.Errorf("fill stream: %w", err)
	}
	ictx, cancel := context.WithTimeout(ctx, apiTimeout)
	info, err := s.Info(ictx)
	cancel()
	if err != nil {
		return FetchResult{}, fmt.Errorf("stream info: %w", err)
	}
	total := int(info.State.Msgs)
	if total == 0 {
		return FetchResult{}, errors.New("the stream is empty after filling it")
	}
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	cons, err := s.CreateOrUpdateConsumer(cctx, jetstream.ConsumerConfig{
		Durable:       "BENCH_FETCH",
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		// Room for two batches: the acks of one may still be in flight when the next is asked for.
		MaxAckPending: 4 * FetchBatchDefault,
	})
	cancel()
	if err != nil {
		return FetchResult{}, fmt.Errorf("create consumer: %w", err)
	}

	r.prog.phase(fmt.Sprintf("fetch + ack    %s", t.name), int64(total), 0)
	got := 0
	start := time.Now()
	deadline := start.Add(r.cfg.Duration)
	for got < total && time.Now().Before(deadline) && ctx.Err() == nil {
		b, err := cons.Fetch(FetchBatchDefault, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return FetchResult{}, fmt.Errorf("fetch after %d messages: %w", got, err)
		}
		n := 0
		for m := range b.Messages() {
			if err := m.Ack(); err != nil {
				return FetchResult{}, fmt.Errorf("ack message %d: %w", got+n+1, err)
			}
			n++
		}
		if err := b.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !isTimeout(err) {
			return FetchResult{}, fmt.Errorf("fetch after %d messages: %w", got, err)
		}
		got += n
		r.prog.add(int64(n))
	}
	fctx, cancel := context.WithTimeout(ctx, apiTimeout)
	err = c.nc.FlushWithContext(fctx)
	cancel()
	if err != nil {
		return FetchResult{}, fmt.Errorf("flush acks: %w", err)
	}
	elapsed := time.Since(start)
	if got == 0 {
		return FetchResult{}, fmt.Errorf("no message received of %d stored", total)
	}
	return FetchResult{Target: t.name, Msgs: got, Seconds: elapsed.Seconds(), MsgsPerSec: float64(got) / elapsed.Seconds()}, nil
}

func isTimeout(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}
