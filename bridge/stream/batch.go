package stream

import (
	"bytes"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/jserr"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg"
)

// Atomic batch publish (allow_atomic, the Nats-Batch-* headers) as nats-server 2.15
// implements it: a batch's messages are staged in memory, each answered with an empty
// message, until the one with Nats-Batch-Commit; its messages are then checked in order as
// any publish is, and go into the stream's intake as one entry that the next flush appends
// alone, in one transaction, whole or not at all (pg.AppendBatch.Atomic). The commit alone
// hears the outcome: a PubAck naming the batch and its count, or the error of the first
// message refused. The limits are nats-server's defaults.
const (
	// BatchMaxMsgs bounds the messages of one batch.
	BatchMaxMsgs = 1000
	// BatchMaxPerStream and BatchMaxTotal bound the batches staged at once.
	BatchMaxPerStream = 50
	BatchMaxTotal     = 1000
	// BatchTimeout abandons a batch that got no message for this long.
	BatchTimeout = 10 * time.Second
	// batchMaxID bounds a Nats-Batch-Id's length.
	batchMaxID = 64
)

// ReasonBatch counts the publishes refused for their batch: incomplete, too large, too
// many in flight, a bad id, sequence or commit.
const ReasonBatch = "batch"

// batches is a stream's atomic batches being staged. Its lock is a leaf, taken on the
// link's read loop only.
type batches struct {
	mu     sync.Mutex
	staged map[string]*stagedBatch
}

// stagedBatch is one batch's messages so far.
type stagedBatch struct {
	msgs  []stagedMsg
	bytes int
	last  time.Time // when its latest message came, for BatchTimeout
}

type stagedMsg struct {
	subject string
	hdr     []byte
	data    []byte
}

// atomicCommit is a committed batch in a stream's intake: its messages, checked, and what
// its PubAck names.
type atomicCommit struct {
	id   string
	msgs []pg.AppendMsg
}

// batchAccount is what the registry counts of every stream's staged batches.
type batchAccount struct {
	count atomic.Int64 // batches staged, for BatchMaxTotal
	bytes atomic.Int64 // their bytes, within Config.IntakeTotalBytes
}

// onBatchPublish takes a publish that carries a Nats-Batch-Id, on the link's read loop.
// size is its stored size.
func (r *Registry) onBatchPublish(s *Stream, cfg *server.StreamConfig, m *leaf.Msg, id string, size int) {
	refuse := func(e *server.ApiError) { r.reject(s, m.Reply, ReasonBatch, e) }
	if !cfg.AllowAtomicPublish {
		r.dropBatches(s)
		refuse(server.NewJSAtomicPublishDisabledError())
		return
	}
	if len(id) > batchMaxID {
		refuse(server.NewJSAtomicPublishInvalidBatchIDError())
		return
	}
	seq, err := strconv.ParseUint(jswire.HeaderValue(m.Header, server.JSBatchSeq), 10, 64)
	if err != nil {
		refuse(server.NewJSAtomicPublishMissingSeqError())
		return
	}
	commitVal := jswire.HeaderValue(m.Header, server.JSBatchCommit)
	commit, eob := commitVal != "", commitVal == "eob"
	count := seq
	if eob {
		// The end-of-batch marker is not stored and does not count.
		count--
	}
	now := r.cfg.Clock.Now()
	if r.batchAcct.count.Load() >= BatchMaxTotal {
		// Batches abandoned on streams that see no more batches count until swept.
		r.sweepAllBatches(now)
	}
	bs := &s.batches
	bs.mu.Lock()
	r.sweepBatchesLocked(bs, now)
	b, ok := bs.staged[id]
	if !ok {
		var e *server.ApiError
		switch {
		case seq != 1 && count > BatchMaxMsgs:
			e = server.NewJSAtomicPublishTooLargeBatchError(BatchMaxMsgs)
		case seq != 1:
			e = server.NewJSAtomicPublishIncompleteBatchError()
		case len(bs.staged)+1 > BatchMaxPerStream:
			e = server.NewJSAtomicPublishTooManyInflightError()
		case r.batchAcct.count.Add(1) > BatchMaxTotal:
			r.batchAcct.count.Add(-1)
			e = server.NewJSAtomicPublishTooManyInflightError()
		}
		if e != nil {
			bs.mu.Unlock()
			refuse(e)
			return
		}
		b = &stagedBatch{}
		if bs.staged == nil {
			bs.staged = make(map[string]*stagedBatch)
		}
		bs.staged[id] = b
	}
	fail := func(e *server.ApiError) {
		r.dropBatchLocked(bs, id)
		bs.mu.Unlock()
		refuse(e)
	}
	if commit && !eob && commitVal != "1" {
		fail(server.NewJSAtomicPublishInvalidBatchCommitError())
		return
	}
	hdr := m.Header
	if lvl := jswire.HeaderValue(hdr, server.JSRequiredApiLevel); lvl != "" {
		if n, err := strconv.Atoi(lvl); err != nil || n > jswire.APILevel {
			fail(server.NewJSRequiredApiLevelError())
			return
		}
		hdr = removeHeader(hdr, server.JSRequiredApiLevel)
	}
	if uint64(len(b.msgs))+1 != seq || (seq == 1 && eob) {
		fail(server.NewJSAtomicPublishIncompleteBatchError())
		return
	}
	if count > BatchMaxMsgs {
		fail(server.NewJSAtomicPublishTooLargeBatchError(BatchMaxMsgs))
		return
	}
	if r.batchAcct.bytes.Add(int64(size)) > int64(r.cfg.IntakeTotalBytes) {
		r.batchAcct.bytes.Add(-int64(size))
		r.dropBatchLocked(bs, id)
		bs.mu.Unlock()
		r.reject(s, m.Reply, ReasonIntakeAll, errIntakeFull)
		return
	}
	b.bytes += size
	b.last = now
	b.msgs = append(b.msgs, stagedMsg{subject: m.Subject, hdr: hdr, data: m.Data})
	if !commit {
		bs.mu.Unlock()
		if m.Reply != "" {
			_ = r.cfg.Link.Publish(m.Reply, "", nil, nil)
		}
		return
	}
	r.dropBatchLocked(bs, id)
	bs.mu.Unlock()
	staged := b.msgs
	if eob {
		staged = staged[:len(staged)-1]
	}
	msgs, e := checkBatch(cfg, staged, eob)
	if e != nil {
		refuse(e)
		return
	}
	r.enqueue(s, publish{reply: m.Reply, recv: now, size: b.bytes, batch: &atomicCommit{id: id, msgs: msgs}})
}

