package mirror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nuid"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg"
)

// batch is what one store takes: a mirror's messages under their origin sequences, or a
// source's to append.
type batch struct {
	msgs  []pg.Message
	bytes int
}

func (b *batch) reset() { b.msgs, b.bytes = b.msgs[:0], 0 }

func (b *batch) full() bool { return len(b.msgs) >= batchMsgs || b.bytes >= batchBytes }

func (b *batch) add(seq uint64, ts int64, subject string, hdr, data []byte) {
	b.msgs = append(b.msgs, pg.Message{Seq: seq, TS: ts, Subject: subject, Header: hdr, Data: data})
	b.bytes += len(subject) + len(hdr) + len(data)
}

// store stores the batch: a mirror's with the origin's sequences and times, the sequences
// skipped between them deleted; a source's appended, under the stream's limits.
func (o *origin) store(ctx context.Context, b *batch) error {
	if len(b.msgs) == 0 {
		return nil
	}
	e, s := o.c.e, o.c.s
	if o.mirror {
		r, err := e.cfg.Store.RestoreBatch(ctx, pg.RestoreParams{StreamID: s.ID(), Msgs: b.msgs, ChunkRows: s.ChunkRows()})
		if errors.Is(err, pg.ErrRestoreOrder) {
			// Stored already, by a copy on another replica that had the lock before: go on
			// from what the stream holds.
			o.resetToStored(ctx)
			return fmt.Errorf("%w: %v", errRetry, err)
		}
		if err != nil {
			return err
		}
		// The batch reuses its messages for the next one, and the stream's readers keep
		// these.
		e.cfg.Host.Copied(ctx, s, r, slices.Clone(b.msgs))
		return nil
	}
	bt := e.cfg.Host.Batch(s)
	bt.Msgs = make([]pg.AppendMsg, len(b.msgs))
	for i, m := range b.msgs {
		bt.Msgs[i] = pg.AppendMsg{Subject: m.Subject, Header: m.Header, Data: m.Data, MsgID: jswire.HeaderValue(m.Header, server.JSMsgId)}
	}
	res, _, err := e.cfg.Store.Append(ctx, []pg.AppendBatch{bt}, e.clk.Now().UnixNano())
	for _, r := range res {
		if r.Gone {
			return pg.ErrNotFound
		}
		e.cfg.Host.Commit(ctx, s, r)
		for i, oc := range r.Outcomes {
			if oc.Err != nil {
				// As nats-server does: start again at the message that was not stored.
				o.mu.Lock()
				o.sseq, o.dseq = b.msgs[i].Seq-1, 0
				o.mu.Unlock()
				return fmt.Errorf("%w: storing origin sequence %d: %v", errRetry, b.msgs[i].Seq, oc.Err)
			}
		}
	}
	if err == nil {
		o.mu.Lock()
		o.stored = b.msgs[len(b.msgs)-1].Seq
		o.mu.Unlock()
	}
	return err
}

// resetToStored makes the mirror go on after the last sequence the stream holds.
func (o *origin) resetToStored(ctx context.Context) {
	if st, err := o.c.e.cfg.Store.State(ctx, o.c.s.ID()); err == nil {
		o.mu.Lock()
		o.sseq = st.LastSeq
		o.mu.Unlock()
		o.c.e.cfg.Host.Restored(ctx, o.c.s, st.FirstSeq, st.LastSeq)
	}
}

// skipTo moves a mirror's last sequence up to what the origin's consumer starts after,
// when the origin no longer holds what the mirror would need next (purged, or expired).
func (o *origin) skipTo(ctx context.Context, seq uint64) error {
	st, err := o.c.e.cfg.Store.State(ctx, o.c.s.ID())
	if err != nil {
		return err
	}
	if seq <= st.LastSeq {
		return nil
	}
	r, err := o.c.e.cfg.Store.RestoreBatch(ctx, pg.RestoreParams{StreamID: o.c.s.ID(), Through: seq, ChunkRows: o.c.s.ChunkRows()})
	if err != nil {
		return err
	}
	// Only sequences skipped, and no message to announce: the stream's readers start again
	// from its first and last sequences, as after a restore. It happens once per consumer
	// the origin creates at most.
	o.c.e.cfg.Host.Restored(ctx, o.c.s, r.First, r.Last)
	return nil
}

// start is where the origin's consumer starts.
type start struct {
	seq  uint64
	time *time.Time
}

