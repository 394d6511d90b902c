package jsapi

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/gets"
	"github.com/jetgres/jetgres/bridge/jserr"
	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg"
)

// Direct gets ($JS.API.DIRECT.GET.<stream>, with a JSON request, and
// $JS.API.DIRECT.GET.<stream>.<subject> for the last message of a subject) are answered with
// the stored message itself, its metadata in headers, not with a JSON response. KV buckets
// are created with allow_direct, and clients then read every key this way. nats-server
// subscribes these subjects only for streams with allow_direct; for any other stream the
// requester hears that nobody answers, and so it does from jetgres.

const (
	// directMaxResults bounds a multi_last request, as nats-server does: more subjects than
	// this is "413 Too Many Results".
	directMaxResults = 1024
	// directMaxBytes bounds a batch that names no max_bytes: nats-server's default for a
	// client's pending bytes.
	directMaxBytes = 64 << 20
)

func (a *API) directGet(ctx context.Context, m *leaf.Msg, tok []string) {
	s, err := a.streams.Find(ctx, tok[0])
	mirrored := false
	if errors.Is(err, pg.ErrNotFound) {
		if ms := a.directMirror(tok[0]); ms != nil {
			s, err, mirrored = ms, nil, true
		}
	}
	if err != nil {
		if !errors.Is(err, pg.ErrNotFound) {
			a.log.Warn("direct get", "stream", tok[0], "err", err)
		}
		// Whether the stream does not exist or could not be read, no JetStream serves it.
		a.status(m.Reply, jserr.NotServed)
		return
	}
	req, refused := directRequest(s, m, tok[1:], mirrored)
	if refused != nil {
		a.status(m.Reply, refused)
		return
	}
	dg := directGet{a: a, s: s, reply: m.Reply, req: req}
	if err := dg.run(ctx); err != nil {
		st := jserr.StatusOf(err)
		a.status(m.Reply, st)
		switch {
		case jserr.IsStatus(err):
		case st == jserr.NotServed:
			a.log.Warn("direct get: database unavailable", "stream", s.Name(), "err", err)
		default:
			a.log.Error("direct get", "stream", s.Name(), "err", err)
		}
	}
}

// status answers reply with a status line and no message.
func (a *API) status(reply string, st *jserr.Status) {
	_ = a.link.Publish(reply, "", jswire.StatusHeader(st.Code, st.Description), nil)
}

// directGetFromMemory answers a direct get on the link's read loop when memory holds the
// answer, and reports whether it did. A get answered here waits for no API worker: the
// hand-off to one and back was most of what a key-value get cost beyond the link's round
// trip. Everything else, a database read, a batch, an error to tell, goes to the workers,
// which look again and answer as before.
func (a *API) directGetFromMemory(m *leaf.Msg, rest string) bool {
	tok := strings.Split(rest, ".")
	s := a.streams.Lookup(tok[0])
	if s == nil {
		return false
	}
	req, refused := directRequest(s, m, tok[1:], false)
	if refused != nil || req.Batch != 0 || len(req.MultiLastFor) > 0 || req.StartTime != nil {
		return false
	}
	msg, live, ok := s.Gets().FromMemory(getRequest(&req))
	if !ok {
		return false
	}
	if !live {
		a.status(m.Reply, jserr.NoMessage)
		return true
	}
	dg := directGet{a: a, s: s, reply: m.Reply, req: req}
	dg.send(msg, nil)
	return true
}

// directRequest reads a direct get of stream s, whose subject goes on with key, or the status
// that refuses it: the stream does not allow direct gets (unless it answers as the mirror of
// the stream named), the client needs a later API level, or the request is malformed.
func directRequest(s *stream.Stream, m *leaf.Msg, key []string, mirrored bool) (server.JSApiMsgGetRequest, *jserr.Status) {
	if !mirrored && !s.Config().AllowDirect {
		return server.JSApiMsgGetRequest{}, jserr.NotServed
	}
	if v := jswire.HeaderValue(m.Header, server.JSRequiredApiLevel); v != "" {
		if n, err := strconv.Atoi(v); err != nil || n > jswire.APILevel {
			return server.JSApiMsgGetRequest{}, jserr.APILevel
		}
	}
	req, desc := jswire.DirectRequest(key, m.Data)
	if desc != "" {
		return req, jserr.BadRequest(desc)
	}
	return req, nil
}

// getRequest is what package gets needs of a get request: one message, by sequence, the
// last of a subject or the next of a subject.
func getRequest(req *server.JSApiMsgGetRequest) gets.Request {
	return gets.Request{Seq: req.Seq, LastFor: req.LastFor, NextFor: req.NextFor}
}

// directGet is one direct get being answered.
type directGet struct {
	a     *API
	s     *stream.Stream
	reply string
	req   server.JSApiMsgGetRequest
}

func (dg *directGet) run(ctx context.Context) error {
	req := &dg.req
	db := dg.a.db
	if len(req.MultiLastFor) > 0 {
		return dg.multiLast(ctx)
	}
	if req.StartTime != nil {
		// The first message at or after a time is the next of any subject from its sequence.
		var err error
		if req.Seq, err = db.SeqAtTime(ctx, dg.s.ID(), req.StartTime.UnixNano()); err != nil {
			return err
		}
		if req.NextFor == "" {
			req.NextFor = ">"
		}
	}
	if req.Batch == 0 {
		m, err := dg.s.Gets().Get(ctx, getRequest(req))
		if err != nil {
			return jserr.DirectLookup(err)
		}
		dg.send(m, nil)
		return nil
	}
	return dg.batch(ctx, max(req.Seq, 1))
}