// checkBatch checks a committed batch's messages in order as nats-server does, and
// returns them to append, or the first refusal. With eob the last of them gets the
// commit header the end-of-batch marker stood for.
func checkBatch(cfg *server.StreamConfig, staged []stagedMsg, eob bool) ([]pg.AppendMsg, *server.ApiError) {
	msgs := make([]pg.AppendMsg, len(staged))
	written := make(map[string]bool, len(staged))
	for i, sm := range staged {
		hdr := sm.hdr
		if eob && i == len(staged)-1 {
			hdr = appendHeader(hdr, server.JSBatchCommit, "1")
		}
		if jswire.HeaderValue(hdr, server.JSExpectedLastMsgId) != "" {
			return nil, server.NewJSAtomicPublishUnsupportedHeaderBatchError(server.JSExpectedLastMsgId)
		}
		am := pg.AppendMsg{Subject: sm.subject, Header: hdr, Data: sm.data}
		if e := parseMsg(cfg, hdr, &am); e != nil {
			return nil, e
		}
		switch am.Rollup {
		case pg.RollupSubject:
			if written[sm.subject] {
				return nil, server.NewJSStreamRollupFailedError(errBatchRollupSub)
			}
		case pg.RollupAll:
			if i > 0 {
				return nil, server.NewJSStreamRollupFailedError(errBatchRollupAll)
			}
		}
		written[sm.subject] = true
		msgs[i] = am
	}
	return msgs, nil
}

// nats-server's words for a rollup an atomic batch cannot hold: a subject rollup after the
// batch wrote the subject, a stream rollup after its first message.
var (
	errBatchRollupSub = errors.New("batch rollup sub invalid")
	errBatchRollupAll = errors.New("batch rollup all invalid")
)

// sweepBatchesLocked drops the batches of bs that timed out.
func (r *Registry) sweepBatchesLocked(bs *batches, now time.Time) {
	for id, b := range bs.staged {
		if now.Sub(b.last) >= BatchTimeout {
			r.dropBatchLocked(bs, id)
		}
	}
}

// sweepAllBatches drops the batches of every stream that timed out.
func (r *Registry) sweepAllBatches(now time.Time) {
	for _, s := range r.List() {
		bs := &s.batches
		bs.mu.Lock()
		r.sweepBatchesLocked(bs, now)
		bs.mu.Unlock()
	}
}

// dropBatchLocked forgets one staged batch.
func (r *Registry) dropBatchLocked(bs *batches, id string) {
	b, ok := bs.staged[id]
	if !ok {
		return
	}
	delete(bs.staged, id)
	r.batchAcct.count.Add(-1)
	r.batchAcct.bytes.Add(-int64(b.bytes))
}

// dropBatches forgets every batch staged for s: it no longer allows them, or is gone.
func (r *Registry) dropBatches(s *Stream) {
	bs := &s.batches
	bs.mu.Lock()
	for id := range bs.staged {
		r.dropBatchLocked(bs, id)
	}
	bs.mu.Unlock()
}

// appendHeader adds a header line at the end of a raw header block, as nats-server adds
// one to a stored message.
func appendHeader(hdr []byte, key, value string) []byte {
	var b bytes.Buffer
	if len(hdr) > 2 {
		b.Write(hdr[:len(hdr)-2])
	} else {
		b.WriteString("NATS/1.0\r\n")
	}
	b.WriteString(key + ": " + value + "\r\n\r\n")
	return b.Bytes()
}

// removeHeader drops every line of key from a raw header block.
func removeHeader(hdr []byte, key string) []byte {
	out := make([]byte, 0, len(hdr))
	for line := range bytes.Lines(hdr) {
		k, _, ok := bytes.Cut(line, []byte(":"))
		if ok && bytes.EqualFold(bytes.TrimSpace(k), []byte(key)) {
			continue
		}
		out = append(out, line...)
	}
	return out
}

// answerBatch answers a committed batch's publisher: the PubAck of its last message, naming
// the batch and how many it stored, or the error of the first message refused.
func (r *Registry) answerBatch(s *Stream, pb publish, res pg.AppendResult, now time.Time) {
	for _, o := range res.Outcomes {
		if o.Err != nil {
			r.reject(s, pb.reply, RefusedReason(o.Err), jserr.PublishRefused(o.Err))
			return
		}
	}
	n := len(res.Outcomes)
	r.m.accepted.Add(float64(n))
	if pb.reply == "" {
		return
	}
	_ = r.cfg.Link.Publish(pb.reply, "", nil, jswire.PubAckBatch(s.ackPfx, res.Outcomes[n-1].Seq, pb.batch.id, n))
	r.m.pubAck.Observe(now.Sub(pb.recv).Seconds())
}
