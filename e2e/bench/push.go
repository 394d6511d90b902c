package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetgres/jetgres/bridge"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/pg"
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
var PushModes = []string{PushAckExplicit, PushAckNone, PushOrdered, PushOrderedJS}

// PushFloor is jetgres's minimum push path, measured with the push modes: the same
// callback drains a core subscription that the bridge's leafnode link feeds with the same
// messages, ack reply subjects included, without a stream, a consumer or PostgreSQL.
const PushFloor = "link floor"

// PushAckFloor is the link floor with the acks of ack explicit coming back: the same
// callback acks each delivery as js.Subscribe with ack explicit does, a publish of "+ACK" to
// its reply subject, and the acks cross the NATS server and the leafnode link to a
// subscription on the link's side that counts and drops them. It keeps no consumer state,
// writes no cursor and reads no PostgreSQL, and runs until the last ack arrived.
const PushAckFloor = "ack floor"

// PushReadFloor is the rate at which jetgres reads a push consumer's backlog from
// PostgreSQL, measured with the push modes: the stream's messages read in order, in the
// windows and through the call a push consumer behind the tail cache uses, one read at a
// time as it keeps one in flight, with nothing delivered. A consumer that starts before the
// tail cache delivers no faster than this while it reads.
const PushReadFloor = "read floor"

// PushCPUFloor is the rate the machine's cores allow for reading a backlog from PostgreSQL
// and sending it over the leafnode link to a client: the cores divided by the CPU time per
// message of the link floor and the read floor together, each measured in the same run as
// everything its process and PostgreSQL spent on it. A push consumer whose backlog lies in
// PostgreSQL does at least that work for every message, so when the cores are its limit it
// cannot go faster; a mode well below it loses time elsewhere (waiting, not working).
const PushCPUFloor = "CPU floor"

// PushAckCPUFloor is the CPU floor of ack explicit: the cores divided by the CPU time per
// message of the ack floor and the read floor together. Ack explicit does at least that
// work for every message it reads from PostgreSQL, so with the cores busy it goes no faster;
// what it spends beyond, such as applying the acks and writing the consumer's cursor, is
// jetgres's own work.
const PushAckCPUFloor = "ack CPU floor"

// PushFloors lists the floor rows in report order.
var PushFloors = []string{PushFloor, PushAckFloor, PushReadFloor, PushCPUFloor, PushAckCPUFloor}

// ackFloorStream is the stream token of the ack floor's reply subjects: no stream has the
// name, so the bridge's ack handler, which hears every $JS.ACK subject on the link, drops
// each such ack at the stream lookup and keeps no state for it. It is as long as
// BENCH_PUSH, so that the subjects are as long as a delivery's.
const ackFloorStream = "BENCH_ACKF"

// floorWindow bounds how many messages the floor's sender is ahead of the subscriber,
// which a core subscription would otherwise drop as a slow consumer.
const floorWindow = 8192

// pushTurns is how many times each target drains its stream in each mode. Like the fetch
// turns, they alternate in order (jetgres first, then JetStream first) so that both see
// the same share of a noisy machine.
const pushTurns = 2

// pushTarget is one target's stream, filled once and drained by every push measurement.
type pushTarget struct {
	t     *benchTarget
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
	meter := r.newCPUMeter(ctx)
	for _, mode := range PushModes {
		msgs := make(map[*pushTarget]int)
		spent := make(map[*pushTarget]time.Duration)
		cpu := make(map[*pushTarget]cpuSample)
		failed := make(map[*pushTarget]error)
		for turn := range pushTurns {
			for _, p := range turnOrder(ps, turn) {
				if failed[p] != nil || ctx.Err() != nil {
					continue
				}
				r.prog.phase(fmt.Sprintf("push, %-12s %s, turn %d of %d", mode, p.t.name, turn+1, pushTurns), int64(p.total), 0)
				s0 := meter.sample()
				n, d, err := r.pushDrain(ctx, p, mode)
				if err != nil {
					failed[p] = err
					continue
				}
				msgs[p] += n
				spent[p] += d
				cpu[p] = cpu[p].add(meter.sample().since(s0))
			}
		}
		switch mode {
		case PushAckExplicit:
			r.runPushFloors(ctx, ps, msgs, meter, PushAckFloor, r.pushAckFloor)
		case PushAckNone:
			r.runPushFloors(ctx, ps, msgs, meter, PushFloor, r.pushFloor)
			r.runPushFloors(ctx, ps, msgs, meter, PushReadFloor, r.pushReadFloor)
			r.addCPUFloor(PushCPUFloor, PushFloor)
			r.addCPUFloor(PushAckCPUFloor, PushAckFloor)
		}
		for _, p := range ps {
			switch {
			case failed[p] != nil:
				r.fail(SectionPush+" "+mode, p.t, failed[p])
			case msgs[p] == 0:
				r.fail(SectionPush+" "+mode, p.t, fmt.Errorf("no message received of %d stored", p.total))
			default:
				r.rep.Push = append(r.rep.Push, pushResult(p, mode, msgs[p], spent[p], cpu[p]))
			}
		}
	}
	if ctx.Err() == nil {
		r.runOrderedReads(ctx, meter)
	}
}

