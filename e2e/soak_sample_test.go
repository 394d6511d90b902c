//go:build soak

package e2e

// The soak's sampler: every replica's resident memory, Go heap, goroutines, open files and
// PostgreSQL connections, and the jetgres schema's table and index sizes and dead tuples,
// appended to CSV files as they are taken so that a run cut short keeps what it saw.

import (
	"context"
	"encoding/csv"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/procfs"

	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// soakReplicaSample is one look at one replica; NaN where it could not be read (the replica
// was restarting).
type soakReplicaSample struct {
	rss, heap, goroutines, fds, conns float64
}

// soakSample is one minute's look at everything.
type soakSample struct {
	at       time.Time
	reps     [3]soakReplicaSample
	backends float64 // client backends of the whole server, the sampler's own included
	// The jetgres schema: bytes of tables (with TOAST) and of indexes, dead and live tuples.
	tableBytes, indexBytes, dead, live float64
	// The load's totals so far.
	published, pubErrors, acked, consumeErrors, kvOps, kvErrors, watched, purges, purgeErrors, restarts float64
}

// soakField is one CSV column after the time and the elapsed seconds, and where its value
// lives in a sample.
type soakField struct {
	name string
	of   func(*soakSample) *float64
}

// soakFields are the CSV's columns after the first two, in order.
var soakFields = func() []soakField {
	var out []soakField
	for i := range 3 {
		for _, f := range []soakField{
			{"rss_bytes", func(s *soakSample) *float64 { return &s.reps[i].rss }},
			{"heap_inuse_bytes", func(s *soakSample) *float64 { return &s.reps[i].heap }},
			{"goroutines", func(s *soakSample) *float64 { return &s.reps[i].goroutines }},
			{"open_files", func(s *soakSample) *float64 { return &s.reps[i].fds }},
			{"pg_conns", func(s *soakSample) *float64 { return &s.reps[i].conns }},
		} {
			out = append(out, soakField{fmt.Sprintf("r%d_%s", i+1, f.name), f.of})
		}
	}
	return append(out,
		soakField{"pg_client_backends", func(s *soakSample) *float64 { return &s.backends }},
		soakField{"table_bytes", func(s *soakSample) *float64 { return &s.tableBytes }},
		soakField{"index_bytes", func(s *soakSample) *float64 { return &s.indexBytes }},
		soakField{"dead_tuples", func(s *soakSample) *float64 { return &s.dead }},
		soakField{"live_tuples", func(s *soakSample) *float64 { return &s.live }},
		soakField{"published", func(s *soakSample) *float64 { return &s.published }},
		soakField{"publish_errors", func(s *soakSample) *float64 { return &s.pubErrors }},
		soakField{"acked", func(s *soakSample) *float64 { return &s.acked }},
		soakField{"consume_errors", func(s *soakSample) *float64 { return &s.consumeErrors }},
		soakField{"kv_ops", func(s *soakSample) *float64 { return &s.kvOps }},
		soakField{"kv_errors", func(s *soakSample) *float64 { return &s.kvErrors }},
		soakField{"watch_updates", func(s *soakSample) *float64 { return &s.watched }},
		soakField{"purges", func(s *soakSample) *float64 { return &s.purges }},
		soakField{"purge_errors", func(s *soakSample) *float64 { return &s.purgeErrors }},
		soakField{"restarts", func(s *soakSample) *float64 { return &s.restarts }},
	)
}()

func soakHeader() []string {
	out := []string{"time", "elapsed_s"}
	for _, f := range soakFields {
		out = append(out, f.name)
	}
	return out
}

// row is the sample as a CSV row; an empty cell is a value that could not be read.
func (s soakSample) row(start time.Time) []string {
	out := []string{s.at.UTC().Format(time.RFC3339), strconv.FormatFloat(math.Round(s.at.Sub(start).Seconds()), 'f', -1, 64)}
	for _, f := range soakFields {
		v := *f.of(&s)
		if math.IsNaN(v) {
			out = append(out, "")
			continue
		}
		out = append(out, strconv.FormatFloat(v, 'f', -1, 64))
	}
	return out
}

// soakSampler takes the samples and keeps them for the report.
type soakSampler struct {
	t     *testing.T
	out   string
	c     *cluster
	db    *rawsql.Pool
	n     *soakCounters
	start time.Time

	samples      *csv.Writer
	samplesFile  *os.File
	tables       *csv.Writer
	tablesFile   *os.File
	mu           sync.Mutex
	taken        []soakSample
	reportedAt   int
	reportsEvery int
}

func newSoakSampler(t *testing.T, out string, c *cluster, dsn string, n *soakCounters) (*soakSampler, error) {
	s := &soakSampler{t: t, out: out, c: c, n: n, start: time.Now(), reportsEvery: 10,
		db: rawsql.Open(t, dsn+" application_name=soak-sampler pool_max_conns=1")}
	var err error
	if s.samplesFile, err = os.Create(filepath.Join(out, "samples.csv")); err != nil {
		return nil, err
	}
	if s.tablesFile, err = os.Create(filepath.Join(out, "tables.csv")); err != nil {
		return nil, err
	}
	s.samples, s.tables = csv.NewWriter(s.samplesFile), csv.NewWriter(s.tablesFile)
	if err := s.samples.Write(soakHeader()); err != nil {
		return nil, err
	}
	if err := s.tables.Write([]string{"time", "elapsed_s", "table", "table_bytes", "index_bytes", "dead_tuples", "live_tuples"}); err != nil {
		return nil, err
	}
	return s, nil
}

// take samples everything once, appends the sample to the CSV files, and every few samples
// writes the report so far, so that a run killed outright still leaves curves.
func (s *soakSampler) take(ctx context.Context) {
	sm := soakSample{at: time.Now()}
	for i := range sm.reps {
		sm.reps[i] = s.replica(s.c.rep(i))
	}
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conns, err := s.connsPerReplica(qctx)
	for i := range sm.reps {
		sm.reps[i].conns = math.NaN()
		if err == nil {
			sm.reps[i].conns = conns[fmt.Sprintf("soak-r%d", i+1)]
		}
	}
	if err != nil {
		s.t.Logf("soak: pg_stat_activity: %v", err)
	}
	sm.backends, sm.tableBytes, sm.indexBytes, sm.dead, sm.live = math.NaN(), math.NaN(), math.NaN(), math.NaN(), math.NaN()
	if err := s.db.QueryRow(qctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'`).Scan(&sm.backends); err != nil {
		s.t.Logf("soak: backends: %v", err)
	}
	if err := s.tablesSample(qctx, &sm); err != nil {
		s.t.Logf("soak: table sizes: %v", err)
	}
	n := s.n
	for _, p := range []struct {
		dst *float64
		src int64
	}{
		{&sm.published, n.published.Load()}, {&sm.pubErrors, n.pubErrors.Load()}, {&sm.acked, n.acked.Load()},
		{&sm.consumeErrors, n.consumeErrors.Load()}, {&sm.kvOps, n.kvOps.Load()}, {&sm.kvErrors, n.kvErrors.Load()},
		{&sm.watched, n.watched.Load()}, {&sm.purges, n.purges.Load()}, {&sm.purgeErrors, n.purgeErrors.Load()},
		{&sm.restarts, n.restarts.Load()},
	} {
		*p.dst = float64(p.src)
	}
	if err := s.samples.Write(sm.row(s.start)); err != nil {
		s.t.Logf("soak: samples.csv: %v", err)
	}
	if s.samples.Flush(); s.samples.Error() != nil {
		s.t.Logf("soak: samples.csv: %v", s.samples.Error())
	}
	s.mu.Lock()
	s.taken = append(s.taken, sm)
	count := len(s.taken)
	s.mu.Unlock()
	r1 := sm.reps[0]
	s.t.Logf("soak: sample %d at %v: r1 rss %.0f MiB, %.0f goroutines, %.0f files, %.0f conns; tables %.0f MiB, indexes %.0f MiB, %.0f dead; %.0f published (%.0f errors), %.0f acked",
		count, sm.at.Sub(s.start).Round(time.Second), r1.rss/(1<<20), r1.goroutines, r1.fds, r1.conns,
		sm.tableBytes/(1<<20), sm.indexBytes/(1<<20), sm.dead, sm.published, sm.pubErrors, sm.acked)
	if count-s.reportedAt >= s.reportsEvery {
		s.reportedAt = count
		if err := s.report(*soakFlagWarmup); err != nil {
			s.t.Logf("soak: report: %v", err)
		}
	}
}

// replica reads one replica's process and /metrics, NaN for what it cannot read.
func (s *soakSampler) replica(j *jetgres) soakReplicaSample {
	r := soakReplicaSample{rss: math.NaN(), heap: math.NaN(), goroutines: math.NaN(), fds: math.NaN()}
	if j.hasExited() {
		return r
	}
	pid := j.cmd.Process.Pid
	if rss, err := vmRSS(pid); err == nil {
		r.rss = float64(rss)
	}
	if p, err := procfs.NewProc(pid); err == nil {
		if n, err := p.FileDescriptorsLen(); err == nil {
			r.fds = float64(n)
		}
	}
	if m, err := j.metrics(); err == nil {
		if v, ok := m["go_goroutines"]; ok {
			r.goroutines = v
		}
		if v, ok := m["go_memstats_heap_inuse_bytes"]; ok {
			r.heap = v
		}
	}
	return r
}

// connsPerReplica counts PostgreSQL sessions by the name each replica gives its pool (its
// listener and ownership sessions add a word to it).
func (s *soakSampler) connsPerReplica(ctx context.Context) (map[string]float64, error) {
	rows, err := s.db.Query(ctx, `
		SELECT split_part(application_name, ' ', 1), count(*) FROM pg_stat_activity
		WHERE application_name LIKE 'soak-r%' GROUP BY 1`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string]float64)
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			return nil, err
		}
		out[name] = float64(n)
	}
	return out, rows.Err()
}

