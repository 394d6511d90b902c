package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// apiTimeout bounds one JetStream API call (stream and consumer administration).
const apiTimeout = 30 * time.Second

// opTimeout bounds one publish or one naive INSERT: whatever happens, a publisher gives up
// on a call after this long, so every load ends by itself.
const opTimeout = 10 * time.Second

// client is one nats.go connection with its JetStream context: the same client code for
// every NATS target.
type client struct {
	nc *nats.Conn
	js jetstream.JetStream
}

func dial(url, name string, opts ...jetstream.JetStreamOpt) (*client, error) {
	// No reconnects: a target that went away should fail the measurement, not stall it.
	nc, err := nats.Connect(url, nats.Name(name), nats.NoReconnect(), nats.Timeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", url, err)
	}
	js, err := jetstream.New(nc, append([]jetstream.JetStreamOpt{jetstream.WithDefaultTimeout(apiTimeout)}, opts...)...)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("JetStream context on %s: %w", url, err)
	}
	return &client{nc: nc, js: js}, nil
}

func (c *client) close() { c.nc.Close() }

// createStream makes a file-backed stream, identical on every target.
func (c *client) createStream(ctx context.Context, name string, subjects ...string) (jetstream.Stream, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	s, err := c.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     name,
		Subjects: subjects,
		Storage:  jetstream.FileStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("create stream %s: %w", name, err)
	}
	return s, nil
}

// deleteStream removes a stream after its measurement, so that the next one starts from an
// empty store and the disk does not fill over a long run.
func (c *client) deleteStream(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	if err := c.js.DeleteStream(ctx, name); err != nil {
		return fmt.Errorf("delete stream %s: %w", name, err)
	}
	return nil
}

// stamped returns a payload of size bytes whose first eight hold t, the send time the
// end-to-end latency is measured from. Sender and receiver share this process's clock.
func stamped(size int, t time.Time) []byte {
	b := make([]byte, size)
	binary.LittleEndian.PutUint64(b, uint64(t.UnixNano()))
	return b
}

// stampOf reads the send time back from a payload made by stamped.
func stampOf(b []byte) (time.Time, bool) {
	if len(b) < 8 {
		return time.Time{}, false
	}
	return time.Unix(0, int64(binary.LittleEndian.Uint64(b))), true
}

// publishFunc is one synchronous publish as the closed-loop phases see it: nats.go's
// Publish for a NATS target, an INSERT for the naive baseline.
type publishFunc func(ctx context.Context, subject string, data []byte) error

func (r *runner) publisher(t *benchTarget, c *client) publishFunc {
	if t.naive != nil {
		return func(ctx context.Context, subject string, data []byte) error {
			return t.naive.Insert(ctx, subject, data)
		}
	}
	return func(ctx context.Context, subject string, data []byte) error {
		_, err := c.js.Publish(ctx, subject, data)
		return err
	}
}

// firstError keeps the first error reported to it, from any goroutine (ack callbacks,
// publishers). Read err only after the reporters are done or after a counter they bump.
type firstError struct {
	once sync.Once
	err  error
}

func (f *firstError) set(err error) { f.once.Do(func() { f.err = err }) }
