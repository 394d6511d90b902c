package bridge

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/pg/pgtest"
)

// BenchmarkLonePublish measures a lone synchronous publisher through the whole path (client,
// NATS server, link, bridge, PostgreSQL and back) against a bare INSERT committed on its own
// (pgtest.VersusInsert).
func BenchmarkLonePublish(b *testing.B) {
	tb := setup(b)
	if _, err := tb.js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "LONE", Subjects: []string{"lone.>"}}); err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 128)
	pgtest.VersusInsert(b, "publish", 2000, func(ctx context.Context) error {
		_, err := tb.js.Publish(ctx, "lone.x", data)
		return err
	})
}

// BenchmarkInsertBehindNATS is the floor under BenchmarkLonePublish: a request through the
// same embedded NATS server to an ordinary client that answers it after a bare INSERT of
// its own (pgtest.BareInsert), the least any gateway that stores a publish before
// answering it can do. Its ratio to the bare INSERT is what a lone publish through NATS
// cannot beat on the machine at hand.
func BenchmarkInsertBehindNATS(b *testing.B) {
	behindNATS(b, "behind", pgtest.BareInsert(b))
}

// BenchmarkStateBehindNATS is BenchmarkInsertBehindNATS with the responder's INSERT replaced
// by the least SQL a stream with dense sequences needs (pgtest.StateInsert: the state row
// moved and the message inserted, in one statement): the floor of a lone publish that keeps
// its stream's sequence dense, as jetgres does. BenchmarkLonePublish's ratio above it is
// jetgres's own; its ratio above BenchmarkInsertBehindNATS's is the state row's.
func BenchmarkStateBehindNATS(b *testing.B) {
	behindNATS(b, "state-behind", pgtest.StateInsert(b))
}

// behindNATS runs store behind a plain NATS request, against the bare INSERT.
func behindNATS(b *testing.B, what string, store func(ctx context.Context, data []byte) error) {
	tb := setup(b)
	responder, err := nats.Connect(tb.nats.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(responder.Close)
	// nats.go runs one subscription's handler on one goroutine, so store is never called
	// concurrently.
	if _, err := responder.Subscribe("behind.x", func(m *nats.Msg) {
		if err := store(context.Background(), m.Data); err != nil {
			b.Errorf("store: %v", err)
			return
		}
		_ = m.Respond(nil)
	}); err != nil {
		b.Fatal(err)
	}
	if err := responder.Flush(); err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 128)
	pgtest.VersusInsert(b, what, 2000, func(context.Context) error {
		_, err := tb.nc.Request("behind.x", data, 10*time.Second)
		return err
	})
}

// BenchmarkKVPut is BenchmarkLonePublish for a key-value put, each to a new key as `nats
// bench kv put` writes them: a publish into a stream with max_msgs_per_subject. Its ratio
// to the bare INSERT, set against BenchmarkLonePublish's from the same run, is what the
// per-subject limit costs.
func BenchmarkKVPut(b *testing.B) {
	tb := setup(b)
	kv, err := tb.js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: "LONEKV"})
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 128)
	key := 0
	pgtest.VersusInsert(b, "kvput", 2000, func(ctx context.Context) error {
		key++
		_, err := kv.Put(ctx, strconv.Itoa(key), data)
		return err
	})
}
