// Package snapshot moves streams in and out of jetgres as JetStream backups: it owns the
// chunk transfers of $JS.API.STREAM.SNAPSHOT and $JS.API.STREAM.RESTORE with the flow
// control nats-server uses and `nats stream backup` / `nats stream restore` expect (Send,
// Receiver), and the passage between an archive (internal/jsarchive) and PostgreSQL:
// WriteArchive reads a stream in batches into an archive, Load stores an archive's messages
// in batches. Neither holds more than a window of chunks and a batch of messages, whatever
// the size of the stream. The API requests themselves, the stream's checks and its place
// in the registry, are bridge/jsapi's.
//
// # Goroutines
//
// Send runs on its caller's goroutine and takes flow-control acks on the link's read loop,
// where its handler only hands a slot back. A Receiver's handler runs on the link's read
// loop and never blocks: it queues a chunk for the Receiver's own goroutine, which writes it
// to the pipe its reader reads and then acks it, so that the client sends the next chunk
// only once the restore has taken the last one.
package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/nats-io/nuid"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/clock"
	"github.com/jetgres/jetgres/internal/jswire"
)

// nats-server's chunking of a snapshot (server/jetstream_api.go): the sizes a request may
// ask for are clamped to these bounds, and the window holds at least one chunk.
const (
	ChunkSizeDefault     = 128 << 10
	WindowSizeDefault    = 8 << 20
	minChunk, maxChunk   = 1 << 10, 1 << 20
	minWindow, maxWindow = 1 << 10, 32 << 20
	// AckTimeout is how long the sender waits for the receiver to ack a chunk before it
	// gives up, as nats-server does.
	AckTimeout = 5 * time.Second
	// interestWait is how long the sender waits for the receiver to subscribe the deliver
	// subject: the client subscribes only once it has the snapshot's response.
	interestWait = 2 * time.Second
	// poll is how often a wait for interest, or for room on the link, looks again.
	poll = 10 * time.Millisecond
)

// SendParams says where and how a snapshot's archive goes.
type SendParams struct {
	Link  *leaf.Conn
	Clock clock.Clock
	// Stream names the stream, for the ack subject.
	Stream string
	// Deliver is the request's deliver_subject.
	Deliver string
	// ChunkSize and WindowSize are the request's chunk_size and window_size; zero is the
	// default.
	ChunkSize, WindowSize int
}

// chunking applies nats-server's defaults and bounds: the chunk size and how many chunks
// may await their acks.
func chunking(chunk, window int) (size, inflight int) {
	if chunk == 0 {
		chunk = ChunkSizeDefault
	}
	if window == 0 {
		window = WindowSizeDefault
	}
	chunk = min(max(minChunk, chunk), maxChunk)
	window = max(min(max(minWindow, window), maxWindow), chunk)
	return chunk, window / chunk
}

// ErrNoInterest and ErrNoFlowResponse end a snapshot whose receiver went away or stopped
// acking.
var (
	ErrNoInterest     = errors.New("snapshot: no interest in the deliver subject")
	ErrNoFlowResponse = errors.New("snapshot: no flow response")
)

// Send sends what r yields to p.Deliver in chunks, each with a reply subject the receiver
// acks, never more than the window unacked; then an empty message with a status header:
// 204 when r ended, 500 and r's error when it failed, 408 when the receiver went away or
// stopped acking. It returns what ended the transfer (nil at r's end).
func Send(ctx context.Context, p SendParams, r io.Reader) error {
	clk := clock.OrSystem(p.Clock)
	chunkSize, inflight := chunking(p.ChunkSize, p.WindowSize)
	if err := waitInterest(ctx, p.Link, clk, p.Deliver); err != nil {
		return err
	}
	slots := make(chan struct{}, inflight)
	for range inflight {
		slots <- struct{}{}
	}
	ackSubj := "$JS.SNAPSHOT.ACK." + p.Stream + "." + nuid.Next()
	sub, err := p.Link.Subscribe(ackSubj+".>", "", func(*leaf.Msg) {
		select {
		case slots <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return fmt.Errorf("snapshot: subscribe to acks: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	end := func(status []byte, err error) error {
		_ = publish(ctx, p.Link, clk, p.Deliver, "", status, nil)
		return err
	}
	ackTimer := clk.NewTimer(AckTimeout)
	ackTimer.Stop()
	defer ackTimer.Stop()
	chunk := make([]byte, chunkSize)
	for index := 1; ; index++ {
		select {
		case <-slots:
		default:
			// The window is full: the receiver has AckTimeout to ack a chunk.
			ackTimer.Reset(AckTimeout)
			select {
			case <-slots:
			case <-ackTimer.C():
				return end(jswire.StatusHeader(408, "No Flow Response"), ErrNoFlowResponse)
			case <-ctx.Done():
				return end(jswire.StatusHeader(408, "No Interest"), ctx.Err())
			}
		}
		if !p.Link.HasQueueInterest(p.Deliver, "") {
			return end(jswire.StatusHeader(408, "No Interest"), ErrNoInterest)
		}
		n, rerr := io.ReadFull(r, chunk)
		if rerr != nil && !errors.Is(rerr, io.EOF) && !errors.Is(rerr, io.ErrUnexpectedEOF) {
			return end(jswire.StatusHeader(500, rerr.Error()), rerr)
		}
		if rerr != nil {
			// The last chunk goes without an ack subject, as nats-server sends it.
			if n > 0 {
				if err := publish(ctx, p.Link, clk, p.Deliver, "", nil, chunk[:n]); err != nil {
					return err
				}
			}
			return end(jswire.StatusHeader(204, ""), nil)
		}
		reply := ackSubj + "." + strconv.Itoa(n) + "." + strconv.Itoa(index)
		if err := publish(ctx, p.Link, clk, p.Deliver, reply, nil, chunk); err != nil {
			return err
		}
	}
}

// waitInterest waits a while for a subscription to subject, as nats-server does before it
// sends the first chunk. Only a subscription to subject itself counts: the client's
// response inbox covers it with a wildcard before the client subscribes it, and that
// subscription drops what it did not ask for. After the wait nats-server sends anyway, and
// the first chunk finds out.
func waitInterest(ctx context.Context, link *leaf.Conn, clk clock.Clock, subject string) error {
	_, err := retry(ctx, clk, interestWait, func() bool { return link.HasQueueInterest(subject, "") })
	return err
}

// publish sends one message, waiting for room while the link's outbound buffer is full
// (other traffic shares it), for at most AckTimeout.
func publish(ctx context.Context, link *leaf.Conn, clk clock.Clock, subject, reply string, hdr, data []byte) error {
	var err error
	done, werr := retry(ctx, clk, AckTimeout, func() bool {
		err = link.Publish(subject, reply, hdr, data)
		return !errors.Is(err, leaf.ErrSlowConsumer)
	})
	switch {
	case werr != nil:
		return werr
	case !done:
		return fmt.Errorf("snapshot: the link stayed full: %w", err)
	}
	return err
}

// retry calls try at once and then every poll until it reports done, for at most timeout
// on clk, and says whether it did.
func retry(ctx context.Context, clk clock.Clock, timeout time.Duration, try func() bool) (bool, error) {
	if try() {
		return true, nil
	}
	deadline := clk.NewTimer(timeout)
	defer deadline.Stop()
	tick := clk.NewTicker(poll)
	defer tick.Stop()
	for {
		select {
		case <-tick.C():
			if try() {
				return true, nil
			}
		case <-deadline.C():
			return false, nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}