// pushResult is one target's measurement in one mode, with the CPU time it took per message.
func pushResult(p *pushTarget, mode string, n int, spent time.Duration, cpu cpuSample) PushResult {
	res := PushResult{Target: p.t.name, Mode: mode, Msgs: n, Seconds: spent.Seconds(), MsgsPerSec: float64(n) / spent.Seconds()}
	res.CPUUsPerMsg = float64(cpu.proc.Microseconds()) / float64(n)
	if cpu.pgOK {
		res.PGCPUUsPerMsg = float64(cpu.pg.Microseconds()) / float64(n)
	}
	return res
}

// addCPUFloor adds the CPU floor named floor, of the sending floor send and the read floor,
// for each target that has both in the report.
func (r *runner) addCPUFloor(floor, send string) {
	cores := cpuCores()
	for _, link := range r.rep.Push {
		if link.Mode != send {
			continue
		}
		for _, read := range r.rep.Push {
			if read.Mode != PushReadFloor || read.Target != link.Target {
				continue
			}
			us := link.CPUUsPerMsg + link.PGCPUUsPerMsg + read.CPUUsPerMsg + read.PGCPUUsPerMsg
			if us <= 0 {
				continue
			}
			r.rep.Push = append(r.rep.Push, PushResult{Target: link.Target, Mode: floor,
				MsgsPerSec: cores / us * 1e6, CPUUsPerMsg: link.CPUUsPerMsg + read.CPUUsPerMsg,
				PGCPUUsPerMsg: link.PGCPUUsPerMsg + read.PGCPUUsPerMsg})
		}
	}
}

