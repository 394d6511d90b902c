package consumer

import (
	"context"

	"github.com/jetgres/jetgres/internal/permit"
	"github.com/jetgres/jetgres/internal/wake"
	"github.com/jetgres/jetgres/pg"
)

// tickReadMax caps the messages of one shared range read; a larger gap is closed over
// several ticks, or by the consumers themselves reading PostgreSQL.
const tickReadMax = 4096

// kickTicker brings the ticker back to its base period: a consumer just parked and wants
// to hear of commits made elsewhere promptly.
func (cs *Engine) kickTicker() { wake.Poke(cs.kick) }

// tickLoop polls the high-water marks of the streams this process serves consumers of,
// every TickPeriod while they move and backing off to TickIdleMaxDefault while they do not.
// It is how this process learns of commits made by other replicas, for the consumers that
// wait and for the num_pending of those that do not; its own commits need no tick.
func (cs *Engine) tickLoop() {
	base := cs.cfg.TickPeriod
	period := base
	t := cs.clock.NewTimer(period)
	defer t.Stop()
	for {
		select {
		case <-cs.ctx.Done():
			return
		case <-cs.kick:
			if period == base {
				continue
			}
			period = base
			if !t.Stop() {
				select {
				case <-t.C():
				default:
				}
			}
			t.Reset(period)
			continue
		case <-t.C():
		}
		if cs.tick(cs.ctx) {
			period = base
		} else {
			period = min(period*2, max(TickIdleMaxDefault, base))
		}
		t.Reset(period)
	}
}

// tick is one poll: one statement for every stream with consumers, then at most one range
// read per stream whose high-water mark moved, shared by all its consumers through the
// tail. It reports whether anything moved.
func (cs *Engine) tick(ctx context.Context) bool {
	cs.mu.RLock()
	var ids []int64
	byID := make(map[int64]*streamConsumers)
	for s, sc := range cs.streams {
		sc.mu.RLock()
		served := len(sc.cons) > 0
		sc.mu.RUnlock()
		if served {
			ids = append(ids, s.ID())
			byID[s.ID()] = sc
		}
	}
	cs.mu.RUnlock()
	if len(ids) == 0 {
		return false
	}
	cs.m.Ticks.Inc()
	hw, err := cs.db.HighWater(ctx, ids)
	if err != nil {
		if ctx.Err() == nil {
			cs.warnTick.Warn(cs.log, cs.clock.Now(), "tick failed", "err", err)
		}
		return false
	}
	moved := false
	for id, sc := range byID {
		if !sc.s.Tail().Raise(hw[id]) {
			continue
		}
		moved = true
		cs.fill(ctx, sc)
		for _, c := range sc.list() {
			if c.parked.Load() {
				c.signal()
			}
		}
	}
	return moved
}

// fill reads the range the tail is missing, through the pop lane.
func (cs *Engine) fill(ctx context.Context, sc *streamConsumers) {
	from, upTo, ok := sc.s.Tail().Missing()
	if !ok {
		return
	}
	msgs, through, err := cs.ReadPop(ctx, pg.ReadParams{StreamID: sc.s.ID(), From: from, UpTo: upTo, MaxMsgs: tickReadMax, MaxBytes: cs.cfg.TailBytes / 2}, nil)
	if err != nil {
		if ctx.Err() == nil {
			cs.warnFill.Warn(cs.log, cs.clock.Now(), "tick range read failed", "stream", sc.s.Name(), "err", err)
		}
		return
	}
	cs.m.TickReads.Inc()
	sc.s.Tail().Add(msgs, from, through)
	// Rows another replica committed reach the consumers' pending counts only here; rows
	// this process committed were counted already and count once.
	if len(msgs) > 0 {
		for _, c := range sc.list() {
			c.committed(msgs, from)
		}
	}
}

// ReadPop is every read of messages behind the tail: a pop lane permit first, then a
// connection; both are given back before it returns.
func (cs *Engine) ReadPop(ctx context.Context, p pg.ReadParams, filters []string) ([]pg.Message, uint64, error) {
	held, err := cs.cfg.Pop.Acquire(ctx)
	if err != nil {
		return nil, 0, err
	}
	msgs, through, rtt, err := cs.db.ReadFiltered(ctx, p, filters)
	permit.Return(held, rtt, err)
	cs.m.DBReads.Inc()
	return msgs, through, err
}
