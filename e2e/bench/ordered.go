package bench

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The ordered readers that applications start up on, beside js.Subscribe's ordered
// consumer: each is an ordered consumer that a client library builds, drained from a
// backlog on every target in the same run.
const (
	// PushOrderedJS is the jetstream package's ordered consumer (OrderedConsumer, then
	// Consume) draining the push stream from its first message. It is one of PushModes.
	PushOrderedJS = "ordered, jetstream package"
	// PushKVWatch is kv.WatchAll on a bucket of Config.KVKeys keys, each put once with a
	// payload of Config.Size bytes, from the call until the watcher's nil entry says that
	// the initial values are done; the rate is keys per second.
	PushKVWatch = "kv watch, initial values"
	// PushObjectGet is the get of one object of Config.ObjectBytes, from the call until its
	// last byte is read; the rate counts its chunks (nats.go's 128 KiB each) per second.
	PushObjectGet = "object get"
)

// OrderedReads lists the ordered readers measured after the push modes, in report order.
var OrderedReads = []string{PushKVWatch, PushObjectGet}

// objectChunk is nats.go's default object chunk size.
const objectChunk = 128 << 10

// readTarget is one target's key-value bucket and object store, filled once.
type readTarget struct {
	t   *benchTarget
	c   *client
	kv  jetstream.KeyValue
	obs jetstream.ObjectStore
}

// consumeOrdered drains the push stream with the jetstream package's ordered consumer and
// counts the deliveries as pushDrain does; the time runs from the consumer's creation.
func (r *runner) consumeOrdered(ctx context.Context, p *pushTarget) (int, time.Duration, error) {
	var got atomic.Int64
	done := make(chan struct{})
	want := int64(p.total)
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	cons, err := p.c.js.OrderedConsumer(cctx, "BENCH_PUSH", jetstream.OrderedConsumerConfig{})
	cancel()
	if err != nil {
		return 0, 0, fmt.Errorf("ordered consumer: %w", err)
	}
	cc, err := cons.Consume(func(jetstream.Msg) {
		r.prog.add(1)
		if got.Add(1) == want {
			close(done)
		}
	})
	if err != nil {
		return 0, 0, fmt.Errorf("consume: %w", err)
	}
	defer cc.Stop()
	timer := time.NewTimer(r.cfg.Duration)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	return int(got.Load()), time.Since(start), nil
}

// runOrderedReads measures PushKVWatch and PushObjectGet on the NATS targets, in turns of
// alternating order as the push modes, with the CPU time each cost.
func (r *runner) runOrderedReads(ctx context.Context, meter *cpuMeter) {
	var rs []*readTarget
	for _, t := range r.targets {
		if t.naive != nil || t.name == TargetJetStreamSync {
			continue
		}
		rt, err := r.fillForReads(ctx, t)
		if err != nil {
			r.fail(SectionPush+" ordered reads", t, err)
			continue
		}
		defer rt.c.close()
		defer r.cleanup(t, rt.c.deleteStream, "KV_BENCH_KV")
		defer r.cleanup(t, rt.c.deleteStream, "OBJ_BENCH_OBJ")
		rs = append(rs, rt)
	}
	measures := map[string]func(context.Context, *readTarget) (int, time.Duration, error){
		PushKVWatch: r.watchAll, PushObjectGet: r.getObject,
	}
	for _, mode := range OrderedReads {
		msgs := make(map[*readTarget]int)
		spent := make(map[*readTarget]time.Duration)
		cpu := make(map[*readTarget]cpuSample)
		failed := make(map[*readTarget]error)
		for turn := range pushTurns {
			for _, rt := range turnOrder(rs, turn) {
				if failed[rt] != nil || ctx.Err() != nil {
					continue
				}
				r.prog.phase(fmt.Sprintf("push, %-12s %s, turn %d of %d", mode, rt.t.name, turn+1, pushTurns), 0, r.cfg.Duration)
				s0 := meter.sample()
				n, d, err := measures[mode](ctx, rt)
				if err != nil {
					failed[rt] = err
					continue
				}
				msgs[rt] += n
				spent[rt] += d
				cpu[rt] = cpu[rt].add(meter.sample().since(s0))
			}
		}
		for _, rt := range rs {
			if failed[rt] != nil {
				r.fail(SectionPush+" "+mode, rt.t, failed[rt])
				continue
			}
			if msgs[rt] > 0 {
				r.rep.Push = append(r.rep.Push, pushResult(&pushTarget{t: rt.t}, mode, msgs[rt], spent[rt], cpu[rt]))
			}
		}
	}
}

// fillForReads creates the bucket and the object store and fills them: Config.KVKeys keys
// published asynchronously to the bucket's subjects, then one object of Config.ObjectBytes.
// On success the caller closes the client and deletes both streams.
func (r *runner) fillForReads(ctx context.Context, t *benchTarget) (*readTarget, error) {
	c, err := dial(t.url, "jetgres-bench-ordered")
	if err != nil {
		return nil, err
	}
	rt := &readTarget{t: t, c: c}
	if err := r.fillReads(ctx, rt); err != nil {
		// What was not created yet cannot be deleted: nothing to report there.
		_ = c.deleteStream("KV_BENCH_KV")
		_ = c.deleteStream("OBJ_BENCH_OBJ")
		c.close()
		return nil, err
	}
	return rt, nil
}

