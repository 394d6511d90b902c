package mirror

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nuid"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jswire"
)

const (
	// batchMsgs and batchBytes bound one store.
	batchMsgs  = 4096
	batchBytes = 4 << 20
)

// streamCopy is the copying into one stream: its mirror, or each of its sources.
type streamCopy struct {
	e       *Engine
	s       *stream.Stream
	key     string
	origins []*origin
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	// infoSub answers the other replicas' stream info while the copy runs.
	infoSub *leaf.Subscription

	// resumed says where each source stopped was read from the stream, once for all of
	// them, before any consumer is created: a source must not start over.
	resumeMu sync.Mutex
	resumed  bool
}

// resume reads where the sources stopped, unless that was done; an error leaves it to the
// next attempt.
func (c *streamCopy) resume(ctx context.Context) error {
	c.resumeMu.Lock()
	defer c.resumeMu.Unlock()
	if c.resumed {
		return nil
	}
	if err := c.resumeSources(ctx); err != nil {
		return fmt.Errorf("reading where the sources stopped: %w", err)
	}
	c.resumed = true
	return nil
}

func newStreamCopy(e *Engine, s *stream.Stream) *streamCopy {
	cfg := s.ConfigView()
	c := &streamCopy{e: e, s: s, key: copyKey(cfg)}
	if cfg.Mirror != nil {
		c.origins = []*origin{newOrigin(c, cfg.Mirror, true)}
		return c
	}
	for _, src := range cfg.Sources {
		c.origins = append(c.origins, newOrigin(c, src, false))
	}
	return c
}

func (c *streamCopy) start(ctx context.Context) {
	ctx, c.cancel = context.WithCancel(ctx)
	c.serveInfo()
	for _, o := range c.origins {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			o.run(ctx)
		}()
	}
}

func (c *streamCopy) stop() {
	if c.infoSub != nil {
		_ = c.infoSub.Unsubscribe()
	}
	if c.cancel != nil {
		c.cancel()
	}
	c.wg.Wait()
}

// retire deletes the origins' consumers of a stopped copy that the stream's configuration
// no longer has (keep lists the keys of those it has), as nats-server deletes them once a
// mirror or source is removed. The others are left to their inactive threshold, as after
// a retry: a consumer of the origin is never deleted while it may still be needed.
func (c *streamCopy) retire(keep map[string]bool) {
	for _, o := range c.origins {
		o.mu.Lock()
		name := o.cname
		o.mu.Unlock()
		if name != "" && !keep[o.iname] {
			o.deleteConsumer(name)
		}
	}
}

// origin copies from one origin stream: a mirror's, or one source's.
type origin struct {
	c      *streamCopy
	src    server.StreamSource
	mirror bool
	// iname is the source's key (jswire.SourceKey); its first word names the origin in
	// the Nats-Stream-Source header.
	iname string
	trs   []server.SubjectTransformer

	// heard is when (unix ns) the origin was last heard from: a delivery, a heartbeat, or
	// the answer to the consumer create; 0 for never.
	heard atomic.Int64

	mu sync.Mutex // guards what info reports
	// sseq is the last origin sequence taken, dseq the last delivery sequence of the
	// current consumer, cname its name.
	sseq, dseq uint64
	// stored is, for a source, the last origin sequence stored, which info reports.
	stored uint64
	cname  string
	lag    uint64
	err    *server.ApiError
	fails  int
	// ident is the origin's identity (Nats-Stream-Identity) as its consumer create
	// answer gave it.
	ident string
}

func newOrigin(c *streamCopy, src *server.StreamSource, mirror bool) *origin {
	o := &origin{c: c, src: *src, mirror: mirror, iname: jswire.SourceKey(src)}
	for _, tr := range src.SubjectTransforms {
		t, err := server.NewSubjectTransform(tr.Source, tr.Destination)
		if err == nil {
			o.trs = append(o.trs, t)
		}
	}
	return o
}

// info is the origin's StreamSourceInfo at now.
func (o *origin) info(now time.Time) *server.StreamSourceInfo {
	o.mu.Lock()
	defer o.mu.Unlock()
	si := &server.StreamSourceInfo{Name: o.src.Name, Lag: o.lag, Error: o.err, FilterSubject: o.src.FilterSubject, Active: -1}
	if heard := o.heard.Load(); heard != 0 {
		si.Active = now.Sub(time.Unix(0, heard))
	}
	if !o.mirror {
		si.Seq = o.stored
	}
	si.SubjectTransforms = make([]server.SubjectTransformConfig, len(o.src.SubjectTransforms))
	copy(si.SubjectTransforms, o.src.SubjectTransforms)
	if ext := o.src.External; ext != nil {
		si.External = &server.ExternalStream{ApiPrefix: ext.ApiPrefix, DeliverPrefix: ext.DeliverPrefix}
	}
	return si
}