// fillForPush fills a stream with up to Msgs messages. On success the caller closes the
// client and deletes the stream.
func (r *runner) fillForPush(ctx context.Context, t *benchTarget) (*pushTarget, error) {
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
	if mode == PushOrderedJS {
		return r.consumeOrdered(ctx, p)
	}
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

// runPushFloors measures a floor mode on the in-process jetgres, after the turns of the mode
// it bounds, for as many messages as they drained there: measure is PushFloor's pushFloor,
// PushAckFloor's pushAckFloor or PushReadFloor's pushReadFloor.
func (r *runner) runPushFloors(ctx context.Context, ps []*pushTarget, drained map[*pushTarget]int, meter *cpuMeter, mode string,
	measure func(context.Context, *pushTarget) (int, time.Duration, error)) {
	for _, p := range ps {
		if p.t.node == nil || drained[p] == 0 || ctx.Err() != nil {
			continue
		}
		var n int
		var spent time.Duration
		var cpu cpuSample
		for turn := range pushTurns {
			r.prog.phase(fmt.Sprintf("push, %-12s %s, turn %d of %d", mode, p.t.name, turn+1, pushTurns), int64(p.total), 0)
			s0 := meter.sample()
			got, d, err := measure(ctx, p)
			if err != nil {
				r.fail(SectionPush+" "+mode, p.t, err)
				return
			}
			n += got
			spent += d
			cpu = cpu.add(meter.sample().since(s0))
		}
		r.rep.Push = append(r.rep.Push, pushResult(p, mode, n, spent, cpu))
	}
}

// pushFloor sends the stream's worth of messages through the link to a core subscription
// of the same client and counts them as pushDrain does.
func (r *runner) pushFloor(ctx context.Context, p *pushTarget) (int, time.Duration, error) {
	return r.linkFloor(ctx, p, PushFloor, false)
}

// pushAckFloor is pushFloor with an ack for every delivery, counted when it is back on the
// link's side.
func (r *runner) pushAckFloor(ctx context.Context, p *pushTarget) (int, time.Duration, error) {
	return r.linkFloor(ctx, p, PushAckFloor, true)
}

// linkFloor measures the link floor, or with acks the ack floor: the messages go through the
// link to a core subscription of the same client, and with acks the callback acks each one
// and the floor ends when the last ack has crossed back. The window counts what is
// unfinished: messages not yet received, or with acks not yet acked back.
func (r *runner) linkFloor(ctx context.Context, p *pushTarget, mode string, acks bool) (int, time.Duration, error) {
	var got, acked atomic.Int64
	// An ack that fails never comes back: the run ends with its error rather than at the
	// time bound.
	ackErr := make(chan error, 1)
	want := int64(p.total)
	finished := &got
	if acks {
		finished = &acked
	}
	more := make(chan struct{}, 1)
	done := make(chan struct{})
	// finish counts a finished message, on the client's callback or the link's read loop,
	// neither of which may block.
	finish := func(n int64) {
		if n%(floorWindow/4) == 0 {
			select {
			case more <- struct{}{}:
			default:
			}
		}
		if n == want {
			close(done)
		}
	}
	link := p.t.node.link
	prefix := "$JS.ACK.BENCH_PUSH.aBcDeFgHiJkLmNoPqRsTuV.1."
	if acks {
		prefix = "$JS.ACK." + ackFloorStream + ".aBcDeFgHiJkLmNoPqRsTuV.1."
		// The acks come back on the link's read loop as the bridge's do, borrowed from its
		// read buffer.
		asub, err := link.SubscribeBorrowed(prefix+">", "", func(*leaf.Msg) { finish(acked.Add(1)) })
		if err == nil {
			err = link.Flush(ctx)
		}
		if err != nil {
			return 0, 0, fmt.Errorf("%s: subscribe to acks: %w", mode, err)
		}
		defer func() { _ = asub.Unsubscribe() }()
	}
	inbox := nats.NewInbox()
	start := time.Now()
	sub, err := p.c.nc.Subscribe(inbox, func(m *nats.Msg) {
		if acks {
			if err := m.Ack(); err != nil {
				select {
				case ackErr <- err:
				default:
				}
			}
		}
		r.prog.add(1)
		n := got.Add(1)
		if !acks {
			finish(n)
		}
	})
	if err == nil {
		err = sub.SetPendingLimits(-1, -1)
	}
	if err == nil {
		err = p.c.nc.Flush()
	}
	if err != nil {
		return 0, 0, fmt.Errorf("subscribe: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	payload := make([]byte, r.cfg.Size)
	// A reply of the length of a push delivery's: the consumer's name is 22 characters.
	reply := make([]byte, 0, 128)
	deadline := time.NewTimer(r.cfg.Duration)
	defer deadline.Stop()
	cut := func() (int, time.Duration, error) {
		return floorCut(mode, finished.Load(), want, start, r.cfg.Duration)
	}
	for sent := int64(0); sent < want; {
		if sent-finished.Load() >= floorWindow {
			select {
			case <-more:
			case <-done:
			case <-deadline.C:
				return cut()
			case err := <-ackErr:
				return 0, 0, fmt.Errorf("%s: ack: %w", mode, err)
			case <-ctx.Done():
				return 0, 0, ctx.Err()
			}
			continue
		}
		seq := uint64(sent + 1)
		reply = append(reply[:0], prefix...)
		reply = strconv.AppendUint(reply, seq, 10)
		reply = append(reply, '.')
		reply = strconv.AppendUint(reply, seq, 10)
		reply = append(reply, '.')
		reply = strconv.AppendInt(reply, time.Now().UnixNano(), 10)
		reply = append(reply, '.')
		reply = strconv.AppendUint(reply, uint64(want)-seq, 10)
		reply = append(append(reply, '@'), "bench.push"...)
		if err := link.PublishQueue(inbox, reply, "", nil, payload); err != nil {
			return 0, 0, fmt.Errorf("%s: publish: %w", mode, err)
		}
		sent++
	}
	select {
	case <-done:
	case <-deadline.C:
	case err := <-ackErr:
		return 0, 0, fmt.Errorf("%s: ack: %w", mode, err)
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	return cut()
}

// floorCut ends a floor run, finished or cut short by the phase's time bound: the rate over
// what finished is still the link's rate, as a timed phase's is; only a run in which nothing
// finished has no number.
func floorCut(mode string, finished, want int64, start time.Time, bound time.Duration) (int, time.Duration, error) {
	if finished == 0 {
		return 0, 0, fmt.Errorf("%s: %d of %d messages within %v", mode, finished, want, bound)
	}
	return int(finished), time.Since(start), nil
}

// pushReadFloor reads the push stream from its first message to its last as a push
// consumer's read-ahead does, and counts the messages.
func (r *runner) pushReadFloor(ctx context.Context, p *pushTarget) (int, time.Duration, error) {
	db := p.t.node.db
	streams, err := db.Streams(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("read floor: %w", err)
	}
	i := slices.IndexFunc(streams, func(s pg.StreamRow) bool { return s.Name == "BENCH_PUSH" })
	if i < 0 {
		return 0, 0, errors.New("read floor: no stream BENCH_PUSH")
	}
	id, upTo := streams[i].ID, uint64(p.total)
	got := 0
	start := time.Now()
	for from := uint64(1); from <= upTo; {
		msgs, through, _, err := db.ReadFiltered(ctx, pg.ReadParams{StreamID: id, From: from, UpTo: upTo, MaxMsgs: bridge.ReadAheadMsgs, MaxBytes: bridge.ReadAheadBytes}, nil)
		if err != nil {
			return 0, 0, fmt.Errorf("read floor: %w", err)
		}
		r.prog.add(int64(len(msgs)))
		got += len(msgs)
		from = through + 1
	}
	return got, time.Since(start), nil
}
