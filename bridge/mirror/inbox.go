package mirror

import (
	"sync"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/wake"
)

// inboxBytes bounds what the link hands one origin before it is stored: twice the window
// of a nats-server push consumer's flow control (32 MiB), the most an origin sends before
// it waits for an answer. An inbox that overflows all the same makes the consumer start
// again from what is stored.
const inboxBytes = 64 << 20

// msgOverhead is what a queued message counts for beyond its subject, reply, header and
// data: the message and its slices.
const msgOverhead = 96

// inbox holds an origin's deliveries from the link's read goroutine, which must not wait,
// until the copying goroutine takes them.
type inbox struct {
	ready chan struct{} // poked when messages arrive

	mu       sync.Mutex // a leaf
	msgs     []*leaf.Msg
	bytes    int
	overflow bool
}

func newInbox() *inbox { return &inbox{ready: make(chan struct{}, 1)} }

// push queues m, or marks the inbox overflowed when it does not fit.
func (in *inbox) push(m *leaf.Msg) {
	n := len(m.Subject) + len(m.Reply) + len(m.Header) + len(m.Data) + msgOverhead
	in.mu.Lock()
	if in.bytes+n > inboxBytes {
		in.overflow = true
	} else {
		in.msgs = append(in.msgs, m)
		in.bytes += n
	}
	in.mu.Unlock()
	wake.Poke(in.ready)
}

// take moves what waits into dst, and reports whether the inbox overflowed.
func (in *inbox) take(dst []*leaf.Msg) ([]*leaf.Msg, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	dst = append(dst, in.msgs...)
	clear(in.msgs)
	in.msgs, in.bytes = in.msgs[:0], 0
	return dst, in.overflow
}
