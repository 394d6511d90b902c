package bridge

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// The twin harness compares everything a client can read of the state, not only the fields
// a test picks: after each step that changes state, every stream and every consumer the
// twin made are read from both sides and compared field by field, through compareAll.

// twinDiffers lists what may differ between jetgres and JetStream, each with why. A field
// named here is still read on both sides; it is left out of the comparison only.
var twinDiffers = map[string]string{
	// Both are the wall-clock time of a write on two servers: only whether one is set can
	// agree, and that is compared.
	"stream.first_ts": "wall-clock time of the first message on each server",
	"stream.last_ts":  "wall-clock time of the last message on each server",
	"delivered.last":  "wall-clock time of the last delivery on each server",
	"ack_floor.last":  "wall-clock time of the last ack on each server",
	// jetgres serves many replicas from one database and has no Raft group: the consumer's
	// replica count is what was asked, 0 for the stream's own.
	"config.num_replicas": "JetStream fills in the stream's replica count; jetgres stores what the client sent",
	// Both stamp every consumer's metadata with the server's version and API level, and
	// the level the consumer needs; jetgres serves a lower API level than nats-server.
	"config.metadata._nats.level": "the API level each server serves",
	// After limits or a purge remove messages a consumer had not reached, jetgres recounts
	// its pending messages in the background (consumer_pending.go), and JetStream's own
	// delivery counts are estimates that lag an eviction under load: the token of a delivery
	// right after a removal may differ. num_pending in consumer info is compared exactly; a
	// twin with exactPending set compares the tokens too.
	"ack.pending after removals": "both sides' delivery counts lag removals for a moment",
}

// compareAll compares the state of every stream and consumer the twin made, waiting a short
// while for what both do in the background (retention, recounts) to settle.
func (tw *twin) compareAll(step string) {
	tw.t.Helper()
	if len(tw.streams) == 0 {
		return
	}
	var diff []string
	testwait.For(tw.t, 5*time.Second, func() error {
		diff = diff[:0]
		for _, s := range tw.streams {
			d, err := tw.diffStream(s)
			if err != nil {
				return err
			}
			diff = append(diff, d...)
		}
		for _, c := range tw.cons {
			d, err := tw.diffConsumer(c[0], c[1])
			if err != nil {
				return err
			}
			diff = append(diff, d...)
		}
		if len(diff) > 0 {
			return fmt.Errorf("after %s:\n%s", step, strings.Join(diff, "\n"))
		}
		return nil
	})
}

// field compares one named field, unless twinDiffers lets it differ.
func field(diff *[]string, where, name string, ours, theirs any) {
	if _, ok := twinDiffers[name]; ok {
		return
	}
	if fmt.Sprint(ours) != fmt.Sprint(theirs) {
		*diff = append(*diff, fmt.Sprintf("  %s %s: jetgres %v, jetstream %v", where, name, ours, theirs))
	}
}

func (tw *twin) diffStream(name string) ([]string, error) {
	var st [2]jetstream.StreamState
	for side, js := range tw.js {
		s, err := js.Stream(tw.ctx, name)
		if err != nil {
			return nil, fmt.Errorf("%s: stream info %s: %w", sideName[side], name, err)
		}
		st[side] = s.CachedInfo().State
	}
	a, b := st[ours], st[theirs]
	var d []string
	where := "stream " + name
	field(&d, where, "stream.messages", a.Msgs, b.Msgs)
	field(&d, where, "stream.bytes", a.Bytes, b.Bytes)
	field(&d, where, "stream.first_seq", a.FirstSeq, b.FirstSeq)
	field(&d, where, "stream.last_seq", a.LastSeq, b.LastSeq)
	field(&d, where, "stream.first_ts set", !a.FirstTime.IsZero(), !b.FirstTime.IsZero())
	field(&d, where, "stream.last_ts set", !a.LastTime.IsZero(), !b.LastTime.IsZero())
	field(&d, where, "stream.num_subjects", a.NumSubjects, b.NumSubjects)
	field(&d, where, "stream.num_deleted", a.NumDeleted, b.NumDeleted)
	field(&d, where, "stream.consumer_count", a.Consumers, b.Consumers)
	return d, nil
}