// run creates the origin's consumer and copies what it delivers, again and again after
// nats-server's back-off, until ctx ends.
func (o *origin) run(ctx context.Context) {
	clk := o.c.e.clk
	for {
		started := clk.Now()
		err := o.session(ctx)
		if ctx.Err() != nil {
			return
		}
		o.mu.Lock()
		var apiErr *server.ApiError
		if errors.As(err, &apiErr) {
			o.err = apiErr
			o.fails++
		} else if errors.Is(err, errRetry) {
			o.fails = 0
		} else {
			o.fails++
		}
		wait := retryThreshold - clk.Now().Sub(started)
		if o.fails > 0 {
			wait = max(wait, 0) + min(retryBackOff*time.Duration(o.fails*2), retryMaximum)
		}
		o.mu.Unlock()
		if !errors.Is(err, errRetry) {
			o.c.e.log.Warn("copying from an origin failed", "stream", o.c.s.Name(), "origin", o.src.Name, "err", err)
		}
		t := clk.NewTimer(max(wait, 100*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// errRetry ends a session to create the consumer again at once: a gap, a stall, an
// overflow.
var errRetry = errors.New("mirror: consumer to be created again")

// session is one consumer's life: create it and copy until something goes wrong. The
// consumer is left to its inactive threshold, as nats-server leaves it after a retry.
func (o *origin) session(ctx context.Context) error {
	e := o.c.e
	start, err := o.startSeq(ctx)
	if err != nil {
		return err
	}
	deliver := o.deliverSubject()
	in := newInbox()
	sub, err := e.cfg.Link.Subscribe(deliver, "", func(m *leaf.Msg) {
		o.heard.Store(e.clk.Now().UnixNano())
		in.push(m)
	})
	if err != nil {
		return server.NewJSMirrorConsumerSetupFailedError(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	ci, err := o.create(ctx, deliver, start)
	if err != nil {
		return err
	}
	o.mu.Lock()
	o.cname, o.dseq, o.err = ci.Name, 0, nil
	o.sseq = max(o.sseq, ci.Delivered.Stream)
	o.mu.Unlock()
	o.heard.Store(e.clk.Now().UnixNano())
	if o.mirror {
		if err := o.skipTo(ctx, ci.Delivered.Stream); err != nil {
			return err
		}
	}
	check := e.clk.NewTicker(HealthInterval / 4)
	defer check.Stop()
	var b batch
	var msgs []*leaf.Msg
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-check.C():
			if silent := e.clk.Now().Sub(time.Unix(0, o.heard.Load())); silent > HealthInterval {
				return fmt.Errorf("%w: the origin was silent for %s", errRetry, silent.Round(time.Second))
			}
			continue
		case <-in.ready:
		}
		var overflow bool
		msgs, overflow = in.take(msgs[:0])
		if overflow {
			return fmt.Errorf("%w: more deliveries than the inbox holds", errRetry)
		}
		b.reset()
		for _, m := range msgs {
			if err := o.take(ctx, m, &b); err != nil {
				return err
			}
			if b.full() {
				if err := o.store(ctx, &b); err != nil {
					return err
				}
				b.reset()
			}
		}
		clear(msgs)
		if err := o.store(ctx, &b); err != nil {
			return err
		}
	}
}

// deliverSubject is a fresh inbox for the consumer's deliveries, as nats-server makes it:
// $JS.M.<random> for a mirror, $JS.S.<random> for a source, under the external deliver
// prefix when there is one.
func (o *origin) deliverSubject() string {
	kind := ".S."
	if o.mirror {
		kind = ".M."
	}
	pfx := "$JS"
	if ext := o.src.External; ext != nil && ext.DeliverPrefix != "" {
		pfx = ext.DeliverPrefix
	}
	return strings.ReplaceAll(pfx+kind+nuid.Next(), "..", ".")
}

// apiSubject is an API subject of the origin, under the external API prefix when there is
// one.
func (o *origin) apiSubject(subject string) string {
	if ext := o.src.External; ext != nil && ext.ApiPrefix != "" {
		subject = strings.Replace(subject, server.JSApiPrefix, ext.ApiPrefix, 1)
		subject = strings.ReplaceAll(subject, "..", ".")
	}
	return subject
}

// take applies one delivery to the batch, as nats-server's processInboundMirrorMsg and
// processInboundSourceMsg do; a flow-control request is answered once what came before it
// is stored.
func (o *origin) take(ctx context.Context, m *leaf.Msg, b *batch) error {
	e := o.c.e
	if isControl(m) {
		if m.Reply != "" {
			if err := o.store(ctx, b); err != nil {
				return err
			}
			b.reset()
			o.mu.Lock()
			dseq, sseq := o.dseq, o.sseq
			o.mu.Unlock()
			hdr := fmt.Appendf(nil, "NATS/1.0\r\n%s: %d\r\n%s: %d\r\n\r\n", server.JSLastConsumerSeq, dseq, server.JSLastStreamSeq, sseq)
			if strings.HasPrefix(m.Reply, jswire.FCPrefix) {
				_ = e.send(m.Reply, "", hdr, nil)
			}
			return nil
		}
		if v := jswire.HeaderValue(m.Header, server.JSLastConsumerSeq); v != "" {
			o.mu.Lock()
			dseq := o.dseq
			o.mu.Unlock()
			if n, err := strconv.ParseUint(v, 10, 64); err == nil && n > 0 && n != dseq {
				return fmt.Errorf("%w: the origin delivered %d, %d arrived", errRetry, n, dseq)
			}
		}
		if fc := jswire.HeaderValue(m.Header, server.JSConsumerStalled); strings.HasPrefix(fc, jswire.FCPrefix) {
			if err := o.store(ctx, b); err != nil {
				return err
			}
			b.reset()
			_ = e.send(fc, "", nil, nil)
		}
		return nil
	}
	reply, subject := m.Reply, m.Subject
	if i := ackDeliverIndex(reply); i >= 0 {
		reply, subject = reply[:i], reply[i+1:]
	}
	ack, ok := jswire.ParseAckSubject(reply)
	if !ok || ack.Delivered > 1 {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if ack.Consumer != o.cname {
		return nil
	}
	switch {
	case ack.StreamSeq <= o.sseq:
		if ack.ConsumerSeq == o.dseq+1 {
			o.dseq++
		}
		return nil
	case o.mirror && ack.StreamSeq == o.sseq+1, !o.mirror && ack.ConsumerSeq == o.dseq+1:
	case o.mirror && ack.ConsumerSeq == o.dseq+1:
		// The origin deleted or expired what lies between: the mirror keeps the gap.
	default:
		return fmt.Errorf("%w: delivery %d of origin sequence %d after delivery %d of %d", errRetry, ack.ConsumerSeq, ack.StreamSeq, o.dseq, o.sseq)
	}
	o.dseq, o.sseq = ack.ConsumerSeq, ack.StreamSeq
	if ack.Pending == 0 {
		o.lag = 0
	} else {
		o.lag = ack.Pending - 1
	}
	orig := subject
	subject = o.transform(subject)
	hdr := stripHeaders(m.Header, !o.mirror)
	if o.mirror {
		b.add(ack.StreamSeq, ack.TS, subject, hdr, m.Data)
		return nil
	}
	hdr = jswire.AppendHeaders(hdr, server.JSStreamSource, o.sourceHeader(ack.StreamSeq, orig))
	b.add(ack.StreamSeq, 0, subject, hdr, m.Data)
	return nil
}

// sourceHeader is the Nats-Stream-Source header of a sourced message, as nats-server's
// genSourceHeader writes it: the origin (with the hash of its API prefix), the origin
// sequence, the source's filters and destinations, the subject at the origin, and the
// origin's identity when its consumer create answer named one. mu is held.
func (o *origin) sourceHeader(seq uint64, orig string) string {
	parts := strings.SplitN(o.iname, " ", 3)
	h := parts[0] + " " + strconv.FormatUint(seq, 10) + " " + parts[1] + " " + parts[2] + " " + orig
	if o.ident != "" {
		h += " " + o.ident
	}
	return h
}

func (o *origin) transform(subject string) string {
	for _, tr := range o.trs {
		if to, err := tr.Match(subject); err == nil {
			return to
		}
	}
	return subject
}

// isControl reports whether m is a status message: an idle heartbeat or a flow-control
// request, a 100 status without data.
func isControl(m *leaf.Msg) bool {
	return len(m.Data) == 0 && bytes.HasPrefix(m.Header, []byte("NATS/1.0 100"))
}

// ackDeliverIndex is where the "@<subject>" a server appends to a JetStream delivery's
// ack reply starts, after its eight dots, or -1.
func ackDeliverIndex(reply string) int {
	if !strings.HasPrefix(reply, jswire.AckPrefix) {
		return -1
	}
	dots := 0
	for i := 0; i < len(reply); i++ {
		switch reply[i] {
		case '.':
			dots++
		case '@':
			if dots >= 8 {
				return i
			}
		}
	}
	return -1
}

// stripHeaders removes from a copied message's headers what nats-server removes: the
// Nats-Expected-* and Nats-Batch-* checks, which were the origin's, and for a source an
// earlier Nats-Stream-Source of a daisy chain. A block left with no header goes.
func stripHeaders(hdr []byte, source bool) []byte {
	if len(hdr) == 0 {
		return nil
	}
	lines := strings.Split(strings.TrimSuffix(string(hdr), "\r\n\r\n"), "\r\n")
	kept := lines[:1]
	dropped := false
	for _, l := range lines[1:] {
		key, _, _ := strings.Cut(l, ":")
		if strings.HasPrefix(key, "Nats-Expected-") || strings.HasPrefix(key, "Nats-Batch-") || source && key == server.JSStreamSource {
			dropped = true
			continue
		}
		kept = append(kept, l)
	}
	if !dropped {
		return hdr
	}
	if len(kept) == 1 && kept[0] == "NATS/1.0" {
		return nil
	}
	return []byte(strings.Join(kept, "\r\n") + "\r\n\r\n")
}
