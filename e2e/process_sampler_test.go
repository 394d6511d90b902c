package e2e

// Watching a running jetgres: its /metrics parsed, its resident memory, and a sampler of
// /metrics, /readyz and resident memory whose samples the fault tests read.

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// parseMetrics reads Prometheus text exposition into "name{labels}" → value.
func parseMetrics(body string) map[string]float64 {
	out := make(map[string]float64)
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out
}

// metrics scrapes j's /metrics.
func (j *jetgres) metrics() (map[string]float64, error) {
	code, body, err := j.get("/metrics")
	if err != nil {
		return nil, err
	}
	if code != 200 {
		return nil, fmt.Errorf("/metrics: %d", code)
	}
	return parseMetrics(body), nil
}

// vmRSS is a process's resident set size in bytes, from /proc.
func vmRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("VmRSS line %q", line)
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS in /proc status")
}

// processSample is one look at a running jetgres.
type processSample struct {
	at        time.Time
	ready     int // /readyz status, 0 when it did not answer
	pushLimit float64
	popLimit  float64
	pushIn    float64 // append permits in flight
	pushBase  float64 // append lane rtt_base, seconds
	rejected  map[string]float64
	accepted  float64
	rss       int64
	heap      float64 // Go heap in use (go_memstats_heap_inuse_bytes)
	leafSlow  float64 // replies the leafnode link refused because its buffer was full
	// Flushes so far that took more than 256 and more than 1,024 messages from one stream's
	// intake (jetgres_fusion_batch_messages).
	over256, over1024 float64
}

// processSampler watches a jetgres every period: /readyz, /metrics and VmRSS.
type processSampler struct {
	j      *jetgres
	period time.Duration
	stopCh chan struct{}
	done   chan struct{}

	mu      sync.Mutex
	samples []processSample
}

func startSampler(j *jetgres, period time.Duration) *processSampler {
	s := &processSampler{j: j, period: period, stopCh: make(chan struct{}), done: make(chan struct{})}
	go s.loop()
	return s
}

func (s *processSampler) loop() {
	defer close(s.done)
	t := time.NewTicker(s.period)
	defer t.Stop()
	for {
		s.take()
		select {
		case <-s.stopCh:
			return
		case <-t.C:
		}
	}
}

func (s *processSampler) take() {
	sm := processSample{at: time.Now(), rejected: make(map[string]float64)}
	var wg sync.WaitGroup
	wg.Go(func() {
		if code, _, err := s.j.get("/readyz"); err == nil {
			sm.ready = code
		}
	})
	m, err := s.j.metrics()
	if err == nil {
		sm.pushLimit = m["jetgres_append_vegas_limit"]
		sm.popLimit = m["jetgres_pop_vegas_limit"]
		sm.pushIn = m["jetgres_append_vegas_in_flight"]
		sm.pushBase = m["jetgres_append_vegas_rtt_base_seconds"]
		sm.heap = m["go_memstats_heap_inuse_bytes"]
		sm.leafSlow = m["jetgres_leaf_slow_consumer_total"]
		sm.accepted = m["jetgres_publish_accepted_total"]
		flushes := m["jetgres_fusion_batch_messages_count"]
		sm.over256 = flushes - m[`jetgres_fusion_batch_messages_bucket{le="256"}`]
		sm.over1024 = flushes - m[`jetgres_fusion_batch_messages_bucket{le="1024"}`]
		for k, v := range m {
			if r, ok := strings.CutPrefix(k, `jetgres_publish_rejected_total{reason="`); ok {
				sm.rejected[strings.TrimSuffix(r, `"}`)] = v
			}
		}
	}
	sm.rss, _ = vmRSS(s.j.cmd.Process.Pid)
	wg.Wait()
	s.mu.Lock()
	s.samples = append(s.samples, sm)
	s.mu.Unlock()
}

func (s *processSampler) stop() []processSample {
	close(s.stopCh)
	<-s.done
	return s.all()
}

func (s *processSampler) all() []processSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.samples)
}

// between returns the samples taken in [from, to).
func between(ss []processSample, from, to time.Time) []processSample {
	var out []processSample
	for _, s := range ss {
		if !s.at.Before(from) && s.at.Before(to) {
			out = append(out, s)
		}
	}
	return out
}

// limitRange is the smallest and largest append lane limit among samples that have one.
func limitRange(ss []processSample) (lo, hi float64) {
	for _, s := range ss {
		if s.pushLimit == 0 {
			continue
		}
		if lo == 0 || s.pushLimit < lo {
			lo = s.pushLimit
		}
		hi = max(hi, s.pushLimit)
	}
	return lo, hi
}

func peakRSS(ss []processSample) int64 {
	var p int64
	for _, s := range ss {
		p = max(p, s.rss)
	}
	return p
}

// limitTrace renders the append lane limit over time, two values a second, for the log.
func limitTrace(ss []processSample, t0 time.Time) string {
	var b strings.Builder
	last := math.MinInt
	for _, s := range ss {
		slot := int(math.Floor(s.at.Sub(t0).Seconds() * 2))
		if slot == last || s.pushLimit == 0 {
			continue
		}
		last = slot
		fmt.Fprintf(&b, " %.1fs:%g(in %g, base %v)", float64(slot)/2, s.pushLimit, s.pushIn, time.Duration(s.pushBase*1e9).Round(time.Microsecond))
	}
	return b.String()
}

// rssTrace renders resident memory and the Go heap in use over time, one value a second,
// for the log.
func rssTrace(ss []processSample, t0 time.Time) string {
	var b strings.Builder
	last := math.MinInt
	for _, s := range ss {
		sec := int(math.Floor(s.at.Sub(t0).Seconds()))
		if sec == last || s.rss == 0 {
			continue
		}
		last = sec
		fmt.Fprintf(&b, " %ds:%.0f/%.0f", sec, float64(s.rss)/(1<<20), s.heap/(1<<20))
	}
	return b.String() + " (MiB, RSS/heap in use)"
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
