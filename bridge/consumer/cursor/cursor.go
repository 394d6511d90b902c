// Package cursor writes consumers' ack floors (their cursors) to PostgreSQL: a Writer per
// consumer fuses the floor's moves into paced writes, at most one in flight, and answers
// each double ack once a flushed write covers it. The consumer engine (bridge/consumer)
// tells a Writer where the floor is; the Writer asks nothing of the engine but to answer
// acks and to say whether the consumer stops, is gone, or was lost to another replica.
//
// # Locks
//
// Writer.mu is the only lock, a leaf: nothing is taken while it is held, the database is
// called and acks are answered with it released. The engine may call Move and Await with
// its own locks held.
package cursor

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/bridge/consumerstate"
	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/internal/clock"
	"github.com/jetgres/jetgres/internal/permit"
	"github.com/jetgres/jetgres/internal/wake"
	"github.com/jetgres/jetgres/pg"
)

const (
	// IntervalDefault is the least time between two writes of one consumer's ack floor
	// that no double ack waits for. A floor that moves with every ack would otherwise cost
	// PostgreSQL a commit per round trip: 1,300 commits and a third of its CPU while one
	// consumer drains 200,000 messages. JetStream's file store paces consumer state the same
	// way (100 ms). After a crash the acks since the last write are delivered again, which
	// at-least-once allows: those of about one interval and the write in flight, more while
	// the database fails. A double ack is written at once.
	IntervalDefault = 50 * time.Millisecond

	// retryAfter is how long a failed write waits before it is tried again.
	retryAfter = 250 * time.Millisecond
)

// CursorStore is what a Writer asks of PostgreSQL; *pg.DB satisfies it.
type CursorStore interface {
	WriteCursor(ctx context.Context, p pg.CursorParams) (time.Duration, error)
}

// WriterConfig is what the writers of one engine share. Every field is required.
type WriterConfig struct {
	Store CursorStore
	// Lane is the ack lane: cursor writes commit like publishes, but their short round
	// trips would set the publish lane's rtt_base, and they are not reads for the pop lane.
	Lane     *flow.Lane
	Clock    clock.Clock
	Interval time.Duration
	Logger   *slog.Logger
	// Go runs a writer's goroutine on the engine's group; false once that stops.
	Go func(func()) bool
	// Writes counts the writes; Latency observes each one's time, permit wait included.
	Writes  prometheus.Counter
	Latency prometheus.Observer
}

// WriterHost is the consumer whose floor a Writer writes.
type WriterHost interface {
	// AnswerAck answers a double ack: a flushed floor covers it.
	AnswerAck(reply string)
	// Stopping reports whether the consumer stops: what is left is written at once.
	Stopping() bool
	// Gone reports whether the consumer was deleted or taken over: its cursor is no longer
	// this replica's to write.
	Gone() bool
	// Lost stops the consumer: a write found that another replica owns it.
	Lost()
}

// Writer persists one consumer's ack floor. Writes are fused: while one is in flight the
// floor keeps moving in memory, and the next write takes the latest floor. At most one is in
// flight, and one per WriterConfig.Interval unless a double ack waits.
//
// A write no double ack waits for is lazy (pg.CursorParams.Lazy): it does not wait for the
// WAL flush, which cost PostgreSQL nearly as much CPU as all of its reads while a consumer
// acked every message. Losing it in a crash of PostgreSQL only redelivers, and the next
// write that a double ack waits for flushes it with its own commit.
type Writer struct {
	cfg    *WriterConfig
	host   WriterHost
	ctx    context.Context
	done   <-chan struct{}
	key    pg.CursorParams
	stream string

	mu      sync.Mutex
	want    consumerstate.Pair
	written consumerstate.Pair
	// wantShown is the stream sequence consumer info reports for want (see
	// consumerstate.State.Shown); it moves only with the floor, so want decides a write.
	wantShown uint64
	// lazy says the last write was lazy, and durable is then the stream sequence of the
	// last floor known flushed: only that answers a double ack.
	lazy     bool
	durable  uint64
	inflight bool
	waiters  []waiter
	wg       sync.WaitGroup
	// hurry wakes a writer waiting out the pace: a double ack arrived.
	hurry chan struct{}
	// lastWrite is when the last write started; only the writer in flight touches it.
	lastWrite time.Time
}

type waiter struct {
	seq   uint64
	reply string
}

// NewWriter is the writer of the cursor that key names (its stream, name, creation and
// owner), whose stored floor and shown sequence key also carries; streamName names the
// stream in logs. ctx bounds its writes, and done closes when the consumer's goroutine
// ends.
func NewWriter(ctx context.Context, cfg *WriterConfig, host WriterHost, done <-chan struct{}, streamName string, key pg.CursorParams) *Writer {
	floor := consumerstate.Pair{Consumer: key.AckConsumerSeq, Stream: key.AckStreamSeq}
	return &Writer{cfg: cfg, host: host, ctx: ctx, done: done, key: key, stream: streamName,
		want: floor, written: floor, wantShown: key.ShownStreamSeq, hurry: make(chan struct{}, 1)}
}

// Move schedules a write of floor f, which consumer info shows as stream sequence shown.
func (w *Writer) Move(f consumerstate.Pair, shown uint64) {
	w.mu.Lock()
	w.want, w.wantShown = f, shown
	w.start()
}

// start starts the writer unless it runs or has nothing to do. Called with mu held; it
// releases it.
func (w *Writer) start() {
	start := !w.inflight && (w.want != w.written || w.owed())
	if start {
		w.inflight = true
		w.wg.Add(1)
	}
	w.mu.Unlock()
	if start && !w.cfg.Go(w.run) {
		// Stopping: the final write is Flush's.
		w.mu.Lock()
		w.inflight = false
		w.mu.Unlock()
		w.wg.Done()
	}
}

