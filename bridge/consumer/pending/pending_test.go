package pending

import (
	"errors"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
)

func msgs(subject string, seqs ...uint64) []pg.Message {
	out := make([]pg.Message, len(seqs))
	for i, s := range seqs {
		out[i] = pg.Message{Seq: s, Subject: subject}
	}
	return out
}

func matchA(subject string) bool { return subject == "a" }

// A row seen twice, by its commit and by a tick's range read, counts once; a read that
// starts past what was counted reports the gap.
func TestAddCountsEachRowOnce(t *testing.T) {
	var tr Tracker
	tr.Begin(1, 10)
	if n, gap := tr.Add(msgs("a", 11, 12), 11, matchA); n != 2 || gap {
		t.Fatalf("Add(11, 12) = %d, %v; want 2, false", n, gap)
	}
	if n, gap := tr.Add(msgs("a", 12, 13), 12, matchA); n != 1 || gap {
		t.Fatalf("Add(12, 13) = %d, %v; want 1, false", n, gap)
	}
	if n, _ := tr.Add(msgs("b", 14), 14, matchA); n != 0 {
		t.Fatalf("a row of another subject counted %d", n)
	}
	if _, gap := tr.Add(msgs("a", 20), 20, matchA); !gap {
		t.Fatal("rows 15..19 were never counted, yet no gap was reported")
	}
	if got := tr.Take(); got != 4 {
		t.Fatalf("Take = %d, want 4", got)
	}
	if got := tr.Peek(); got != 0 {
		t.Fatalf("Peek after Take = %d, want 0", got)
	}
}

// A delivery seen before its commit counted it claims it: the commit then does not count it.
func TestClaimKeepsTheCommitFromCountingADelivery(t *testing.T) {
	var tr Tracker
	tr.Begin(1, 10)
	tr.Add(msgs("a", 11), 11, matchA)
	added, uncounted := tr.Claim(12)
	if added != 1 || !uncounted {
		t.Fatalf("Claim(12) = %d, %v; want 1, true", added, uncounted)
	}
	if n, _ := tr.Add(msgs("a", 12), 12, matchA); n != 0 {
		t.Fatalf("the commit of a claimed delivery counted %d", n)
	}
	if _, uncounted := tr.Claim(11); uncounted {
		t.Fatal("a counted row was claimed as uncounted")
	}
}

// Removals below where the last count began leave it fresh; others make it stale until a
// recount, which an expensive recount spaces out and a failed one retries.
func TestStalenessAndRecountSpacing(t *testing.T) {
	var tr Tracker
	tr.Begin(100, 200)
	if tr.MarkStale(99) || tr.Stale() {
		t.Fatal("a removal below the count made it stale")
	}
	if !tr.MarkStale(150) || !tr.Stale() {
		t.Fatal("a removal inside the count did not make it stale")
	}
	now := time.Unix(1_700_000_000, 0)
	if through := tr.Restart(); through != 200 || tr.Stale() {
		t.Fatalf("Restart = %d, stale %v; want 200, false", through, tr.Stale())
	}
	tr.Recounted(now, 10*time.Millisecond, nil, time.Time{})
	tr.SetStale()
	if tr.RecountDue(now.Add(49 * time.Millisecond)) {
		t.Fatal("a recount that took 10ms may be redone before 5x its duration")
	}
	if got := tr.RecountWake(); !got.Equal(now.Add(50 * time.Millisecond)) {
		t.Fatalf("RecountWake = %v, want start+50ms", got)
	}
	tr.Restart()
	if !tr.RecountWake().IsZero() {
		t.Fatal("a fresh count asks to be woken")
	}
	retry := now.Add(time.Second)
	tr.Recounted(now, time.Millisecond, errors.New("down"), retry)
	if !tr.Stale() || tr.RecountDue(retry.Add(-time.Nanosecond)) || !tr.RecountDue(retry) {
		t.Fatal("a failed recount is not retried at its retry time")
	}
}