// startSeq is where the next consumer starts, as nats-server decides it: a mirror after
// the last sequence it holds, or where its configuration says when it never held one; a
// source after the last origin sequence it took, or where its configuration says.
func (o *origin) startSeq(ctx context.Context) (start, error) {
	if !o.mirror {
		if err := o.c.resume(ctx); err != nil {
			return start{}, err
		}
	}
	st, err := o.c.e.cfg.Store.State(ctx, o.c.s.ID())
	if err != nil {
		return start{}, err
	}
	if o.mirror {
		o.mu.Lock()
		o.sseq = st.LastSeq
		o.mu.Unlock()
		if st.Msgs > 0 || st.LastSeq > 0 {
			return start{seq: st.LastSeq + 1}, nil
		}
		if o.src.OptStartSeq > 0 {
			return start{seq: o.src.OptStartSeq}, nil
		}
		return start{time: o.src.OptStartTime}, nil
	}
	o.mu.Lock()
	seq := o.sseq + 1
	o.mu.Unlock()
	if seq > 1 {
		return start{seq: seq}, nil
	}
	if o.src.OptStartSeq > 0 {
		return start{seq: o.src.OptStartSeq}, nil
	}
	if t := o.src.OptStartTime; t != nil {
		if st.LastTS > 0 && t.Before(time.Unix(0, st.LastTS)) {
			last := time.Unix(0, st.LastTS).UTC()
			return start{time: &last}, nil
		}
		return start{time: t}, nil
	}
	return start{}, nil
}

// consumerConfig is the consumer nats-server creates on an origin to copy from it.
func (o *origin) consumerConfig(deliver string, at start, sourcing bool) server.ConsumerConfig {
	e, cfg := o.c.e, o.c.s.ConfigView()
	kind, pfx := "src", "JS_SRC_"
	if o.mirror {
		kind, pfx = "mirror", "JS_MIRROR_"
	}
	md := map[string]string{"_nats." + kind + ".stream": cfg.Name, "_nats." + kind + ".acc": server.DEFAULT_GLOBAL_ACCOUNT}
	if e.cfg.Domain != "" {
		md["_nats."+kind+".domain"] = e.cfg.Domain
	}
	name := pfx + o.consumerHash()
	if !sourcing {
		name += "_" + nuid.Next()
	}
	cc := server.ConsumerConfig{
		Name: name, DeliverSubject: deliver, AckPolicy: server.AckNone, AckWait: 22 * time.Hour, MaxDeliver: 1,
		Heartbeat: HealthHeartbeat, FlowControl: true, Direct: true, Sourcing: sourcing,
		InactiveThreshold: HealthInterval, Metadata: md, DeliverPolicy: server.DeliverAll,
	}
	switch {
	case at.seq > 0:
		cc.DeliverPolicy, cc.OptStartSeq = server.DeliverByStartSequence, at.seq
	case at.time != nil:
		cc.DeliverPolicy, cc.OptStartTime = server.DeliverByStartTime, at.time
	}
	cc.FilterSubject = o.src.FilterSubject
	var filters []string
	for _, tr := range o.src.SubjectTransforms {
		filters = append(filters, tr.Source)
	}
	if o.mirror && cc.FilterSubject == "" && len(filters) == 1 {
		cc.FilterSubject = filters[0]
	} else {
		cc.FilterSubjects = filters
	}
	return cc
}

// consumerHash names the consumer stably for this stream and origin, as nats-server's
// stable consumer hashes do.
func (o *origin) consumerHash() string {
	return jswire.ShortHash(o.c.s.Name() + " " + o.iname)
}

// create creates the origin's consumer and returns its info. As nats-server, it asks for a
// sourcing consumer first and, from an origin whose API level has none, for a plain one
// under a name of its own.
func (o *origin) create(ctx context.Context, deliver string, at start) (*server.ConsumerInfo, error) {
	for _, sourcing := range []bool{true, false} {
		cc := o.consumerConfig(deliver, at, sourcing)
		subject := fmt.Sprintf(server.JSApiConsumerCreateT, o.src.Name)
		if cc.FilterSubject != "" {
			subject = fmt.Sprintf(server.JSApiConsumerCreateExT, o.src.Name, cc.Name, cc.FilterSubject)
		}
		body, err := json.Marshal(server.CreateConsumerRequest{Stream: o.src.Name, Config: cc})
		if err != nil {
			return nil, err
		}
		var hdr []byte
		if sourcing {
			hdr = jswire.AppendHeaders(nil, server.JSRequiredApiLevel, "4")
		}
		o.mu.Lock()
		expect := o.ident
		o.mu.Unlock()
		if !o.mirror && expect != "" {
			// The origin refuses the consumer if it is another stream than the one the
			// source stopped in: deleted and created again under its name.
			hdr = jswire.AppendHeaders(hdr, server.JSStreamIdentity, expect)
		}
		resp, ident, err := o.request(ctx, o.apiSubject(subject), hdr, body)
		if err != nil {
			return nil, server.NewJSMirrorConsumerSetupFailedError(err)
		}
		if resp.Error != nil {
			if sourcing && (resp.Error.ErrCode == uint16(server.JSRequiredApiLevelErr) || resp.Error.ErrCode == uint16(server.JSInvalidJSONErr)) {
				continue
			}
			if resp.Error.ErrCode == uint16(server.JSConsumerStreamIdentityMismatchF) {
				// As nats-server: the source starts again from the new origin's start.
				o.mu.Lock()
				o.sseq, o.dseq, o.stored, o.ident = 0, 0, 0, ""
				o.mu.Unlock()
				o.c.e.log.Warn("a source's origin was created again: sourcing it from its start", "stream", o.c.s.Name(), "origin", o.src.Name)
				return nil, fmt.Errorf("%w: %s", errRetry, resp.Error)
			}
			return nil, resp.Error
		}
		if resp.ConsumerInfo == nil || resp.ConsumerInfo.Config == nil {
			return nil, server.NewJSMirrorConsumerSetupFailedError(errors.New("invalid consumer create response"))
		}
		o.mu.Lock()
		o.ident = ident
		o.mu.Unlock()
		return resp.ConsumerInfo, nil
	}
	return nil, server.NewJSMirrorConsumerSetupFailedError(errors.New("the origin refused the consumer"))
}

