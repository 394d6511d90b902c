package retention

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	dto "github.com/prometheus/client_model/go"

	"github.com/jetgres/jetgres/pg"
)

var ack = []byte("+ACK")

// wantRetains fails unless the store was asked for exactly these removals since the first
// `from` ones.
func wantRetains(t *testing.T, store *fakeStore, from int, want ...pg.RetainParams) {
	t.Helper()
	store.read(func(f *fakeStore) {
		got := f.retains[min(from, len(f.retains)):]
		if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
			t.Fatalf("retains:\n got  %+v\n want %+v", got, want)
		}
	})
}

func wantEvents(t *testing.T, host *fakeHost, want ...string) {
	t.Helper()
	if got := host.take(); !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
}

func listed(store *fakeStore) (n int) {
	store.read(func(f *fakeStore) { n = f.listed })
	return n
}

var everything = []pg.SeqRange{{From: 0, To: 1<<63 - 1}}

// A pass hands PostgreSQL the acks a consumer this process serves applied above its ack
// floor. It holds back those still pending, says that it did, and leaves out those at or
// below the floor or beyond what the consumer considered. A work queue's tombstones are
// announced as a purge of what every consumer had done with; a moved first sequence as a
// removal. The next pass looks again only where a floor moved.
func TestPassAppliesServedAcksAboveTheFloor(t *testing.T) {
	t.Parallel()
	s := newStream(1, server.WorkQueuePolicy)
	b := setup(t, s)
	noteAcks(b.e)
	b.store.consumers[1] = []pg.Consumer{consumer(t, 1, "w", 2)}
	b.host.serve("w", ConsumerProgress{Floor: 3, Next: 10, Pending: []uint64{6}})
	for _, seq := range []uint64{2, 5, 4, 6, 12, 5} {
		b.e.NoteAck(s, "w", seq, ack)
	}
	b.store.retained = pg.RetainResult{FirstSeq: 4, Removed: 2, Tombstoned: 1, Gone: []uint64{4, 5}}
	if err := b.e.Settle(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	wantRetains(t, b.store, 0, pg.RetainParams{StreamID: 1, WorkQueue: true,
		Consumers: []pg.RetainConsumer{{Floor: 3, Acked: []uint64{4, 5}}}, Recheck: everything})
	wantEvents(t, b.host, "purged S1 first=4 consumed=true")

	// 6 was pending: the pass is due again until the consumer has applied it.
	b.host.serve("w", ConsumerProgress{Floor: 6, Next: 10})
	b.store.retained = pg.RetainResult{FirstSeq: 7, Removed: 1}
	if err := b.e.Settle(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	wantRetains(t, b.store, 1, pg.RetainParams{StreamID: 1, WorkQueue: true,
		Consumers: []pg.RetainConsumer{{Floor: 6}}, Recheck: []pg.SeqRange{{From: 4, To: 6}}})
	wantEvents(t, b.host, "removed S1 first=7")

	n := listed(b.store)
	if err := b.e.Settle(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	if listed(b.store) != n {
		t.Fatal("a settle with nothing due ran a pass")
	}
}

// Consumers that other replicas serve count with the ack floor PostgreSQL holds, and their
// filters decide which publishes to an interest stream are wanted from that pass on; the
// consumers this process serves count at once.
func TestPassTakesOtherReplicasConsumersFromTheStore(t *testing.T) {
	t.Parallel()
	s := newStream(2, server.InterestPolicy)
	b := setup(t, s)
	noteAcks(b.e)
	b.store.consumers[2] = []pg.Consumer{consumer(t, 2, "remote", 5, "a.*"), consumer(t, 2, "local", 1, "b")}
	b.host.serve("local", ConsumerProgress{Floor: 4, Next: 9})
	b.host.local = [][]string{{"b"}}
	subjects := []string{"a.x", "b", "c"}
	if got := b.e.NoInterest(s, subjects); !slices.Equal(got, []bool{true, false, true}) {
		t.Fatalf("before a pass: no interest %v", got)
	}

	b.e.NoteAck(s, "remote", 7, ack)
	if err := b.e.Settle(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	wantRetains(t, b.store, 0, pg.RetainParams{StreamID: 2, Consumers: []pg.RetainConsumer{
		{Floor: 5, Filters: []string{"a.*"}}, {Floor: 4, Filters: []string{"b"}}}, Recheck: everything})
	wantEvents(t, b.host)
	if got := b.e.NoInterest(s, subjects); !slices.Equal(got, []bool{false, false, true}) {
		t.Fatalf("after a pass: no interest %v", got)
	}
	b.host.local = nil
	if got := b.e.NoInterest(s, subjects); !slices.Equal(got, []bool{false, true, true}) {
		t.Fatalf("without local consumers: no interest %v", got)
	}
}

// Only acks that settle a message, seen while the engine runs, make a pass due; so do
// consumers that came, went or changed. A limits stream never has one.
func TestSettleRunsAPassOnlyWhenDue(t *testing.T) {
	t.Parallel()
	s := newStream(3, server.InterestPolicy)
	lim := newStream(4, server.LimitsPolicy)
	b := setup(t, s, lim)
	b.store.consumers[3] = []pg.Consumer{consumer(t, 3, "c", 0)}
	settle := func(step string, passes int) {
		t.Helper()
		for _, st := range []*fakeStream{s, lim} {
			if err := b.e.Settle(t.Context(), st); err != nil {
				t.Fatal(err)
			}
		}
		if n := listed(b.store); n != passes {
			t.Fatalf("%s: %d passes, want %d", step, n, passes)
		}
		var m dto.Metric
		if err := b.e.passes.Write(&m); err != nil {
			t.Fatal(err)
		}
		if n := m.GetCounter().GetValue(); n != float64(passes) {
			t.Fatalf("%s: the passes counter says %v, want %d", step, n, passes)
		}
	}

	b.e.NoteAck(s, "c", 1, ack)
	settle("an ack before Start", 0)
	noteAcks(b.e)
	settle("started", 0)
	for _, body := range []string{"-NAK", "+WPI", "?"} {
		b.e.NoteAck(s, "c", 1, []byte(body))
	}
	b.e.NoteAck(lim, "c", 1, ack)
	settle("acks that settle nothing", 0)
	b.e.NoteAck(s, "c", 1, []byte("+TERM"))
	settle("a term", 1)
	settle("nothing since", 1)
	b.e.Stale(s)
	b.e.Stale(lim)
	settle("consumers changed", 2)
	b.e.Stop()
	b.e.Stale(s)
	settle("stopped", 2)
}

// A consumer's deletion makes a pass due, and tells PostgreSQL when an interest stream
// may have lost its last consumer.
func TestConsumerDeletedMarksInterestGone(t *testing.T) {
	t.Parallel()
	in := newStream(5, server.InterestPolicy)
	wq := newStream(6, server.WorkQueuePolicy)
	b := setup(t, in, wq)
	noteAcks(b.e)
	b.e.ConsumerDeleted(t.Context(), in)
	b.e.ConsumerDeleted(t.Context(), wq)
	b.store.read(func(f *fakeStore) {
		if !slices.Equal(f.interestGone, []int64{5}) {
			t.Fatalf("interest gone for %v, want [5]", f.interestGone)
		}
	})
	for _, s := range []*fakeStream{in, wq} {
		if err := b.e.Settle(t.Context(), s); err != nil {
			t.Fatal(err)
		}
	}
	if n := listed(b.store); n != 2 {
		t.Fatalf("%d passes after the deletions, want 2", n)
	}
}

// A pass that finds the consumers as the last one left them, their floors unmoved, asks
// PostgreSQL for nothing; after a change of retention policy it looks at every message.
func TestPolicyChangedRechecksEveryMessage(t *testing.T) {
	t.Parallel()
	s := newStream(7, server.InterestPolicy)
	b := setup(t, s)
	noteAcks(b.e)
	b.store.consumers[7] = []pg.Consumer{consumer(t, 7, "c", 3)}
	pass := func() {
		t.Helper()
		b.e.Stale(s)
		if err := b.e.Settle(t.Context(), s); err != nil {
			t.Fatal(err)
		}
	}
	pass()
	pass()
	b.e.PolicyChanged(s)
	pass()
	same := pg.RetainParams{StreamID: 7, Consumers: []pg.RetainConsumer{{Floor: 3}}, Recheck: everything}
	wantRetains(t, b.store, 0, same, same)

	b.store.consumers[7] = append(b.store.consumers[7], consumer(t, 7, "d", 0, "x"))
	pass()
	wantRetains(t, b.store, 2, pg.RetainParams{StreamID: 7,
		Consumers: []pg.RetainConsumer{{Floor: 3}, {Floor: 0, Filters: []string{"x"}}}, Recheck: everything})
}

// A pass that cannot read the consumers, or whose removal fails, reports it and leaves the
// pass due.
func TestFailedPassStaysDue(t *testing.T) {
	t.Parallel()
	s := newStream(8, server.WorkQueuePolicy)
	b := setup(t, s)
	noteAcks(b.e)
	b.store.consumers[8] = []pg.Consumer{consumer(t, 8, "w", 0)}
	b.host.serve("w", ConsumerProgress{Floor: 0, Next: 5})
	b.e.NoteAck(s, "w", 2, ack)
	down := errors.New("database away")
	b.store.err = down
	if err := b.e.Settle(t.Context(), s); !errors.Is(err, down) {
		t.Fatalf("settle: %v, want the store's error", err)
	}
	b.store.err = nil
	if err := b.e.Settle(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	wantRetains(t, b.store, 0, pg.RetainParams{StreamID: 8, WorkQueue: true,
		Consumers: []pg.RetainConsumer{{Floor: 0, Acked: []uint64{2}}}, Recheck: everything})
}

// nats-server's rules for the consumers of a work queue: one unfiltered consumer alone, and
// no two filters that can match one subject; an update checks only the collisions.
func TestWorkQueueConflict(t *testing.T) {
	t.Parallel()
	wq := newStream(9, server.WorkQueuePolicy)
	open := newStream(10, server.WorkQueuePolicy)
	in := newStream(11, server.InterestPolicy)
	b := setup(t, wq, open, in)
	noteAcks(b.e)
	b.store.consumers[9] = []pg.Consumer{consumer(t, 9, "a", 0, "q.a.*"), consumer(t, 9, "b", 0, "q.b")}
	b.store.consumers[10] = []pg.Consumer{consumer(t, 10, "all", 0)}
	b.store.consumers[11] = []pg.Consumer{consumer(t, 11, "all", 0)}
	unfiltered := server.NewJSConsumerWQMultipleUnfilteredError().ErrCode
	notUnique := server.NewJSConsumerWQConsumerNotUniqueError().ErrCode
	for _, c := range []struct {
		s       *fakeStream
		name    string
		filters []string
		want    uint16
	}{
		{wq, "all", nil, unfiltered},
		{wq, "a2", []string{"q.a.1"}, notUnique},
		{wq, "wide", []string{"q.>"}, notUnique},
		{wq, "c", []string{"q.c"}, 0},
		{wq, "a", []string{"q.a.*", "q.d"}, 0},
		{wq, "a", []string{"q.b"}, notUnique},
		{wq, "a", nil, 0},
		{open, "x", []string{"q.x"}, notUnique},
		{open, "all", []string{"q.x"}, 0},
		{in, "all2", nil, 0},
	} {
		refused, err := b.e.WorkQueueConflict(t.Context(), c.s, c.name, &server.ConsumerConfig{Durable: c.name, FilterSubjects: c.filters})
		if err != nil {
			t.Fatal(err)
		}
		var got uint16
		if refused != nil {
			got = refused.ErrCode
		}
		if got != c.want {
			t.Errorf("%s: consumer %s filters %q: err_code %d, want %d", c.s.Name(), c.name, c.filters, got, c.want)
		}
	}

	b.store.consumers[9] = append(b.store.consumers[9], pg.Consumer{StreamID: 9, Name: "bad", Config: []byte("{")})
	refused, err := b.e.WorkQueueConflict(t.Context(), wq, "d", &server.ConsumerConfig{Durable: "d", FilterSubject: "q.d"})
	if err != nil || refused == nil || refused.ErrCode != server.NewJSConsumerCreateError(errors.New("")).ErrCode {
		t.Fatalf("a stored config that does not decode: %v, %v", refused, err)
	}
	down := errors.New("database away")
	b.store.err = down
	if _, err := b.e.WorkQueueConflict(t.Context(), wq, "d", &server.ConsumerConfig{Durable: "d"}); !errors.Is(err, down) {
		t.Fatalf("listing the consumers failed: %v, want the store's error", err)
	}
}

// Lowered limits and max_age apply to what a stream holds, and readers hear of it when
// something went.
func TestApplyLimits(t *testing.T) {
	t.Parallel()
	s := newStream(12, server.LimitsPolicy)
	b := setup(t, s)
	noteAcks(b.e)
	lim := pg.Limits{MaxMsgs: 5, DiscardNew: true}
	if err := b.e.ApplyLimits(t.Context(), s, lim, 0); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, b.host)
	b.store.enforced = 2
	if err := b.e.ApplyLimits(t.Context(), s, lim, time.Minute); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, b.host, "purged S12 first=0 consumed=false")
	b.store.enforced, b.store.expired = 0, 3
	if err := b.e.ApplyLimits(t.Context(), s, lim, time.Minute); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, b.host, "purged S12 first=0 consumed=false")
	b.store.read(func(f *fakeStore) {
		if !slices.Equal(f.limits, []pg.Limits{lim, lim, lim}) {
			t.Fatalf("limits enforced %+v", f.limits)
		}
		at := b.clock.Now().Add(-time.Minute).UnixNano()
		if !slices.Equal(f.expiries, []cutoff{{12, at}, {12, at}}) {
			t.Fatalf("expiries %v, want two before %d", f.expiries, at)
		}
	})
	down := errors.New("database away")
	b.store.err = down
	if err := b.e.ApplyLimits(t.Context(), s, lim, 0); !errors.Is(err, down) {
		t.Fatalf("apply limits: %v, want the store's error", err)
	}
}

// The state of a stream that is gone goes at the maintainer's next look; the others stay.
func TestForgetDropsTheStateOfStreamsGone(t *testing.T) {
	t.Parallel()
	keep := newStream(13, server.WorkQueuePolicy)
	gone := newStream(14, server.WorkQueuePolicy)
	b := setup(t, keep, gone)
	noteAcks(b.e)
	b.e.NoteAck(keep, "c", 1, ack)
	b.e.NoteAck(gone, "c", 1, ack)
	b.host.setStreams(keep)
	b.e.forget()
	b.e.mu.Lock()
	defer b.e.mu.Unlock()
	if _, ok := b.e.states[13]; !ok || len(b.e.states) != 1 {
		t.Fatalf("states of streams %v, want 13 alone", slices.Sorted(maps.Keys(b.e.states)))
	}
}