func (r *runner) fillReads(ctx context.Context, rt *readTarget) error {
	actx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	kv, err := rt.c.js.CreateKeyValue(actx, jetstream.KeyValueConfig{Bucket: "BENCH_KV", Storage: jetstream.FileStorage})
	if err != nil {
		return fmt.Errorf("create bucket: %w", err)
	}
	obs, err := rt.c.js.CreateObjectStore(actx, jetstream.ObjectStoreConfig{Bucket: "BENCH_OBJ", Storage: jetstream.FileStorage})
	if err != nil {
		return fmt.Errorf("create object store: %w", err)
	}
	rt.kv, rt.obs = kv, obs
	r.prog.phase(fmt.Sprintf("push: filling a bucket of %d keys on %s", r.cfg.KVKeys, rt.t.name), int64(r.cfg.KVKeys), 0)
	payload := make([]byte, r.cfg.Size)
	subject := make([]byte, 0, 32)
	for i := range r.cfg.KVKeys {
		subject = strconv.AppendInt(append(subject[:0], "$KV.BENCH_KV.k"...), int64(i), 10)
		_, err := rt.c.js.PublishAsync(string(subject), payload, jetstream.WithStallWait(opTimeout))
		if err != nil {
			return fmt.Errorf("put key %d: %w", i, err)
		}
		r.prog.add(1)
	}
	select {
	case <-rt.c.js.PublishAsyncComplete():
	case <-time.After(drainTimeout):
		return fmt.Errorf("%d puts unanswered %s after the last", rt.c.js.PublishAsyncPending(), drainTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
	r.prog.phase(fmt.Sprintf("push: putting an object of %d bytes on %s", r.cfg.ObjectBytes, rt.t.name), int64(r.cfg.ObjectBytes), 0)
	return r.putObject(ctx, rt.c)
}

// objectWindow bounds the chunks that putObject has in flight: 4 MiB.
const objectWindow = 32

// putObject stores the object as nats.go's Put lays it out, its chunks on one subject and
// then its info with the digest that Get checks, but with objectWindow chunks in flight.
// Put publishes every chunk before it waits for the first ack: 100 MiB at once, more than
// jetgres's intake takes before it sheds load (bridge.IntakeBytesDefault).
func (r *runner) putObject(ctx context.Context, c *client) error {
	js, err := jetstream.New(c.nc, jetstream.WithDefaultTimeout(apiTimeout), jetstream.WithPublishAsyncMaxPending(objectWindow))
	if err != nil {
		return err
	}
	const bucket, name, id = "BENCH_OBJ", "blob", "BENCHOBJECTCHUNKS"
	subject := "$O." + bucket + ".C." + id
	chunk := make([]byte, objectChunk)
	h := sha256.New()
	chunks := 0
	for sent := 0; sent < r.cfg.ObjectBytes; chunks++ {
		n := min(objectChunk, r.cfg.ObjectBytes-sent)
		if _, err := js.PublishAsync(subject, chunk[:n], jetstream.WithStallWait(opTimeout)); err != nil {
			return fmt.Errorf("put object chunk %d: %w", chunks+1, err)
		}
		h.Write(chunk[:n])
		sent += n
		r.prog.add(int64(n))
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(drainTimeout):
		return fmt.Errorf("put object: %d chunks unanswered %s after the last", js.PublishAsyncPending(), drainTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
	info, err := json.Marshal(jetstream.ObjectInfo{
		ObjectMeta: jetstream.ObjectMeta{Name: name, Opts: &jetstream.ObjectMetaOptions{ChunkSize: objectChunk}},
		Bucket:     bucket, NUID: id, Size: uint64(r.cfg.ObjectBytes), ModTime: time.Now().UTC(),
		Chunks: uint32(chunks), Digest: jetstream.GetObjectDigestValue(h),
	})
	if err != nil {
		return err
	}
	m := nats.NewMsg("$O." + bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(name)))
	m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	m.Data = info
	pctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	if _, err := js.PublishMsg(pctx, m); err != nil {
		return fmt.Errorf("put object info: %w", err)
	}
	return nil
}

// watchAll reads the bucket's initial values with kv.WatchAll and counts them up to the nil
// entry that ends them.
func (r *runner) watchAll(ctx context.Context, rt *readTarget) (int, time.Duration, error) {
	start := time.Now()
	w, err := rt.kv.WatchAll(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("watch: %w", err)
	}
	defer func() { _ = w.Stop() }()
	timer := time.NewTimer(r.cfg.Duration)
	defer timer.Stop()
	n := 0
	for {
		select {
		case e := <-w.Updates():
			if e != nil {
				n++
				r.prog.add(1)
				continue
			}
			if n != r.cfg.KVKeys {
				return 0, 0, fmt.Errorf("watch: %d initial values of %d keys", n, r.cfg.KVKeys)
			}
			return n, time.Since(start), nil
		case <-timer.C:
			return 0, 0, fmt.Errorf("watch: %d of %d initial values within %v", n, r.cfg.KVKeys, r.cfg.Duration)
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		}
	}
}

// getObject reads the object to its end and counts its chunks.
func (r *runner) getObject(ctx context.Context, rt *readTarget) (int, time.Duration, error) {
	gctx, cancel := context.WithTimeout(ctx, r.cfg.Duration)
	defer cancel()
	start := time.Now()
	res, err := rt.obs.Get(gctx, "blob")
	if err != nil {
		return 0, 0, fmt.Errorf("get object: %w", err)
	}
	n, err := io.Copy(io.Discard, res)
	spent := time.Since(start)
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	if err == nil && n != int64(r.cfg.ObjectBytes) {
		err = errors.New("short read")
	}
	if err != nil {
		return 0, 0, fmt.Errorf("get object: %d of %d bytes: %w", n, r.cfg.ObjectBytes, err)
	}
	return (r.cfg.ObjectBytes + objectChunk - 1) / objectChunk, spent, nil
}