// request sends an API request to the origin and waits for its answer, at most
// createTimeout.
func (o *origin) request(ctx context.Context, subject string, hdr, body []byte) (*server.JSApiConsumerCreateResponse, string, error) {
	e := o.c.e
	reply := "$JSC.R." + nuid.Next()
	got := make(chan *leaf.Msg, 1)
	sub, err := e.cfg.Link.Subscribe(reply, "", func(m *leaf.Msg) {
		select {
		case got <- m:
		default:
		}
	})
	if err != nil {
		return nil, "", err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := e.send(subject, reply, hdr, body); err != nil {
		return nil, "", err
	}
	t := e.clk.NewTimer(createTimeout)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil, "", ctx.Err()
	case <-t.C():
		return nil, "", fmt.Errorf("no answer from %s within %s", subject, createTimeout)
	case m := <-got:
		if len(m.Data) == 0 {
			return nil, "", fmt.Errorf("no responders on %s", subject)
		}
		var resp server.JSApiConsumerCreateResponse
		if err := json.Unmarshal(m.Data, &resp); err != nil {
			return nil, "", fmt.Errorf("consumer create answer: %w", err)
		}
		return &resp, jswire.HeaderValue(m.Header, server.JSStreamIdentity), nil
	}
}

// deleteConsumer deletes an origin's consumer without waiting for the answer, a single
// try: its inactive threshold removes it anyway.
func (o *origin) deleteConsumer(name string) {
	subject := o.apiSubject(fmt.Sprintf(server.JSApiConsumerDeleteT, o.src.Name, name))
	_ = o.c.e.send(subject, "", nil, nil)
}

// resumeSources reads where each source stopped from the Nats-Stream-Source headers of
// what the stream holds, newest first, as nats-server once did, until every source is
// found or the stream is read.
func (c *streamCopy) resumeSources(ctx context.Context) error {
	st, err := c.e.cfg.Store.State(ctx, c.s.ID())
	if err != nil || st.Msgs == 0 {
		return err
	}
	byKey := make(map[string]*origin, len(c.origins))
	for _, o := range c.origins {
		byKey[o.iname] = o
	}
	const window = 4096
	for hi := st.LastSeq; hi >= st.FirstSeq && len(byKey) > 0; {
		lo := st.FirstSeq
		if hi-lo >= window {
			lo = hi - window + 1
		}
		msgs, _, _, err := c.e.cfg.Store.ReadFiltered(ctx, pg.ReadParams{StreamID: c.s.ID(), From: lo, UpTo: hi, MaxMsgs: window}, nil)
		if err != nil {
			return err
		}
		for i := len(msgs) - 1; i >= 0 && len(byKey) > 0; i-- {
			f := strings.Fields(jswire.HeaderValue(msgs[i].Header, server.JSStreamSource))
			if len(f) < 4 {
				continue
			}
			key := f[0] + " " + f[2] + " " + f[3]
			o := byKey[key]
			if o == nil {
				continue
			}
			if seq, err := strconv.ParseUint(f[1], 10, 64); err == nil {
				o.mu.Lock()
				o.sseq, o.stored = seq, seq
				if len(f) >= 6 {
					o.ident = f[5]
				}
				o.mu.Unlock()
			}
			delete(byKey, key)
		}
		if lo == st.FirstSeq {
			break
		}
		hi = lo - 1
	}
	return nil
}
