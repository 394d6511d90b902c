package readahead

import (
	"errors"
	"testing"

	"github.com/jetgres/jetgres/pg"
)

func msgs(seqs ...uint64) []pg.Message {
	out := make([]pg.Message, len(seqs))
	for i, s := range seqs {
		out[i] = pg.Message{Seq: s, Data: make([]byte, 100)}
	}
	return out
}

// TestChainedReads takes two reads in flight in order, and throws the second away when
// the first was cut short of where the second starts.
func TestChainedReads(t *testing.T) {
	b := New(4, 1<<20)
	b.Reset(1, 4, msgs(1, 2, 3, 4))
	if b.Span() != 3 { // 4 sequences held 4 messages, the limit: 4 × 0.875
		t.Fatalf("span %d, want 3", b.Span())
	}
	r1 := b.Begin(b.NextFrom(), 7)
	r2 := b.Begin(b.NextFrom(), 10)
	if r1.From != 5 || r2.From != 8 || b.InFlight() != 2 {
		t.Fatalf("reads from %d and %d, %d in flight", r1.From, r2.From, b.InFlight())
	}
	r1.Finish(msgs(5, 7), 7, nil)
	r2.Finish(msgs(9), 10, nil)
	if ok, err := b.Take(); !ok || err != nil || b.UpTo != 7 || len(b.Msgs) != 6 {
		t.Fatalf("take 1: %t %v, up to %d, %d held", ok, err, b.UpTo, len(b.Msgs))
	}
	if ok, _ := b.Take(); !ok || b.UpTo != 10 {
		t.Fatalf("take 2: %t, up to %d", ok, b.UpTo)
	}
	if m, ok := b.Find(7); !ok || m.Seq != 7 {
		t.Fatalf("find 7: %t", ok)
	}
	if _, ok := b.Find(6); ok {
		t.Fatal("found 6, which no read returned")
	}

	r3 := b.Begin(b.NextFrom(), 13)
	r4 := b.Begin(b.NextFrom(), 16)
	r3.Finish(msgs(11, 12), 12, nil) // cut short at 12: r4 starts at 14
	r4.Finish(msgs(14), 16, nil)
	if ok, _ := b.Take(); !ok || b.UpTo != 12 {
		t.Fatalf("take 3: %t, up to %d", ok, b.UpTo)
	}
	if ok, err := b.Take(); ok || err != nil || b.InFlight() != 0 {
		t.Fatalf("a read past a gap was taken: %t %v, %d in flight", ok, err, b.InFlight())
	}
}

// TestFailedAndDroppedReads reports a failed read's error once, and none for a read
// thrown away by Drop.
func TestFailedAndDroppedReads(t *testing.T) {
	b := New(4, 1<<20)
	b.Reset(1, 2, msgs(1, 2))
	boom := errors.New("boom")
	r := b.Begin(b.NextFrom(), 6)
	b.Begin(7, 9).Finish(nil, 9, nil)
	r.Finish(nil, 0, boom)
	if ok, err := b.Take(); ok || !errors.Is(err, boom) || b.InFlight() != 0 {
		t.Fatalf("failed read: %t %v, %d in flight", ok, err, b.InFlight())
	}
	r = b.Begin(b.NextFrom(), 6)
	b.Drop()
	if b.InFlight() != 0 || b.UpTo != 0 || b.Msgs != nil {
		t.Fatal("drop kept something")
	}
	stale := b.Begin(1, 4) // begun after the drop: current
	r.Finish(nil, 0, boom)
	stale.Finish(msgs(1), 4, nil)
	if ok, err := b.Take(); !ok || err != nil {
		t.Fatalf("read after drop: %t %v", ok, err)
	}
}
