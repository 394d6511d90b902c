package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// fetchTurns is how many turns the targets take at draining their streams. On a shared,
// noisy machine, draining one target and then the other gives each a different share of
// the noise; short turns, in alternating order, give them the same.
const fetchTurns = 8

// drain is one target's fetch + ack measurement, taken in turns.
type drain struct {
	t     *benchTarget
	c     *client
	cons  jetstream.Consumer
	total int // messages stored
	got   int
	spent time.Duration // in turns, up to each turn's last flushed ack
	err   error
}

// runFetch measures fetch + ack on the NATS targets. JetStream's sync_always setting changes
// only its write path, so the read side is measured once, on the default store. Every
// target's stream is filled first (not timed); then the targets drain theirs in turns.
func (r *runner) runFetch(ctx context.Context) {
	var ds []*drain
	for _, t := range r.targets {
		if t.naive != nil || t.name == TargetJetStreamSync {
			continue
		}
		d, err := r.fillForFetch(ctx, t)
		if err != nil {
			r.fail(SectionFetch, t, err)
			continue
		}
		defer d.c.close()
		defer r.cleanup(t, d.c.deleteStream, "BENCH_FETCH")
		ds = append(ds, d)
	}
	for turn := range fetchTurns {
		for _, d := range turnOrder(ds, turn) {
			if d.err == nil && d.got < d.total && d.spent < r.cfg.Duration && ctx.Err() == nil {
				r.prog.phase(fmt.Sprintf("fetch + ack    %s, turn %d of %d", d.t.name, turn+1, fetchTurns), int64(d.total), 0)
				r.prog.add(int64(d.got))
				d.err = r.fetchTurn(ctx, d, (d.total*(turn+1)+fetchTurns-1)/fetchTurns, r.cfg.Duration*time.Duration(turn+1)/fetchTurns)
			}
		}
	}
	for _, d := range ds {
		switch {
		case d.err != nil:
			r.fail(SectionFetch, d.t, d.err)
		case d.got == 0:
			r.fail(SectionFetch, d.t, fmt.Errorf("no message received of %d stored", d.total))
		default:
			r.rep.Fetch = append(r.rep.Fetch, FetchResult{Target: d.t.name, Msgs: d.got, Seconds: d.spent.Seconds(), MsgsPerSec: float64(d.got) / d.spent.Seconds()})
		}
	}
}

// turnOrder is the order of the targets in a turn: reversed every other turn, so that none
// always goes first.
func turnOrder[T any](ds []T, turn int) []T {
	if turn%2 == 0 {
		return ds
	}
	rev := slices.Clone(ds)
	slices.Reverse(rev)
	return rev
}

// fillForFetch fills a stream with up to Msgs messages and creates the durable pull
// consumer that will drain it. On success the caller closes the client and deletes the
// stream.
func (r *runner) fillForFetch(ctx context.Context, t *benchTarget) (d *drain, err error) {
	c, err := dial(t.url, "jetgres-bench-fetch", jetstream.WithPublishAsyncMaxPending(r.cfg.Window))
	if err != nil {
		return nil, err
	}
	s, err := c.createStream(ctx, "BENCH_FETCH", "bench.fetch")
	if err != nil {
		c.close()
		return nil, err
	}
	defer func() {
		if err != nil {
			r.cleanup(t, c.deleteStream, "BENCH_FETCH")
			c.close()
		}
	}()
	r.prog.phase(fmt.Sprintf("fetch: filling %s", t.name), 0, 3*r.cfg.Duration)
	payload := make([]byte, r.cfg.Size)
	if _, _, err := r.publishAsync(ctx, c, "bench.fetch", func(time.Time) []byte { return payload }, r.cfg.Msgs, 3*r.cfg.Duration); err != nil {
		return nil, fmt.Errorf("fill stream: %w", err)
	}
	ictx, cancel := context.WithTimeout(ctx, apiTimeout)
	info, err := s.Info(ictx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("stream info: %w", err)
	}
	if info.State.Msgs == 0 {
		return nil, errors.New("the stream is empty after filling it")
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
		return nil, fmt.Errorf("create consumer: %w", err)
	}
	return &drain{t: t, c: c, cons: cons, total: int(info.State.Msgs)}, nil
}

// fetchTurn drains d's stream with its pull consumer until it has received upTo messages
// in all or its time in turns reaches budget: Fetch a batch, ack every message explicitly,
// repeat. The turn's time runs until its last ack is flushed to the server.
func (r *runner) fetchTurn(ctx context.Context, d *drain, upTo int, budget time.Duration) error {
	start := time.Now()
	deadline := start.Add(budget - d.spent)
	for d.got < upTo && time.Now().Before(deadline) && ctx.Err() == nil {
		b, err := d.cons.Fetch(FetchBatchDefault, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return fmt.Errorf("fetch after %d messages: %w", d.got, err)
		}
		n := 0
		for m := range b.Messages() {
			if err := m.Ack(); err != nil {
				return fmt.Errorf("ack message %d: %w", d.got+n+1, err)
			}
			n++
		}
		if err := b.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !isTimeout(err) {
			return fmt.Errorf("fetch after %d messages: %w", d.got, err)
		}
		d.got += n
		r.prog.add(int64(n))
	}
	fctx, cancel := context.WithTimeout(ctx, apiTimeout)
	err := d.c.nc.FlushWithContext(fctx)
	cancel()
	d.spent += time.Since(start)
	if err != nil {
		return fmt.Errorf("flush acks: %w", err)
	}
	return nil
}

func isTimeout(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}
