package tailcache

import (
	"slices"
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
	budget := &Budget{max: int64(25 * msgSize)}
	tails := []*Tail{New(10*msgSize, budget), New(10*msgSize, budget), New(10*msgSize, budget)}
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
			tl.Add(tailMsgs(next[i]+1, 3, 100), next[i]+1, next[i]+3)
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
	if got, _, found, ok := last.Next(next[2], all); !ok || !found || got.Seq != next[2] {
		t.Errorf("newest message of a busy tail not served: %d %v %v", got.Seq, found, ok)
	}
	for _, tl := range tails {
		tl.Clear()
	}
	if used := budget.used.Load(); used != 0 {
		t.Errorf("%d bytes counted after every tail was cleared", used)
	}
}

// A tail holds its messages in blocks. Reads and gets from any sequence, over block
// boundaries, gaps (messages that were not live) and evictions, find exactly the next
// cached message from there on.
func TestTailReadsAcrossBlocks(t *testing.T) {
	msgSize := int((&pg.Message{Subject: "s", Data: make([]byte, 10)}).Size())
	tl := New(3000*msgSize, &Budget{max: 1 << 40})
	var model []uint64
	seq := uint64(0)
	for round := range 12 {
		var batch []pg.Message
		from := seq + 1
		for range 700 {
			seq++
			if seq%7 == 3 || (round == 5 && seq%2 == 0) {
				continue // not live: never cached
			}
			batch = append(batch, pg.Message{Seq: seq, Subject: "s", Data: make([]byte, 10)})
			model = append(model, seq)
		}
		tl.Add(batch, from, seq)
		// The cache keeps the newest 3000 messages.
		model = model[max(len(model)-3000, 0):]
		check := func(from uint64) {
			t.Helper()
			i, _ := slices.BinarySearch(model, from)
			m, through, found, ok := tl.Next(from, all)
			if !ok {
				t.Fatalf("round %d: read from %d missed the cache covering [%d, %d]", round, from, tl.from, tl.through)
			}
			if i < len(model) {
				if !found || m.Seq != model[i] || through != model[i] {
					t.Fatalf("round %d: next from %d: %d (found %v) through %d, want %d", round, from, m.Seq, found, through, model[i])
				}
			} else if found || through != seq {
				t.Fatalf("round %d: next from %d: %d (found %v) through %d, want nothing through %d", round, from, m.Seq, found, through, seq)
			}
			got, live, covered := tl.Get(from)
			if wantLive := i < len(model) && model[i] == from; !covered || live != wantLive || (live && got.Seq != from) {
				t.Fatalf("round %d: get %d: %d live %v covered %v", round, from, got.Seq, live, covered)
			}
		}
		for _, at := range []uint64{tl.from, tl.from + 1, model[0], model[len(model)/2], model[len(model)-1], seq} {
			check(at)
		}
		for k := 0; k < len(model); k += 97 {
			check(model[k])
			check(model[k] + 1)
		}
	}
	if _, _, _, ok := tl.Next(tl.from-1, all); ok {
		t.Fatal("a read below the cache hit it")
	}
}

func all(string) bool { return true }

// A tail too small for one message evicts each as it comes: its only block, first and
// last at once, goes, and the next message starts a new one.
func TestTailEvictsItsOnlyBlock(t *testing.T) {
	msgSize := int((&pg.Message{Subject: "s", Data: make([]byte, 10)}).Size())
	budget := &Budget{max: 1 << 40}
	tl := New(msgSize/2, budget)
	for seq := uint64(1); seq <= 3; seq++ {
		tl.Add([]pg.Message{{Seq: seq, Subject: "s", Data: make([]byte, 10)}}, seq, seq)
		if len(tl.blocks) != 0 || tl.head != 0 || tl.bytes != 0 || budget.used.Load() != 0 {
			t.Fatalf("after %d: %d blocks, head %d, %d bytes, %d counted", seq, len(tl.blocks), tl.head, tl.bytes, budget.used.Load())
		}
		if _, _, _, ok := tl.Next(seq, all); ok {
			t.Fatalf("after %d: an evicted message is served", seq)
		}
	}
	tl.max = 10 * msgSize
	tl.Add([]pg.Message{{Seq: 4, Subject: "s", Data: make([]byte, 10)}}, 4, 4)
	if m, _, found, ok := tl.Next(4, all); !ok || !found || m.Seq != 4 {
		t.Fatalf("message 4 not served after the cache emptied: %d %v %v", m.Seq, found, ok)
	}
}

// A tail starts once: at the high-water mark a reader found, or at the first range it
// takes, and neither moves it afterwards. Before, it covers nothing and knows no commit.
func TestTailStartsOnce(t *testing.T) {
	budget := &Budget{max: 1 << 40}
	msgs := tailMsgs(41, 2, 10)

	read := New(1<<20, budget)
	if read.Started() || read.HighWater() != 0 {
		t.Fatalf("a new tail started at %d", read.HighWater())
	}
	if _, _, covered := read.Get(1); covered {
		t.Fatal("a tail that has not started covers sequence 1")
	}
	read.StartAfter(30)
	read.StartAfter(20)
	if !read.Started() || read.Start() != 31 || read.HighWater() != 30 {
		t.Fatalf("started after 30 then 20: starts at %d, high-water mark %d", read.Start(), read.HighWater())
	}
	if from, upTo, ok := read.Missing(); ok {
		t.Fatalf("a tail started at the high-water mark misses [%d, %d]", from, upTo)
	}

	committed := New(1<<20, budget)
	committed.Add(msgs, 41, 42)
	committed.StartAfter(10)
	if committed.Start() != 41 || committed.HighWater() != 42 {
		t.Fatalf("started by a commit of 41-42, then after 10: starts at %d, high-water mark %d", committed.Start(), committed.HighWater())
	}
	if m, live, covered := committed.Get(42); !covered || !live || m.Seq != 42 {
		t.Fatalf("get 42: %d live %v covered %v", m.Seq, live, covered)
	}
}

// After a rewind to an earlier high-water mark, the tail holds none of the messages past
// it, and takes the new messages that the database gives their sequences.
func TestTailRewind(t *testing.T) {
	budget := &Budget{max: 1 << 20}
	tl := New(1<<20, budget)
	tl.Add(tailMsgs(1, 10, 10), 1, 10)
	tl.Rewind(6)
	if hw := tl.HighWater(); hw != 6 {
		t.Fatalf("high-water mark after the rewind: %d, want 6", hw)
	}
	if _, _, covered := tl.Get(7); covered {
		t.Fatal("the tail still covers a sequence past the rewind")
	}
	if budget.Used() != 0 {
		t.Fatalf("the rewound tail holds %d bytes of the shared bound", budget.Used())
	}
	again := tailMsgs(7, 3, 20)
	tl.Add(again, 7, 9)
	m, live, covered := tl.Get(7)
	if !covered || !live || len(m.Data) != 20 {
		t.Fatalf("sequence 7 after the rewind: %+v live %v covered %v, want the new message", m, live, covered)
	}
	if hw := tl.HighWater(); hw != 9 {
		t.Fatalf("high-water mark: %d, want 9", hw)
	}
}
