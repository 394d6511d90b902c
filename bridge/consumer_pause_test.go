package bridge

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Pausing a consumer, at creation and through the pause API, against JetStream: while
// paused nothing is delivered (a fetch that waits gets nothing, a no-wait fetch the same as
// from JetStream); resuming, or a pause that has passed, delivers again.
func TestConsumerPauseMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "PS", Subjects: []string{"ps.>"}})
	tw.pubN("ps.a", 6, 8)
	later := time.Now().Add(time.Hour)
	cons, _ := tw.consumer("PS", jetstream.ConsumerConfig{Durable: "P", AckPolicy: jetstream.AckExplicitPolicy, PauseUntil: &later})
	type view struct {
		fetched, noWait int
		paused          bool
		until           time.Time
	}
	look := func(step string) {
		t.Helper()
		var v [2]view
		for side, c := range cons {
			b, err := c.Fetch(2, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				t.Fatalf("%s: %s: fetch: %v", sideName[side], step, err)
			}
			for m := range b.Messages() {
				v[side].fetched++
				_ = m.DoubleAck(tw.ctx)
			}
			b, err = c.FetchNoWait(1)
			if err != nil {
				t.Fatalf("%s: %s: fetch no wait: %v", sideName[side], step, err)
			}
			for m := range b.Messages() {
				v[side].noWait++
				_ = m.DoubleAck(tw.ctx)
			}
			info, err := c.Info(tw.ctx)
			if err != nil {
				t.Fatal(err)
			}
			v[side].paused = info.Paused
			if info.Paused && info.PauseRemaining <= 0 {
				t.Errorf("%s: %s: paused with %v remaining", sideName[side], step, info.PauseRemaining)
			}
			if info.Config.PauseUntil != nil {
				v[side].until = *info.Config.PauseUntil
			}
		}
		if v[ours] != v[theirs] {
			t.Errorf("%s:\n jetgres   %+v\n JetStream %+v", step, v[ours], v[theirs])
		}
	}
	look("created paused")
	pause := func(step string, until time.Time) {
		t.Helper()
		var resp [2]*jetstream.ConsumerPauseResponse
		for side, js := range tw.js {
			var err error
			if until.IsZero() {
				resp[side], err = js.ResumeConsumer(tw.ctx, "PS", "P")
			} else {
				resp[side], err = js.PauseConsumer(tw.ctx, "PS", "P", until)
			}
			if err != nil {
				t.Fatalf("%s: %s: %v", sideName[side], step, err)
			}
		}
		if resp[ours].Paused != resp[theirs].Paused || !resp[ours].PauseUntil.Equal(resp[theirs].PauseUntil) ||
			(resp[ours].PauseRemaining > 0) != (resp[theirs].PauseRemaining > 0) {
			t.Errorf("%s: jetgres answered %+v, JetStream %+v", step, *resp[ours], *resp[theirs])
		}
		look(step)
	}
	pause("resumed", time.Time{})
	pause("paused again", later)
	pause("paused until a time gone by", time.Now().Add(-time.Minute))
	for _, target := range [][2]string{{"PS", "NOPE"}, {"NOPE", "P"}} {
		var code [2]jetstream.ErrorCode
		for side, js := range tw.js {
			_, err := js.PauseConsumer(tw.ctx, target[0], target[1], later)
			code[side] = errCode(t, side, err)
		}
		if code[ours] != code[theirs] || code[ours] == 0 {
			t.Errorf("pause %s > %s: jetgres err_code %d, JetStream %d", target[0], target[1], code[ours], code[theirs])
		}
	}
}
