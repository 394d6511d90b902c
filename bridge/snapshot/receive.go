package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nuid"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/clock"
)

// IdleTimeout is how long a restore waits for the client's next chunk before it gives up,
// as nats-server does.
const IdleTimeout = 5 * time.Second

// queued bounds the chunks waiting for the Receiver's goroutine. The client sends a chunk
// only once the last one is acked, so one is all that ever waits; a client that does not
// wait is refused rather than buffered.
const queued = 4

// ErrStalled ends a restore whose client stopped sending.
var ErrStalled = errors.New("snapshot: restore stalled: no chunk for " + IdleTimeout.String())

var errOverrun = errors.New("snapshot: restore chunks sent without waiting for their acks")

type chunk struct {
	data  []byte
	reply string
}

// Receiver takes the chunks of a restore sent to its subject, in order, and gives them to
// whoever reads it. Each chunk is acked once the reader has taken it; the empty message that
// ends the upload is answered by Done, with the restore's result.
type Receiver struct {
	ctx     context.Context
	link    *leaf.Conn
	clk     clock.Clock
	subject string
	sub     *leaf.Subscription
	pr      *io.PipeReader
	pw      *io.PipeWriter
	in      chan chunk
	quit    chan struct{}
	pumped  chan struct{}
	// answer is the result Done was given, for chunks that arrive after it; answered hears
	// when the handler sent it.
	answer   atomic.Pointer[[]byte]
	answered chan struct{}

	mu sync.Mutex
	// last is the reply subject Done answers: the empty message's, or that of the chunk
	// whose write failed.
	last string
	done bool
}

// NewReceiver subscribes a new restore subject for stream and starts taking chunks on it.
// It returns once the server has the subscription, so that the client's first chunk finds
// it; ctx bounds that wait, and ending it ends the restore as a stall does.
func NewReceiver(ctx context.Context, link *leaf.Conn, clk clock.Clock, stream string) (*Receiver, error) {
	pr, pw := io.Pipe()
	r := &Receiver{
		ctx:     ctx,
		link:    link,
		clk:     clock.OrSystem(clk),
		subject: "$JS.SNAPSHOT.RESTORE." + stream + "." + nuid.Next(),
		pr:      pr,
		pw:      pw,
		in:      make(chan chunk, queued),
		quit:    make(chan struct{}),
		pumped:  make(chan struct{}),

		answered: make(chan struct{}, 1),
	}
	sub, err := link.Subscribe(r.subject, "", r.handle)
	if err != nil {
		return nil, fmt.Errorf("snapshot: subscribe to %s: %w", r.subject, err)
	}
	r.sub = sub
	if err := link.Flush(ctx); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("snapshot: subscribe to %s: %w", r.subject, err)
	}
	go r.pump()
	return r, nil
}

// Subject is where the client sends the chunks: the restore response's deliver_subject.
func (r *Receiver) Subject() string { return r.subject }

// Reader yields the chunks' bytes in order; it ends at the client's empty message, or with
// ErrStalled.
func (r *Receiver) Reader() io.Reader { return r.pr }

// handle runs on the link's read loop: it queues, never waits.
func (r *Receiver) handle(m *leaf.Msg) {
	if m.Reply == "" {
		// A chunk nobody can ack cannot be flow controlled; nats-server ends the restore too.
		r.fail(errors.New("snapshot: restore chunk without a reply subject"))
		return
	}
	if a := r.answer.Load(); a != nil {
		_ = r.link.Publish(m.Reply, "", nil, *a)
		select {
		case r.answered <- struct{}{}:
		default:
		}
		return
	}
	select {
	case r.in <- chunk{data: m.Data, reply: m.Reply}:
	default:
		r.fail(errOverrun)
	}
}

// fail ends the input with err: the reader sees it at its next read.
func (r *Receiver) fail(err error) { r.pw.CloseWithError(err) }

// pump writes the queued chunks to the pipe, acking each once the reader took it, until the
// empty message, a failed write, Done, or IdleTimeout without a chunk.
func (r *Receiver) pump() {
	defer close(r.pumped)
	idle := r.clk.NewTimer(IdleTimeout)
	defer idle.Stop()
	for {
		select {
		case c := <-r.in:
			if len(c.data) == 0 {
				r.setLast(c.reply)
				r.pw.Close()
				return
			}
			if _, err := r.pw.Write(c.data); err != nil {
				r.setLast(c.reply)
				return
			}
			_ = r.link.Publish(c.reply, "", nil, nil)
			idle.Reset(IdleTimeout)
		case <-idle.C():
			r.fail(ErrStalled)
			return
		case <-r.quit:
			return
		case <-r.ctx.Done():
			r.fail(r.ctx.Err())
			return
		}
	}
}

func (r *Receiver) setLast(reply string) {
	r.mu.Lock()
	r.last = reply
	r.mu.Unlock()
}

// Done ends the restore with its result, the response the client's last message gets: the
// reader is closed (a failed restore's err ends an upload still under way), and resp is
// sent to the empty message that ended the upload, or to the chunk whose write failed, or,
// when the client has not sent either yet, to whatever it sends next (within
// IdleTimeout), as nats-server answers a restore that failed before the upload ended.
// Then the chunk subject is unsubscribed. Safe to call more than once; only the first
// counts.
func (r *Receiver) Done(resp []byte, err error) {
	r.mu.Lock()
	if r.done {
		r.mu.Unlock()
		return
	}
	r.done = true
	r.mu.Unlock()
	defer func() { _ = r.sub.Unsubscribe() }()
	r.answer.Store(&resp)
	if err == nil {
		err = io.ErrClosedPipe
	}
	r.pr.CloseWithError(err)
	close(r.quit)
	<-r.pumped
	owed := false
	// A chunk queued before the pump stopped is owed the answer as well.
	for drained := false; !drained; {
		select {
		case c := <-r.in:
			if len(c.data) == 0 {
				r.setLast(c.reply)
			} else {
				_ = r.link.Publish(c.reply, "", nil, resp)
				owed = true
			}
		default:
			drained = true
		}
	}
	r.mu.Lock()
	last := r.last
	r.mu.Unlock()
	if last != "" {
		_ = r.link.Publish(last, "", nil, resp)
		return
	}
	if owed {
		return
	}
	t := r.clk.NewTimer(IdleTimeout)
	defer t.Stop()
	select {
	case <-r.answered:
	case <-t.C():
	case <-r.ctx.Done():
	}
}

// WaitEnd waits, for at most IdleTimeout, for the empty message that ends the upload, once
// the reader has found the archive's end: the client sends it after the last chunk's ack.
// It reports whether it came.
func (r *Receiver) WaitEnd() bool {
	t := r.clk.NewTimer(IdleTimeout)
	defer t.Stop()
	select {
	case <-r.pumped:
	case <-t.C():
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last != ""
}
