package pgtest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// NaiveBridgeSubjects is what a naive bridge serves: a request to any subject under it is
// stored.
const NaiveBridgeSubjects = "naive.>"

// naiveBridgeOK is a naive bridge's answer once it has stored a request.
const naiveBridgeOK = "+OK"

// NaiveBridge is the naive queue behind NATS, the baseline that anyone gets in an afternoon
// from a plain NATS server, or from a connector pipeline with a SQL output: responders in one
// queue group, each storing a request with one autocommit INSERT (Naive.Insert) before
// answering it. It keeps no sequence, no per-subject state and no de-duplication.
type NaiveBridge struct {
	nc     *nats.Conn
	closed chan struct{}
}

// ServeNaiveBridge connects to the NATS server at url and answers requests on
// NaiveBridgeSubjects with responders subscriptions, each of which delivers on a goroutine of
// its own, so that up to responders requests are stored at once.
func ServeNaiveBridge(url string, q *Naive, responders int) (*NaiveBridge, error) {
	closed := make(chan struct{})
	nc, err := nats.Connect(url, nats.Name("jetgres-naive-bridge"), nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		return nil, fmt.Errorf("naive bridge: connect: %w", err)
	}
	for range responders {
		if _, err := nc.QueueSubscribe(NaiveBridgeSubjects, "naive", func(m *nats.Msg) {
			reply := []byte(naiveBridgeOK)
			if err := q.Insert(context.Background(), m.Subject, m.Data); err != nil {
				reply = []byte(err.Error())
			}
			_ = m.Respond(reply)
		}); err != nil {
			nc.Close()
			return nil, fmt.Errorf("naive bridge: subscribe: %w", err)
		}
	}
	if err := nc.Flush(); err != nil {
		nc.Close()
		return nil, fmt.Errorf("naive bridge: %w", err)
	}
	return &NaiveBridge{nc: nc, closed: closed}, nil
}

// Close stops taking requests and returns once those taken are answered, so that nothing
// it started outlives it.
func (b *NaiveBridge) Close() {
	if err := b.nc.Drain(); err != nil {
		b.nc.Close()
	}
	<-b.closed
}

// NaiveBridgePublish is a publish to a naive bridge: a request on nc, which must name a
// subject under NaiveBridgeSubjects, answered once the message is stored.
func NaiveBridgePublish(ctx context.Context, nc *nats.Conn, subject string, data []byte) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	m, err := nc.RequestWithContext(ctx, subject, data)
	if err != nil {
		return err
	}
	if string(m.Data) != naiveBridgeOK {
		return errors.New("naive bridge: " + string(m.Data))
	}
	return nil
}
