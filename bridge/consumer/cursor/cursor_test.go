package cursor_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/bridge/consumer/cursor"
	"github.com/jetgres/jetgres/bridge/consumerstate"
	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// fakeConsumer is the consumer side of a writer: the answers it sends, and whether it was lost.
type fakeConsumer struct {
	mu      sync.Mutex
	answers []string
	lost    atomic.Bool
}

func (h *fakeConsumer) AnswerAck(reply string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.answers = append(h.answers, reply)
}
func (h *fakeConsumer) Stopping() bool { return false }
func (h *fakeConsumer) Gone() bool     { return h.lost.Load() }
func (h *fakeConsumer) Lost()          { h.lost.Store(true) }

func (h *fakeConsumer) answered() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.answers...)
}

// A floor that moves is written at once, then no more than once an interval; a double
// ack is answered once a flushed write covers it; a write that finds another owner stops
// the consumer.
func TestWriterPacesFlushesForDoubleAcksAndNoticesLoss(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db := pgtest.Open(t)
	st, err := db.CreateStream(ctx, "S", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	row, err := db.CreateConsumer(ctx, pg.Consumer{StreamID: st.ID, Name: "C", Config: []byte(`{}`), Owner: "r1"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktest.At(time.Unix(1_700_000_000, 0))
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	const interval = 50 * time.Millisecond
	cfg := &cursor.WriterConfig{Store: db, Lane: flow.NewFixed("ack", 1), Clock: clk, Interval: interval,
		Logger: slog.New(slog.DiscardHandler),
		Go: func(f func()) bool {
			wg.Add(1)
			go func() { defer wg.Done(); f() }()
			return true
		},
		Writes:  prometheus.NewCounter(prometheus.CounterOpts{Name: "writes"}),
		Latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "latency"})}
	h := &fakeConsumer{}
	w := cursor.NewWriter(ctx, cfg, h, make(chan struct{}), "S", pg.CursorParams{StreamID: st.ID, Name: "C", Created: row.Created, Owner: "r1"})
	floorIs := func(want uint64) func() error {
		return func() error {
			got, err := db.GetConsumer(ctx, st.ID, "C")
			if err != nil {
				return err
			}
			if got.AckStreamSeq != want {
				return fmt.Errorf("stored floor %d, want %d", got.AckStreamSeq, want)
			}
			return nil
		}
	}

	w.Move(consumerstate.Pair{Consumer: 1, Stream: 1}, 0)
	testwait.For(t, 5*time.Second, floorIs(1))
	w.Move(consumerstate.Pair{Consumer: 2, Stream: 2}, 0)
	testwait.For(t, 5*time.Second, func() error {
		if !clk.TimerDueIn(interval) {
			return fmt.Errorf("the second write does not wait out the interval")
		}
		return nil
	})
	if err := floorIs(1)(); err != nil {
		t.Fatalf("written before the interval passed: %v", err)
	}
	clk.Advance(interval)
	testwait.For(t, 5*time.Second, floorIs(2))

	// Both writes were lazy: the double ack waits for a flushed one, made at once.
	w.Await(2, "reply.2")
	testwait.For(t, 5*time.Second, func() error {
		if got := h.answered(); len(got) != 1 || got[0] != "reply.2" {
			return fmt.Errorf("answers %q, want reply.2", got)
		}
		return nil
	})
	if want, inflight := w.Wanted(); want != 2 {
		t.Fatalf("Wanted = %d, %v; want 2", want, inflight)
	}

	if _, _, err := db.SetOwner(ctx, row.ID, "r2"); err != nil {
		t.Fatal(err)
	}
	w.Move(consumerstate.Pair{Consumer: 3, Stream: 3}, 0)
	testwait.For(t, 5*time.Second, func() error {
		if clk.TimerDueIn(interval) {
			clk.Advance(interval)
		}
		if !h.lost.Load() {
			return fmt.Errorf("a write under another owner did not lose the consumer")
		}
		return nil
	})
	if err := floorIs(2)(); err != nil {
		t.Fatalf("a write under another owner landed: %v", err)
	}
}
