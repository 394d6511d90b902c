package pg

import (
	"sync"
	"sync/atomic"
)

// cacheEntry is what a streamCache holds per stream: cacheCost is what the entry counts
// against the cache's bound.
type cacheEntry interface{ cacheCost() int }

// streamCache holds one entry per stream that an append derives its decisions from (a
// subject index, the lasts of derived messages), with the cost of all entries together
// bounded. An append takes a stream's entry out while it decides and puts back what its
// commit leaves: a stream has at most one flush in flight, and one that found its entry
// taken goes the general way. An entry that would go past the bound is not kept, or kept
// smaller when the cache has a shrink, and counted in dropped.
type streamCache[V cacheEntry] struct {
	bound int
	// shrink, when set, makes an entry that would go past the bound smaller instead of
	// leaving it out.
	shrink  func(V) V
	mu      sync.Mutex
	m       map[int64]V
	cost    int
	dropped atomic.Int64
}

func newStreamCache[V cacheEntry](bound int) streamCache[V] {
	return streamCache[V]{bound: bound}
}

// take removes and returns a stream's entry, the zero V for none.
func (c *streamCache[V]) take(id int64) V {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[id]
	if !ok {
		return v
	}
	delete(c.m, id)
	c.cost -= v.cacheCost()
	return v
}

// put keeps v as the stream's entry, in place of any it had, unless that would go past the
// bound.
func (c *streamCache[V]) put(id int64, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.m[id]; ok {
		c.cost -= old.cacheCost()
		delete(c.m, id)
	}
	if c.cost+v.cacheCost() > c.bound {
		c.dropped.Add(1)
		if c.shrink == nil {
			return
		}
		if v = c.shrink(v); c.cost+v.cacheCost() > c.bound {
			return
		}
	}
	if c.m == nil {
		c.m = make(map[int64]V)
	}
	c.m[id] = v
	c.cost += v.cacheCost()
}

func (c *streamCache[V]) forget(id int64) { _ = c.take(id) }

// peek calls f with a stream's entry, under the cache's lock so that nobody takes it
// meanwhile; it reports whether there was one.
func (c *streamCache[V]) peek(id int64, f func(V)) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[id]
	if ok {
		f(v)
	}
	return ok
}

// ids returns the streams that have an entry.
func (c *streamCache[V]) ids() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]int64, 0, len(c.m))
	for id := range c.m {
		out = append(out, id)
	}
	return out
}
