package stream

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/jetgres/jetgres/bridge/gets"
	"github.com/jetgres/jetgres/bridge/tailcache"
	"github.com/jetgres/jetgres/pg"
)

// eventLog is a subscriber that notes each event with the tail's high-water mark as it
// saw it.
type eventLog struct{ got []string }

func (r *eventLog) OnCommitted(s *Stream, ev Committed) {
	r.got = append(r.got, fmt.Sprintf("committed %d-%d hw %d", ev.First, ev.Last, s.Tail().HighWater()))
}

func (r *eventLog) OnPurged(_ context.Context, s *Stream, ev Purged) {
	r.got = append(r.got, fmt.Sprintf("purged by commit %v, tail starts at %d", ev.ByCommit, s.Tail().Start()))
}

func (r *eventLog) OnRemoved(_ *Stream, ev Removed) {
	r.got = append(r.got, fmt.Sprintf("removed first %d unread %d", ev.First, ev.Unread))
}

func (r *eventLog) OnDropped(*Stream, Dropped) { r.got = append(r.got, "dropped") }

// eventStream is a stream served by no bridge, whose events go to the get index, then
// before, then the tail, then after.
func eventStream(before, after Subscriber) *Stream {
	s := newTestStream()
	s.subscribers = []Subscriber{getSubscriber{}, before, tailSubscriber{}, after}
	return s
}

// newTestStream is a stream with a tail and a get index of the bridge's default sizes.
func newTestStream() *Stream {
	s := &Stream{id: 1, tail: tailcache.New(16<<20, tailcache.NewBudget(256<<20))}
	s.gets = gets.New(nil, 64<<20, nil).Open(s.id, s.tail)
	return s
}

// idle takes every event and does nothing with it.
type idle struct{}

func (idle) OnCommitted(*Stream, Committed)            {}
func (idle) OnPurged(context.Context, *Stream, Purged) {}
func (idle) OnRemoved(*Stream, Removed)                {}
func (idle) OnDropped(*Stream, Dropped)                {}

func committed(first uint64, stored ...uint64) pg.AppendResult {
	r := pg.AppendResult{StreamID: 1, FirstSeq: first}
	for _, seq := range stored {
		r.Stored = append(r.Stored, pg.Message{Seq: seq, Subject: "e.x"})
		r.LastSeq = seq
	}
	return r
}

// A commit reaches the tail between the subscribers before it and those after it. A commit
// whose limits removed messages is announced in two: Purged when the tail held some of them,
// Removed with the highest of them otherwise, then Committed.
func TestCommitEventsInOrder(t *testing.T) {
	before, after := &eventLog{}, &eventLog{}
	s := eventStream(before, after)
	ctx := context.Background()
	s.Commit(ctx, committed(1, 1, 2, 3))
	below := committed(5, 7)
	below.Removed, below.Tombstoned = true, []uint64{6}
	s.Commit(ctx, committed(1, 4, 5, 6))
	s.Tail().Clear()
	s.Commit(ctx, below)
	reaching := committed(5, 8)
	reaching.Removed, reaching.Tombstoned = true, []uint64{7}
	s.Commit(ctx, reaching)
	s.drop()
	want := [][]string{{
		"committed 1-3 hw 0",
		"committed 1-6 hw 3",
		"removed first 5 unread 6",
		"committed 5-7 hw 6",
		"purged by commit true, tail starts at 7",
		"committed 5-8 hw 7",
		"dropped",
	}, {
		"committed 1-3 hw 3",
		"committed 1-6 hw 6",
		"removed first 5 unread 6",
		"committed 5-7 hw 7",
		"purged by commit true, tail starts at 8",
		"committed 5-8 hw 8",
		"dropped",
	}}
	for i, r := range []*eventLog{before, after} {
		if !slices.Equal(r.got, want[i]) {
			t.Errorf("subscriber %d heard\n %q\nwant\n %q", i, r.got, want[i])
		}
	}
}

// Announcing a commit allocates nothing of its own: the flush path's allocations are those
// of what takes the rows.
func TestCommitEventsAllocateNothing(t *testing.T) {
	s := newTestStream()
	s.subscribers = []Subscriber{getSubscriber{}, tailSubscriber{}, idle{}}
	ctx := context.Background()
	const warm, runs = 32, 500
	rs := make([]pg.AppendResult, warm+runs+1)
	for i := range rs {
		rs[i] = committed(1, uint64(i+1))
	}
	// The tail's first blocks and the index's entry are made before counting.
	for _, r := range rs[:warm] {
		s.Commit(ctx, r)
	}
	i := warm
	if n := testing.AllocsPerRun(runs, func() {
		s.Commit(ctx, rs[i])
		i++
	}); n != 0 {
		t.Errorf("%v allocations per commit announced", n)
	}
}
