package bench

import (
	"context"
	"fmt"
	"sync"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// TargetNatsBenchStoreFloor is the storage floor of `js pub async`: the link floor's
// responder, but one that stores each window's publishes in jetgres's PostgreSQL before it
// acks them, with one COPY and one commit with synchronous_commit on per batch
// (pgtest.StoreFloor) and one batch in flight at a time, as jetgres flushes one stream at a
// time. It is the least any gateway that stores publishes in PostgreSQL before its PubAcks
// can do behind the same link, measured on the jetgres node of commit on.
const TargetNatsBenchStoreFloor = "jetgres-storage-floor"

// natsBenchFloors are the targets of the floors a run's row may be followed by, in the order
// their rows show: a floor's result is its target's for the run's name and client count.
var natsBenchFloors = []string{TargetNatsBenchFloor, TargetNatsBenchStoreFloor}

// floorName is what the row of floor's result for run calls it after the run's label: what
// the floor leaves out.
func floorName(floor string, run natsBenchRun) string {
	switch {
	case floor == TargetNatsBenchStoreFloor:
		return "storage floor (COPY + commit per batch)"
	case run.getFloor():
		return "link floor (nothing looked up)"
	}
	return "link floor (no storage)"
}

// natsBenchPubOnLink runs `nats bench js pub async` with its publishes going to respond, a
// handler on t's leafnode link, and records the result as target's; name tells the floor
// apart in progress lines and errors.
func (r *runner) natsBenchPubOnLink(ctx context.Context, bin string, t *benchTarget, nb *NatsBench, target, name string, respond leaf.Handler) (err error) {
	r.prog.phase("nats bench     js pub async, "+name+", on "+t.name, 0, 0)
	c, err := dial(t.url, "jetgres-bench nats bench "+name)
	if err != nil {
		return err
	}
	defer c.close()
	if _, err := c.createStream(ctx, natsBenchFloorStream, natsBenchFloorStored); err != nil {
		return err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		defer cancel()
		if derr := c.js.DeleteStream(dctx, natsBenchFloorStream); derr != nil && err == nil {
			err = fmt.Errorf("delete stream %s: %w", natsBenchFloorStream, derr)
		}
	}()
	sub, err := respondOnLink(ctx, t, natsBenchFloorSubject, respond)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	cmd := []string{"js", "pub", "async", natsBenchFloorSubject, "--stream", natsBenchFloorStream}
	res, err := runNatsBenchCLI(ctx, bin, nb.natsBenchArgs(t.url, nil, cmd, nb.Msgs), nb.Msgs)
	if err != nil {
		return err
	}
	res.Bench, res.Clients, res.Target = "js pub async", 1, target
	res.P50us, res.P90us, res.P99us = 0, 0, 0
	nb.Results = append(nb.Results, res)
	return nil
}

// natsBenchStoreFloor measures the storage floor on t, in a table of its own in jetgres's
// database that it drops afterwards.
func (r *runner) natsBenchStoreFloor(ctx context.Context, bin string, t *benchTarget, nb *NatsBench) (err error) {
	floor, err := pgtest.OpenStoreFloor(ctx, r.dsn)
	if err != nil {
		return err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		defer cancel()
		if cerr := floor.Close(dctx); cerr != nil && err == nil {
			err = cerr
		}
	}()
	s := &storeFloor{floor: floor, link: t.node.link, prefix: jswire.PubAckPrefix(natsBenchFloorStream), wake: make(chan struct{}, 1)}
	// A batch that fails ends nats bench at once, which would otherwise wait for its acks
	// until its timeout.
	sctx, stop := context.WithCancelCause(ctx)
	var serr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		serr = s.run(sctx, stop)
	}()
	err = r.natsBenchPubOnLink(sctx, bin, t, nb, TargetNatsBenchStoreFloor, "storage floor", s.add)
	stop(nil)
	<-done
	if serr != nil {
		return serr
	}
	return err
}

// storeFloor is the storage floor's responder: add takes the publishes on the link's read
// loop, and run stores and acks them in batches on a goroutine of its own.
type storeFloor struct {
	floor  *pgtest.StoreFloor
	link   *leaf.Conn
	prefix []byte
	wake   chan struct{} // holds a wake-up while publishes are pending

	mu      sync.Mutex
	pending []pgtest.FloorMsg
	replies []string // the reply subject of each pending publish
}

// add queues a publish for the next batch. It runs on the link's read loop, which must not
// block, so it leaves the storing to run.
func (s *storeFloor) add(m *leaf.Msg) {
	s.mu.Lock()
	s.pending = append(s.pending, pgtest.FloorMsg{Subject: m.Subject, Data: m.Data})
	s.replies = append(s.replies, m.Reply)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// run takes everything pending, stores it as one batch, acks each of its publishes, and
// takes the next, until ctx ends. A batch that fails ends it with fail(err) and returns err.
func (s *storeFloor) run(ctx context.Context, fail context.CancelCauseFunc) error {
	var msgs []pgtest.FloorMsg
	var replies []string
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.wake:
		}
		// The batch just acked is the buffer add fills next, so that a window costs no
		// allocation once the buffers have grown to it.
		s.mu.Lock()
		msgs, s.pending = s.pending, msgs[:0]
		replies, s.replies = s.replies, replies[:0]
		s.mu.Unlock()
		if len(msgs) == 0 {
			continue
		}
		first, err := s.floor.Store(ctx, msgs)
		if err == nil {
			for i, reply := range replies {
				if reply == "" {
					continue
				}
				if err = s.link.Publish(reply, "", nil, jswire.PubAck(s.prefix, first+uint64(i), false)); err != nil {
					err = fmt.Errorf("storage floor: ack: %w", err)
					break
				}
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			fail(err)
			return err
		}
	}
}
