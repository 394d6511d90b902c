package bench

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// Push delivery modes: one nats.go js.Subscribe call, with three sets of options.
const (
	// PushAckExplicit is js.Subscribe with ManualAck and AckExplicit, an Ack per message.
	PushAckExplicit = "ack explicit"
	// PushAckNone is js.Subscribe with AckNone.
	PushAckNone = "ack none"
	// PushOrdered is js.Subscribe with OrderedConsumer: ack none, flow control, heartbeats.
	PushOrdered = "ordered"
)

// PushModes lists the push modes in run order.
var PushModes = []string{PushAckExplicit, PushAckNone, PushOrdered}

// pushTurns is how many times each target drains its stream in each mode. Like the fetch
// turns, they alternate in order (jetgres first, then JetStream first) so that both see
// the same share of a noisy machine.
const pushTurns = 2

// pushTarget is one target's stream, filled once and drained by every push measurement.
type pushTarget struct {
	t     *target
	c     *client
	js    nats.JetStreamContext
	total int
}

// runPush measures push delivery on the NATS targets: each mode's subscription drains the
// whole stream from its start, with the same client code on every target. As for fetch,
// JetStream's sync_always changes only its write path, so it is not measured again here.
func (r *runner) runPush(ctx context.Context) {
	var ps []*pushTarget
	for _, t := range r.targets {
		if t.naive != nil || t.name == TargetJetStreamSync {
			continue
		}
		p, err := r.fillForPush(ctx, t)
		if err != nil {
			r.fail(SectionPush, t, err)
			continue
		}
		defer p.c.close()
		defer r.cleanup(t, p.c.deleteStream, "BENCH_PUSH")
		ps = append(ps, p)
	}
	for _, mode := range PushModes {
		msgs := make(map[*pushTarget]int)
		spent := make(map[*pushTarget]time.Duration)
		failed := make(map[*pushTarget]error)
		for turn := range pushTurns {
			for _, p := range turnOrder(ps, turn) {
				if failed[p] != nil || ctx.Err() != nil {
					continue
				}
				r.prog.phase(fmt.Sprintf("push, %-12s %s, turn %d of %d", mode, p.t.name, turn+1, pushTurns), int64(p.total), 0)
				n, d, err := r.pushDrain(ctx, p, mode)
				if err != nil {
					failed[p] = err
					continue
				}
				msgs[p] += n
				spent[p] += d
			}
		}
		for _, p := range ps {
			switch {
			case failed[p] != nil:
				r.fail(SectionPush+" "+mode, p.t, failed[p])
			case msgs[p] == 0:
				r.fail(SectionPush+" "+mode, p.t, fmt.Errorf("no message received of %d stored", p.total))
			default:
				r.rep.Push = append(r.rep.Push, PushResult{Target: p.t.name, Mode: mode, Msgs: msgs[p],
					Seconds: spent[p].Seconds(), MsgsPerSec: float64(msgs[p]) / spent[p].Seconds()})
			}
		}
	}
}

// fillForPush fills a stream with up to Msgs messages. On success the caller closes the
// client and deletes the stream.
func (r *runner) fillForPush(ctx context.Context, t *target) (*pushTarget, error) {
	c, err := dial(t.url, "jetgres-bench-push")
	if err != nil {
		return nil, err
	}
	js, err := c.nc.JetStream(nats.MaxWait(apiTimeout))
	if err == nil {
		_, err = c.createStream(ctx, "BENCH_PUSH", "bench.push")
	}
	if err != nil {
		c.close()
		return nil, err
	}
	r.prog.phase(fmt.Sprintf("push: filling %s", t.name), 0, 3*r.cfg.Duration)
	payload := make([]byte, r.cfg.Size)
	sent, _, err := r.publishAsync(ctx, c, "bench.push", func(time.Time) []byte { return payload }, r.cfg.Msgs, 3*r.cfg.Duration)
	if err == nil && sent == 0 {
		err = errors.New("nothing was published")
	}
	if err != nil {
		r.cleanup(t, c.deleteStream, "BENCH_PUSH")
		c.close()
		return nil, fmt.Errorf("fill stream: %w", err)
	}
	return &pushTarget{t: t, c: c, js: js, total: sent}, nil
}

// pushDrain subscribes in the given mode and counts deliveries until the whole stream has
// arrived or the phase's time is up. The time runs from the Subscribe call (which creates
// the consumer) until the last delivery, and the acks it sent are flushed to the server.
// Unsubscribing deletes the consumer the subscription created.
func (r *runner) pushDrain(ctx context.Context, p *pushTarget, mode string) (int, time.Duration, error) {
	var got atomic.Int64
	var ackErr firstError
	done := make(chan struct{})
	want := int64(p.total)
	cb := func(m *nats.Msg) {
		if mode == PushAckExplicit {
			if err := m.Ack(); err != nil {
				ackErr.set(err)
			}
		}
		r.prog.add(1)
		if got.Add(1) == want {
			close(done)
		}
	}
	opts := []nats.SubOpt{nats.DeliverAll()}
	switch mode {
	case PushAckExplicit:
		opts = append(opts, nats.ManualAck(), nats.AckExplicit())
	case PushAckNone:
		opts = append(opts, nats.AckNone())
	case PushOrdered:
		opts = append(opts, nats.OrderedConsumer())
	}
	start := time.Now()
	sub, err := p.js.Subscribe("bench.push", cb, opts...)
	if err != nil {
		return 0, 0, fmt.Errorf("subscribe: %w", err)
	}
	timer := time.NewTimer(r.cfg.Duration)
	select {
	case <-done:
	case <-timer.C:
	case <-ctx.Done():
	}
	timer.Stop()
	fctx, cancel := context.WithTimeout(ctx, apiTimeout)
	err = p.c.nc.FlushWithContext(fctx)
	cancel()
	spent := time.Since(start)
	n := got.Load()
	if uerr := sub.Unsubscribe(); err == nil {
		err = uerr
	}
	if err != nil {
		return 0, 0, fmt.Errorf("after %d messages: %w", n, err)
	}
	// Each callback acks before it counts, so once the count is complete every ack's error
	// is in; before that a callback may still be running.
	if n == want && ackErr.err != nil {
		return 0, 0, fmt.Errorf("ack: %w", ackErr.err)
	}
	return int(n), spent, nil
}
