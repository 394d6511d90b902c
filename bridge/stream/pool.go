package stream

import (
	"math/bits"
	"sync"

	"github.com/jetgres/jetgres/pg"
)

// Under load every flush would regrow its stream's intake from nothing and copy its
// messages into a new slice: half of the bridge's allocations per publish. Flushes give
// both back once answered. Pools, not a spare per stream, so that idle streams keep
// nothing (a pool empties itself at garbage collections); one pool per power-of-two
// capacity, so that a slice is never more than four times the size asked for: a stream
// with a few messages waiting, say while the database is down, holds a small slice, not
// one that a busy stream grew.
var (
	publishBufs slicePool[publish]
	msgBufs     slicePool[pg.AppendMsg]
)

const (
	minPooledShift = 3  // 8 elements
	maxPooledShift = 13 // 8,192 elements: FlushMaxMsgsDefault
)

// slicePool keeps slices by capacity: class i holds capacities from 1<<(i+minPooledShift)
// up to twice that.
type slicePool[T any] struct {
	classes [maxPooledShift - minPooledShift + 1]sync.Pool
}

// get returns a slice of length n, reused if one is pooled.
func (sp *slicePool[T]) get(n int) []T {
	i := max(bits.Len(uint(max(n, 1)-1))-minPooledShift, 0) // the smallest class that fits n
	if i >= len(sp.classes) {
		return make([]T, n)
	}
	if b, ok := sp.classes[i].Get().(*[]T); ok {
		return (*b)[:n]
	}
	return make([]T, n, 1<<(i+minPooledShift))
}

// grow returns a slice holding b's elements with room for as many again, and pools b.
func (sp *slicePool[T]) grow(b []T) []T {
	nb := sp.get(max(2*len(b), 1<<minPooledShift))[:len(b)]
	copy(nb, b)
	sp.put(b)
	return nb
}

// put pools b, emptied so that it keeps nothing alive, in the largest class its capacity
// fills.
func (sp *slicePool[T]) put(b []T) {
	if cap(b) < 1<<minPooledShift || cap(b) >= 2<<maxPooledShift {
		return
	}
	i := bits.Len(uint(cap(b))) - 1 - minPooledShift
	clear(b[:cap(b)])
	b = b[:0]
	sp.classes[i].Put(&b)
}