// Await answers reply once a flushed floor covers stream sequence seq.
func (w *Writer) Await(seq uint64, reply string) {
	w.mu.Lock()
	if w.flushed() >= seq {
		w.mu.Unlock()
		w.host.AnswerAck(reply)
		return
	}
	w.waiters = append(w.waiters, waiter{seq: seq, reply: reply})
	if w.written.Stream >= seq {
		// A floor written lazily covers seq: the writer writes it again, flushed. Otherwise
		// the ack moved the floor past what is written, and Move starts the write.
		w.start()
	} else {
		w.mu.Unlock()
	}
	wake.Poke(w.hurry)
}

// Wanted reports the stream sequence of the floor the writer means to write and whether a
// write is in flight.
func (w *Writer) Wanted() (want uint64, inflight bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.want.Stream, w.inflight
}

// flushed is the stream sequence of the last floor written and flushed. Called with mu held.
func (w *Writer) flushed() uint64 {
	if w.lazy {
		return w.durable
	}
	return w.written.Stream
}

// owed reports whether a double ack waits for a floor that is written but not flushed.
// Called with mu held.
func (w *Writer) owed() bool {
	return w.lazy && slices.ContainsFunc(w.waiters, func(x waiter) bool { return x.seq <= w.written.Stream })
}

// run writes the latest floor until what is written is what is wanted.
func (w *Writer) run() {
	defer w.wg.Done()
	ctx := w.ctx
	for {
		w.mu.Lock()
		f, shown := w.want, w.wantShown
		if (f == w.written && !w.owed()) || ctx.Err() != nil || w.host.Gone() {
			w.inflight = false
			w.mu.Unlock()
			return
		}
		// A stopping consumer writes at once: shutdown waits for it.
		hurried := len(w.waiters) > 0 || w.host.Stopping()
		w.mu.Unlock()
		if !hurried && w.pace(ctx) {
			continue
		}
		w.lastWrite = w.cfg.Clock.Now()
		err := w.write(ctx, f, shown, !hurried)
		if lost := errors.Is(err, pg.ErrNotOwner); lost || (err != nil && ctx.Err() != nil) {
			if lost {
				w.host.Lost()
			}
			w.mu.Lock()
			w.inflight = false
			w.mu.Unlock()
			return
		}
		if err != nil {
			w.cfg.Logger.Warn("cursor write failed", "stream", w.stream, "consumer", w.key.Name, "err", err)
			t := w.cfg.Clock.NewTimer(retryAfter)
			select {
			case <-ctx.Done():
			case <-t.C():
			}
			t.Stop()
			continue
		}
		w.mu.Lock()
		if hurried {
			w.lazy = false
		} else if !w.lazy {
			w.lazy, w.durable = true, w.written.Stream
		}
		w.written = f
		var due []waiter
		kept := w.waiters[:0]
		for _, x := range w.waiters {
			if x.seq <= w.flushed() {
				due = append(due, x)
			} else {
				kept = append(kept, x)
			}
		}
		w.waiters = kept
		w.mu.Unlock()
		for _, x := range due {
			w.host.AnswerAck(x.reply)
		}
	}
}

// pace waits until the interval has passed since the last write, a double ack arrives, the
// consumer stops or ctx ends. It reports whether it waited: the floor may have moved since,
// and the consumer may be gone.
func (w *Writer) pace(ctx context.Context) bool {
	d := w.lastWrite.Add(w.cfg.Interval).Sub(w.cfg.Clock.Now())
	if d <= 0 {
		return false
	}
	t := w.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
	case <-w.hurry:
	case <-w.done:
	case <-ctx.Done():
	}
	return true
}

// write writes floor f with an ack lane permit.
func (w *Writer) write(ctx context.Context, f consumerstate.Pair, shown uint64, lazy bool) error {
	p, err := w.cfg.Lane.Acquire(ctx)
	if err != nil {
		return err
	}
	start := w.cfg.Clock.Now()
	cp := w.params(f, shown)
	cp.Lazy = lazy
	rtt, err := w.cfg.Store.WriteCursor(ctx, cp)
	permit.Return(p, rtt, err)
	w.cfg.Writes.Inc()
	w.cfg.Latency.Observe(w.cfg.Clock.Now().Sub(start).Seconds())
	return err
}

// params is the write that records floor f, shown as stream sequence shown.
func (w *Writer) params(f consumerstate.Pair, shown uint64) pg.CursorParams {
	p := w.key
	p.AckStreamSeq, p.AckConsumerSeq, p.ShownStreamSeq = f.Stream, f.Consumer, shown
	return p
}

// Flush waits for the write in flight and writes a floor still unwritten, so that a
// graceful stop loses no ack. ctx bounds it.
func (w *Writer) Flush(ctx context.Context) {
	done := make(chan struct{})
	// On the engine's group, so that when ctx gives up first the group's Stop still
	// waits for this goroutine. The group stops after Flush; stopped, it has no writer.
	if !w.cfg.Go(func() {
		w.wg.Wait()
		close(done)
	}) {
		close(done)
	}
	select {
	case <-done:
	case <-ctx.Done():
		return
	}
	w.mu.Lock()
	f, shown, written := w.want, w.wantShown, w.written
	w.mu.Unlock()
	if f == written {
		return
	}
	if _, err := w.cfg.Store.WriteCursor(ctx, w.params(f, shown)); err != nil {
		w.cfg.Logger.Warn("final cursor write failed", "stream", w.stream, "consumer", w.key.Name, "err", err)
	}
}
