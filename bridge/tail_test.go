package bridge

import (
	"testing"

	"github.com/jetgres/jetgres/pg"
)

func tailMsgs(from, n uint64, size int) []pg.Message {
	out := make([]pg.Message, 0, n)
	for seq := from; seq < from+n; seq++ {
		out = append(out, pg.Message{Seq: seq, Subject: "s", Data: make([]byte, size)})
	}
	return out
}

// Three streams' caches share one bound. Each stays within its own, the sum within the
// shared one whatever order they grow in, and a cleared cache gives its bytes back.
func TestTailsShareOneBound(t *testing.T) {
	msgSize := int((&pg.Message{Subject: "s", Data: make([]byte, 100)}).Size())
	budget := &tailBudget{max: int64(25 * msgSize)}
	tails := []*tail{newTail(10*msgSize, budget, 0), newTail(10*msgSize, budget, 0), newTail(10*msgSize, budget, 0)}
	next := make([]uint64, len(tails))
	sum := func() int {
		n := 0
		for _, tl := range tails {
			n += tl.bytes
		}
		return n
	}
	for round := range 12 {
		for i, tl := range tails {
			if round > 6 && i == 0 {
				continue // the first stream goes quiet and keeps what it has
			}
			tl.add(tailMsgs(next[i]+1, 3, 100), next[i]+1, next[i]+3)
			next[i] += 3
			if tl.bytes > tl.max {
				t.Fatalf("round %d: tail %d holds %d bytes, above its own bound %d", round, i, tl.bytes, tl.max)
			}
			if got, used := sum(), budget.used.Load(); int64(got) != used || used > budget.max {
				t.Fatalf("round %d: tails hold %d bytes, counted %d, bound %d", round, got, used, budget.max)
			}
		}
	}
	if budget.evicted.Load() == 0 {
		t.Error("no eviction counted against the shared bound")
	}
	// The newest messages are the ones kept, and reads still find them.
	last := tails[2]
	if got, _, ok := last.read(next[2], 1, func(string) bool { return true }); !ok || len(got) != 1 || got[0].Seq != next[2] {
		t.Errorf("newest message of a busy tail not served: %v %v", got, ok)
	}
	for _, tl := range tails {
		tl.clear()
	}
	if used := budget.used.Load(); used != 0 {
		t.Errorf("%d bytes counted after every tail was cleared", used)
	}
}
