package bench

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestHistogramBuckets(t *testing.T) {
	prev := uint64(0)
	for i := range numBuckets {
		lo, hi := bucketRange(i)
		if i > 0 && lo != prev+1 {
			t.Fatalf("bucket %d starts at %d, want %d", i, lo, prev+1)
		}
		if bucketOf(lo) != i || bucketOf(hi) != i {
			t.Fatalf("bucket %d = [%d, %d] but bucketOf gives %d and %d", i, lo, hi, bucketOf(lo), bucketOf(hi))
		}
		prev = hi
	}
	if prev != ^uint64(0) {
		t.Fatalf("the buckets end at %d, short of the largest duration", prev)
	}
}

func TestHistogramQuantiles(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var h, a, b Histogram
	var all []time.Duration
	for i := range 100_000 {
		d := time.Duration(r.ExpFloat64() * float64(time.Millisecond))
		all = append(all, d)
		h.Record(d)
		if i%2 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	a.Merge(&b)
	slices.Sort(all)
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		exact := all[int(q*float64(len(all)))-1]
		for name, hh := range map[string]*Histogram{"recorded": &h, "merged": &a} {
			got := hh.Quantile(q)
			if diff := float64(got-exact) / float64(exact); diff > 0.02 || diff < -0.02 {
				t.Errorf("%s p%g = %v, exact %v: off by %.1f %%", name, q*100, got, exact, diff*100)
			}
		}
	}
	if h.Quantile(1) != all[len(all)-1] || h.Quantile(0) != all[0] {
		t.Errorf("the extremes are %v and %v, want %v and %v", h.Quantile(0), h.Quantile(1), all[0], all[len(all)-1])
	}
	var empty Histogram
	if empty.Quantile(0.5) != 0 || empty.Count() != 0 {
		t.Error("an empty histogram reports values")
	}
}
