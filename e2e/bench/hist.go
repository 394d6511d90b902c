package bench

import (
	"math"
	"math/bits"
	"sync"
	"time"
)

// Histogram buckets durations log-linearly, HDR style: values below 128 ns are exact, and
// every power of two above is split into 64 equal sub-buckets, so a recorded value is known to
// within 1/64 (1.6 %) at any magnitude, from nanoseconds to hours, in a fixed 30 KB. That is
// the precision a p99 needs, and merging is a plain sum, which per-worker histograms rely on.
//
// A Histogram is not safe for concurrent use; see syncHistogram.
type Histogram struct {
	counts   []uint64
	n        uint64
	sum      time.Duration
	min, max time.Duration
}

const (
	subBits    = 6
	subBuckets = 1 << subBits // per power of two
	exactBelow = 2 * subBuckets
	numBuckets = exactBelow + (64-subBits-1)*subBuckets
)

func bucketOf(v uint64) int {
	if v < exactBelow {
		return int(v)
	}
	shift := bits.Len64(v) - subBits - 1 // ≥ 1, and v>>shift is in [64, 128)
	return exactBelow + (shift-1)*subBuckets + int(v>>shift) - subBuckets
}

// bucketRange returns the smallest and largest value that fall into bucket i.
func bucketRange(i int) (lo, hi uint64) {
	if i < exactBelow {
		return uint64(i), uint64(i)
	}
	shift := (i-exactBelow)/subBuckets + 1
	m := uint64((i-exactBelow)%subBuckets + subBuckets)
	return m << shift, (m+1)<<shift - 1
}

// Record adds one duration; negative durations (a clock step) count as zero.
func (h *Histogram) Record(d time.Duration) {
	if h.counts == nil {
		h.counts = make([]uint64, numBuckets)
	}
	if d < 0 {
		d = 0
	}
	h.counts[bucketOf(uint64(d))]++
	if h.n == 0 || d < h.min {
		h.min = d
	}
	if d > h.max {
		h.max = d
	}
	h.n++
	h.sum += d
}

// Merge adds every value recorded in o.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	if h.counts == nil {
		h.counts = make([]uint64, numBuckets)
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.n += o.n
	h.sum += o.sum
}

// Count is the number of recorded values.
func (h *Histogram) Count() uint64 { return h.n }

// Quantile returns the value below which a fraction q of the recorded values lie: the middle
// of its bucket, or the exact minimum or maximum at the ends; 0 if nothing was recorded.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	switch rank {
	case 1:
		return h.min
	case h.n:
		return h.max
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, hi := bucketRange(i)
			v := time.Duration(lo + (hi-lo)/2)
			return min(max(v, h.min), h.max)
		}
	}
	return h.max
}

// Summary condenses h for the report.
func (h *Histogram) Summary() LatencySummary {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	mean := 0.0
	if h.n > 0 {
		mean = us(h.sum) / float64(h.n)
	}
	return LatencySummary{
		Count:  h.n,
		MeanUs: mean,
		P50us:  us(h.Quantile(0.50)),
		P90us:  us(h.Quantile(0.90)),
		P99us:  us(h.Quantile(0.99)),
		P999us: us(h.Quantile(0.999)),
		MaxUs:  us(h.max),
	}
}

// syncHistogram is a Histogram behind a mutex, for the many publishers of a load step that
// record into one distribution. At the rates a step reaches the lock is not the bottleneck.
type syncHistogram struct {
	mu sync.Mutex
	h  Histogram
}

func (s *syncHistogram) Record(d time.Duration) {
	s.mu.Lock()
	s.h.Record(d)
	s.mu.Unlock()
}

// snapshot returns a copy of what was recorded so far.
func (s *syncHistogram) snapshot() *Histogram {
	s.mu.Lock()
	defer s.mu.Unlock()
	var h Histogram
	h.Merge(&s.h)
	return &h
}