func (tw *twin) diffConsumer(stream, name string) ([]string, error) {
	var ci [2]*jetstream.ConsumerInfo
	for side, js := range tw.js {
		c, err := js.Consumer(tw.ctx, stream, name)
		if errors.Is(err, jetstream.ErrNotPullConsumer) {
			var p jetstream.PushConsumer
			if p, err = js.PushConsumer(tw.ctx, stream, name); err == nil {
				ci[side] = p.CachedInfo()
			}
		} else if err == nil {
			ci[side] = c.CachedInfo()
		}
		if err != nil {
			return nil, fmt.Errorf("%s: consumer info %s > %s: %w", sideName[side], stream, name, err)
		}
	}
	a, b := ci[ours], ci[theirs]
	var d []string
	where := "consumer " + stream + " > " + name
	field(&d, where, "delivered.consumer_seq", a.Delivered.Consumer, b.Delivered.Consumer)
	field(&d, where, "delivered.stream_seq", a.Delivered.Stream, b.Delivered.Stream)
	field(&d, where, "delivered.last set", a.Delivered.Last != nil, b.Delivered.Last != nil)
	field(&d, where, "ack_floor.consumer_seq", a.AckFloor.Consumer, b.AckFloor.Consumer)
	field(&d, where, "ack_floor.stream_seq", a.AckFloor.Stream, b.AckFloor.Stream)
	field(&d, where, "ack_floor.last set", a.AckFloor.Last != nil, b.AckFloor.Last != nil)
	field(&d, where, "num_ack_pending", a.NumAckPending, b.NumAckPending)
	field(&d, where, "num_redelivered", a.NumRedelivered, b.NumRedelivered)
	field(&d, where, "num_waiting", a.NumWaiting, b.NumWaiting)
	field(&d, where, "num_pending", a.NumPending, b.NumPending)
	field(&d, where, "paused", a.Paused, b.Paused)
	field(&d, where, "push_bound", a.PushBound, b.PushBound)
	cfg := [2]map[string]any{configMap(a.Config), configMap(b.Config)}
	for _, k := range slices.Sorted(maps.Keys(cfg[theirs])) {
		field(&d, where, "config."+k, jsonText(cfg[ours][k]), jsonText(cfg[theirs][k]))
	}
	for _, k := range slices.Sorted(maps.Keys(cfg[ours])) {
		if _, ok := cfg[theirs][k]; !ok {
			field(&d, where, "config."+k, jsonText(cfg[ours][k]), nil)
		}
	}
	return d, nil
}

// configMap is a consumer configuration as the JSON a client receives, by key.
func configMap(c jetstream.ConsumerConfig) map[string]any {
	raw, _ := json.Marshal(c)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	// Each metadata key is a field of its own, so that twinDiffers can name one.
	if md, ok := m["metadata"].(map[string]any); ok {
		delete(m, "metadata")
		for k, v := range md {
			m["metadata."+k] = v
		}
	}
	return m
}

func jsonText(v any) string {
	raw, _ := json.Marshal(v)
	return string(raw)
}

// diffDelivery compares the ack-reply metadata of two deliveries of the same message; the
// pending token only when exact.
func diffDelivery(a, b *jetstream.MsgMetadata, exact bool) []string {
	var d []string
	where := fmt.Sprintf("delivery of %d", b.Sequence.Stream)
	field(&d, where, "ack.consumer_seq", a.Sequence.Consumer, b.Sequence.Consumer)
	field(&d, where, "ack.stream_seq", a.Sequence.Stream, b.Sequence.Stream)
	field(&d, where, "ack.delivered", a.NumDelivered, b.NumDelivered)
	if exact {
		field(&d, where, "ack.pending", a.NumPending, b.NumPending)
	} else {
		field(&d, where, "ack.pending after removals", a.NumPending, b.NumPending)
	}
	field(&d, where, "ack.stream", a.Stream, b.Stream)
	field(&d, where, "ack.consumer", a.Consumer, b.Consumer)
	return d
}
