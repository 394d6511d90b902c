package consumerstate

import (
	"cmp"
	"container/heap"
	"slices"
)

// fifo is a queue that pops from the front without moving what follows; it moves the rest
// down once the popped part is as large, so it costs O(1) per item, amortised.
type fifo[T any] struct {
	items []T
	head  int
}

func (f *fifo[T]) len() int { return len(f.items) - f.head }

func (f *fifo[T]) all() []T { return f.items[f.head:] }

func (f *fifo[T]) push(x T) { f.items = append(f.items, x) }

func (f *fifo[T]) front() (T, bool) {
	if f.head == len(f.items) {
		var zero T
		return zero, false
	}
	return f.items[f.head], true
}

func (f *fifo[T]) back() (T, bool) {
	if f.head == len(f.items) {
		var zero T
		return zero, false
	}
	return f.items[len(f.items)-1], true
}

func (f *fifo[T]) pop() {
	var zero T
	f.items[f.head] = zero
	f.head++
	switch {
	case f.head == len(f.items):
		f.items, f.head = f.items[:0], 0
	case f.head >= 1024 && 2*f.head >= len(f.items):
		n := copy(f.items, f.items[f.head:])
		f.items, f.head = f.items[:n], 0
	}
}

// keep drops every item for which ok is false, keeping the order of the rest.
func (f *fifo[T]) keep(ok func(T) bool) {
	n := 0
	for _, x := range f.items[f.head:] {
		if ok(x) {
			f.items[n] = x
			n++
		}
	}
	clear(f.items[n:])
	f.items, f.head = f.items[:n], 0
}

// seqQueue holds stream sequences in ascending order. First deliveries go out in stream
// order, so they append at the back; anything else is inserted in place, at the cost of a
// copy.
type seqQueue struct{ fifo[uint64] }

func (q *seqQueue) insert(seq uint64) {
	if last, ok := q.back(); !ok || last < seq {
		q.push(seq)
		return
	}
	i, found := slices.BinarySearch(q.all(), seq)
	if !found {
		q.items = slices.Insert(q.items, q.head+i, seq)
	}
}

// deadline is when the delivery of stream sequence seq expires.
type deadline struct {
	at  int64 // unix ns
	seq uint64
}

// compare orders deadlines earliest first, lower sequence first at a tie.
func (d deadline) compare(o deadline) int {
	return cmp.Or(cmp.Compare(d.at, o.at), cmp.Compare(d.seq, o.seq))
}

func (d deadline) before(o deadline) bool { return d.compare(o) < 0 }

// deadlineQueue gives deadlines back earliest first. Those set in time order with one ack
// wait, the common case, arrive in order and wait in a fifo; the others (naks with a delay,
// backoff) go to a heap.
type deadlineQueue struct {
	inOrder fifo[deadline]
	rest    deadlineHeap
}

func (q *deadlineQueue) len() int { return q.inOrder.len() + len(q.rest) }

func (q *deadlineQueue) push(d deadline) {
	if last, ok := q.inOrder.back(); !ok || !d.before(last) {
		q.inOrder.push(d)
		return
	}
	heap.Push(&q.rest, d)
}

// first is the earliest deadline, if any, and whether it is the heap's.
func (q *deadlineQueue) first() (d deadline, inHeap, ok bool) {
	d, ok = q.inOrder.front()
	if len(q.rest) > 0 && (!ok || q.rest[0].before(d)) {
		return q.rest[0], true, true
	}
	return d, false, ok
}

func (q *deadlineQueue) popFirst() {
	switch _, inHeap, ok := q.first(); {
	case inHeap:
		heap.Pop(&q.rest)
	case ok:
		q.inOrder.pop()
	}
}

// reset replaces the contents with ds, which it takes over.
func (q *deadlineQueue) reset(ds []deadline) {
	slices.SortFunc(ds, deadline.compare)
	q.inOrder = fifo[deadline]{items: ds}
	q.rest = q.rest[:0]
}

// seqHeap is a min-heap of stream sequences.
type seqHeap []uint64

func (h seqHeap) Len() int           { return len(h) }
func (h seqHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h seqHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *seqHeap) Push(x any)        { *h = append(*h, x.(uint64)) }
func (h *seqHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// deadlineHeap is a min-heap of deadlines, earliest first.
type deadlineHeap []deadline

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].before(h[j]) }
func (h deadlineHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *deadlineHeap) Push(x any)        { *h = append(*h, x.(deadline)) }
func (h *deadlineHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