// batch sends up to req.Batch messages from seq on that match next_by_subj, each with the
// count still to come, then an end-of-batch status.
func (dg *directGet) batch(ctx context.Context, seq uint64) error {
	req := &dg.req
	hw, err := dg.a.cons.HighWater(ctx, dg.s)
	if err != nil {
		return err
	}
	var filters []string
	if req.NextFor != "" {
		filters = []string{req.NextFor}
	}
	np, err := dg.a.db.CountPending(ctx, pg.PendingParams{StreamID: dg.s.ID(), From: seq, UpTo: hw, Filters: filters})
	if err != nil {
		return err
	}
	msgs, _, err := dg.a.cons.ReadPop(ctx, pg.ReadParams{StreamID: dg.s.ID(), From: seq, UpTo: hw, MaxMsgs: req.Batch, MaxBytes: dg.maxBytes(), BytesThrough: true}, filters)
	if err != nil {
		return err
	}
	if len(msgs) == 0 {
		return jserr.NoMessage
	}
	var last uint64
	for i := range msgs {
		np = max(np, 1) - 1
		dg.send(&msgs[i], []string{"Nats-Num-Pending", strconv.FormatUint(np, 10), "Nats-Last-Sequence", strconv.FormatUint(last, 10)})
		last = msgs[i].Seq
	}
	_ = dg.a.link.Publish(dg.reply, "", jswire.StatusHeader(204, "EOB", "Nats-Num-Pending", strconv.FormatUint(np, 10), "Nats-Last-Sequence", strconv.FormatUint(last, 10)), nil)
	return nil
}

// multiLast sends the last message of each subject matching multi_last, up to up_to_seq or
// up_to_time, lowest sequence first, then an end-of-batch status.
func (dg *directGet) multiLast(ctx context.Context) error {
	req := &dg.req
	db := dg.a.db
	var upTo uint64
	if req.UpToTime != nil {
		// Nothing before the first message: no subject has a last message, and the 404
		// below answers.
		at, err := db.SeqAtTime(ctx, dg.s.ID(), req.UpToTime.UnixNano())
		if err != nil {
			return err
		}
		upTo = at - 1
	} else {
		last, err := dg.a.cons.HighWater(ctx, dg.s)
		if err != nil {
			return err
		}
		upTo = last
		if req.UpToSeq > 0 {
			upTo = min(req.UpToSeq, upTo)
		}
	}
	seqs, err := db.LastSeqsPerSubject(ctx, dg.s.ID(), req.MultiLastFor, upTo)
	if err != nil {
		return err
	}
	// As in nats-server, the bound, and the count still to come, cover the subjects' last
	// messages below the requested sequence too: those are skipped, not left out.
	if len(seqs) > directMaxResults {
		return jserr.TooManyResults
	}
	if len(seqs) == 0 {
		return jserr.NoResults
	}
	var last uint64
	pending, sent, bytes := len(seqs), 0, 0
	for _, seq := range seqs {
		pending--
		if seq < req.Seq {
			continue
		}
		m, err := dg.s.Gets().BySeq(ctx, seq)
		if errors.Is(err, pg.ErrNotFound) {
			continue // removed since: as if it had never matched
		}
		if err != nil {
			return err
		}
		dg.send(m, []string{"Nats-Num-Pending", strconv.Itoa(pending), "Nats-Last-Sequence", strconv.FormatUint(last, 10)})
		last = seq
		if bytes += len(m.Subject) + len(m.Header) + len(m.Data); bytes >= dg.maxBytes() {
			break
		}
		if sent++; req.Batch > 0 && sent >= req.Batch {
			break
		}
	}
	_ = dg.a.link.Publish(dg.reply, "", jswire.StatusHeader(204, "EOB", "Nats-Num-Pending", strconv.Itoa(pending), "Nats-Last-Sequence", strconv.FormatUint(last, 10),
		"Nats-UpTo-Sequence", strconv.FormatUint(upTo, 10)), nil)
	return nil
}

func (dg *directGet) maxBytes() int {
	if dg.req.MaxBytes > 0 {
		return dg.req.MaxBytes
	}
	return directMaxBytes
}

// send answers with one message: its own headers, then the stream's metadata; none at all
// with no_hdr.
func (dg *directGet) send(m *pg.Message, extra []string) {
	if dg.req.NoHeaders {
		_ = dg.a.link.Publish(dg.reply, "", nil, m.Data)
		return
	}
	kv := append([]string{"Nats-Stream", dg.s.Name(), "Nats-Subject", m.Subject, "Nats-Sequence", strconv.FormatUint(m.Seq, 10),
		"Nats-Time-Stamp", time.Unix(0, m.TS).UTC().Format(time.RFC3339Nano)}, extra...)
	_ = dg.a.link.Publish(dg.reply, "", jswire.AppendHeaders(m.Header, kv...), m.Data)
}

// directMirror is a stream of this deployment that answers direct gets of the stream called
// name in its place: a mirror of it with mirror_direct, as nats-server's mirror subscribes
// its origin's direct get subjects. nil when there is none.
func (a *API) directMirror(name string) *stream.Stream {
	for _, s := range a.streams.List() {
		if cfg := s.ConfigView(); cfg.Mirror != nil && cfg.MirrorDirect && cfg.Mirror.Name == name {
			return s
		}
	}
	return nil
}