// tablesSample reads the size and tuples of every table of the jetgres schema, writes them
// to tables.csv and adds them up into sm.
func (s *soakSampler) tablesSample(ctx context.Context, sm *soakSample) error {
	rows, err := s.db.Query(ctx, `
		SELECT c.relname, pg_table_size(c.oid), pg_indexes_size(c.oid),
		       coalesce(st.n_dead_tup, 0), coalesce(st.n_live_tup, 0)
		FROM pg_class c
		JOIN pg_namespace ns ON ns.oid = c.relnamespace
		LEFT JOIN pg_stat_user_tables st ON st.relid = c.oid
		WHERE ns.nspname = 'jetgres' AND c.relkind IN ('r', 'm')
		ORDER BY c.relname`)
	if err != nil {
		return err
	}
	defer rows.Close()
	var table, index, dead, live float64
	elapsed := strconv.Itoa(int(math.Round(sm.at.Sub(s.start).Seconds())))
	for rows.Next() {
		var name string
		var tb, ib, d, l int64
		if err := rows.Scan(&name, &tb, &ib, &d, &l); err != nil {
			return err
		}
		table, index, dead, live = table+float64(tb), index+float64(ib), dead+float64(d), live+float64(l)
		if err := s.tables.Write([]string{sm.at.UTC().Format(time.RFC3339), elapsed, name,
			strconv.FormatInt(tb, 10), strconv.FormatInt(ib, 10), strconv.FormatInt(d, 10), strconv.FormatInt(l, 10)}); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	s.tables.Flush()
	sm.tableBytes, sm.indexBytes, sm.dead, sm.live = table, index, dead, live
	return s.tables.Error()
}

// finish writes the final report and closes the CSV files.
func (s *soakSampler) finish(warmup time.Duration) error {
	err := s.report(warmup)
	for _, f := range []*os.File{s.samplesFile, s.tablesFile} {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

func (s *soakSampler) all() []soakSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]soakSample(nil), s.taken...)
}
