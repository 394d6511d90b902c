package stream

import "testing"

// A pooled slice is never more than four times what was asked for, whatever larger slices
// busy streams gave back: a stream with one message waiting holds a small one.
func TestSlicePoolSizes(t *testing.T) {
	var sp slicePool[publish]
	for _, c := range []int{8, 100, 1000, 8192, 12000} {
		sp.put(make([]publish, c))
	}
	if b := sp.grow(nil); cap(b) != 8 || len(b) != 0 {
		t.Fatalf("first slice of an intake: len %d cap %d, want 0 and 8", len(b), cap(b))
	}
	for _, n := range []int{1, 8, 9, 100, 1000, 4097, 8192} {
		sp.put(make([]publish, 3*n)) // larger than asked for, but within the class above
		b := sp.get(n)
		if len(b) != n || cap(b) < n || cap(b) > max(4*n, 8) {
			t.Fatalf("get(%d): len %d cap %d", n, len(b), cap(b))
		}
	}
	b := []publish{{reply: "a"}, {reply: "b"}}
	g := sp.grow(b)
	if len(g) != 2 || cap(g) < 4 || g[0].reply != "a" || g[1].reply != "b" {
		t.Fatalf("grow kept %v, cap %d", g, cap(g))
	}
}
