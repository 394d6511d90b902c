package bridge

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/pg"
)

// BenchmarkStreamInfo is STREAM.INFO on a stream of 200,000 messages over 1,000 subjects,
// and over 20. recount is the database work every info did before infos kept their subject
// counts: the state read, a grouped read of every subject, the consumer count; it leaves
// out the NATS round trip the others pay. unchanged is an info of a stream no one wrote to
// since the last; appended follows one publish, deleted one message delete (which recounts:
// over 20 subjects by probing the subject indexes).
func BenchmarkStreamInfo(b *testing.B) {
	tb := setup(b)
	for _, subjects := range []int{1_000, 20} {
		b.Run(fmt.Sprintf("subjects=%d", subjects), func(b *testing.B) { benchStreamInfo(b, tb, subjects) })
	}
}

func benchStreamInfo(b *testing.B, tb *testBundle, subjects int) {
	const msgs, batch = 200_000, 10_000
	ctx := context.Background()
	name := fmt.Sprintf("INFO%d", subjects)
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}}); err != nil {
		b.Fatal(err)
	}
	s := tb.bridge.streams.Lookup(name)
	data := make([]byte, 64)
	for from := 0; from < msgs; from += batch {
		bt := pg.AppendBatch{StreamID: s.ID(), ChunkRows: s.ChunkRows()}
		for i := from; i < from+batch; i++ {
			bt.Msgs = append(bt.Msgs, pg.AppendMsg{Subject: fmt.Sprintf("%s.%d", name, i%subjects), Data: data})
		}
		if _, _, err := tb.db.Append(ctx, []pg.AppendBatch{bt}, time.Now().UnixNano()); err != nil {
			b.Fatal(err)
		}
	}
	stream, err := tb.js.Stream(ctx, name)
	if err != nil {
		b.Fatal(err)
	}
	info := func(b *testing.B) {
		got, err := stream.Info(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if got.State.NumSubjects != uint64(subjects) {
			b.Fatalf("num_subjects %d, want %d", got.State.NumSubjects, subjects)
		}
	}
	info(b)

	b.Run("recount", func(b *testing.B) {
		for b.Loop() {
			if _, err := tb.db.State(ctx, s.ID()); err != nil {
				b.Fatal(err)
			}
			totals, err := tb.db.SubjectTotals(ctx, s.ID(), ">")
			if err != nil {
				b.Fatal(err)
			}
			if len(totals) != subjects {
				b.Fatalf("%d subjects, want %d", len(totals), subjects)
			}
			if _, err := tb.db.CountConsumers(ctx, s.ID()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("unchanged", func(b *testing.B) {
		for b.Loop() {
			info(b)
		}
	})
	b.Run("appended", func(b *testing.B) {
		n := 0
		for b.Loop() {
			b.StopTimer()
			if _, err := tb.js.Publish(ctx, fmt.Sprintf("%s.%d", name, n%subjects), data); err != nil {
				b.Fatal(err)
			}
			n++
			b.StartTimer()
			info(b)
		}
	})
	b.Run("deleted", func(b *testing.B) {
		seq := uint64(1)
		for b.Loop() {
			b.StopTimer()
			if err := stream.DeleteMsg(ctx, seq); err != nil {
				b.Fatal(err)
			}
			seq++
			b.StartTimer()
			info(b)
		}
	})
}
