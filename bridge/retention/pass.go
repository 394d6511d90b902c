package retention

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg"
)

// retain is one retention pass over s: it gathers each consumer's ack floor and the acks it
// applied above it (from Host when this process serves the consumer, from PostgreSQL
// otherwise) and removes what no consumer needs any more. It reports whether acks seen on
// the link were not yet applied by their consumer.
func (e *Enforcer[S]) retain(ctx context.Context, s S) (waiting bool, err error) {
	cfg := s.ConfigView()
	st := e.state(s)
	st.run.Lock()
	defer st.run.Unlock()
	e.passes.Inc()
	rows, err := e.store.Consumers(ctx, s.ID())
	if err != nil {
		return false, err
	}
	st.mu.Lock()
	seen := make(map[string][]uint64, len(st.acked))
	for name, seqs := range st.acked {
		seen[name] = slices.Clone(seqs)
	}
	st.dirty = false
	st.mu.Unlock()

	p := pg.RetainParams{StreamID: s.ID(), WorkQueue: cfg.Retention == server.WorkQueuePolicy}
	floors := make(map[string]uint64, len(rows))
	// open says which acks seen on the link may still matter after this pass: those the
	// consumer has yet to apply, and those it applied that some other consumer still needs.
	open := make(map[string]func(seq uint64) bool, len(rows))
	var remote [][]string
	var sig strings.Builder
	fmt.Fprintf(&sig, "%s;", cfg.Retention)
	for _, row := range rows {
		var cc server.ConsumerConfig
		if err := json.Unmarshal(row.Config, &cc); err != nil {
			return false, fmt.Errorf("consumer %q: stored config does not decode: %w", row.Name, err)
		}
		rc := pg.RetainConsumer{Floor: row.AckStreamSeq, Filters: jswire.ConsumerFilters(&cc)}
		fmt.Fprintf(&sig, "%s/%d/%s;", row.Name, row.Created.UnixNano(), strings.Join(rc.Filters, ","))
		pr, served := e.host.Served(s, row)
		if !served {
			remote = append(remote, rc.Filters)
			p.Consumers = append(p.Consumers, rc)
			floors[row.Name] = rc.Floor
			continue
		}
		rc.Floor = max(rc.Floor, pr.Floor)
		next := pr.Next
		for _, seq := range seen[row.Name] {
			_, held := slices.BinarySearch(pr.Pending, seq)
			switch {
			case seq <= rc.Floor || seq >= next:
			case held:
				waiting = true
			default:
				rc.Acked = append(rc.Acked, seq)
			}
		}
		slices.Sort(rc.Acked)
		rc.Acked = slices.Compact(rc.Acked)
		open[row.Name] = func(seq uint64) bool { return seq > rc.Floor && seq < next }
		floors[row.Name] = rc.Floor
		p.Consumers = append(p.Consumers, rc)
	}
	if sig.String() != st.sig {
		// Consumers came, went or changed filters (or this is the first pass): any message
		// may have lost the last consumer that needed it.
		p.Recheck = []pg.SeqRange{{From: 0, To: math.MaxInt64}}
	} else {
		for name, f := range floors {
			if old, ok := st.applied[name]; ok && f > old {
				p.Recheck = append(p.Recheck, pg.SeqRange{From: old + 1, To: f})
			}
		}
	}
	st.mu.Lock()
	st.remote = remote
	st.mu.Unlock()

	act := len(p.Recheck) > 0
	for _, c := range p.Consumers {
		act = act || len(c.Acked) > 0
	}
	var gone map[uint64]bool
	if act {
		res, err := e.store.Retain(ctx, p)
		if err != nil {
			return waiting, err
		}
		gone = make(map[uint64]bool, len(res.Gone))
		for _, seq := range res.Gone {
			gone[seq] = true
		}
		switch {
		case res.Tombstoned > 0:
			// A work queue's consumers never share a message, so none can want one that
			// retention tombstoned; under interest a consumer created since might.
			e.host.Purged(ctx, s, res.FirstSeq, p.WorkQueue)
		case res.Removed > 0:
			e.host.Removed(s, res.FirstSeq)
		}
	}
	st.applied, st.sig = floors, sig.String()

	st.mu.Lock()
	st.waiting = waiting
	for name, seqs := range st.acked {
		keep := open[name]
		if keep == nil {
			delete(st.acked, name)
			continue
		}
		if seqs = slices.DeleteFunc(seqs, func(seq uint64) bool { return !keep(seq) || gone[seq] }); len(seqs) > 0 {
			st.acked[name] = seqs
		} else {
			delete(st.acked, name)
		}
	}
	st.mu.Unlock()
	return waiting, nil
}
