package jsarchive_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats-server/v2/server/archive"

	"github.com/jetgres/jetgres/internal/jsarchive"
)

func sample() (server.StreamState, []jsarchive.ArchivedConsumer, []jsarchive.ArchivedMsg) {
	st := server.StreamState{Msgs: 3, Bytes: 120, FirstSeq: 2, LastSeq: 9, NumDeleted: 5, Consumers: 1,
		FirstTime: time.Unix(0, 1_000).UTC(), LastTime: time.Unix(0, 9_000).UTC()}
	cons := []jsarchive.ArchivedConsumer{{
		ConsumerConfig: &server.ConsumerConfig{Durable: "D", Name: "D", AckPolicy: server.AckExplicit},
		ConsumerState: &server.ConsumerState{
			Delivered: server.SequencePair{Consumer: 2, Stream: 5},
			AckFloor:  server.SequencePair{Consumer: 1, Stream: 2},
			Pending:   map[uint64]*server.Pending{5: {Sequence: 2, Timestamp: 77}},
		},
	}}
	msgs := []jsarchive.ArchivedMsg{
		{Seq: 2, TS: 1_000, Subject: "a.b", Data: []byte("one")},
		{Seq: 5, TS: 5_000, Subject: "a.c", Header: []byte("NATS/1.0\r\nK: v\r\n\r\n"), Data: []byte("two")},
		{Seq: 9, TS: 9_000, Subject: "a.b", Data: nil},
	}
	return st, cons, msgs
}

func write(t *testing.T) []byte {
	t.Helper()
	st, cons, msgs := sample()
	var buf bytes.Buffer
	w := jsarchive.NewWriter(&buf)
	if err := w.State(st, 42); err != nil {
		t.Fatal(err)
	}
	for _, c := range cons {
		if err := w.Consumer(c, 42); err != nil {
			t.Fatal(err)
		}
	}
	for i := range msgs {
		if err := w.Msg(&msgs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestWriterReadByServer reads what Writer wrote with nats-server's own archive reader, the
// one its restore uses, entry by entry.
func TestWriterReadByServer(t *testing.T) {
	st, cons, msgs := sample()
	r := archive.NewReader(s2.NewReader(bytes.NewReader(write(t))))
	h, err := r.Next()
	if err != nil || h.Name != "state.json" {
		t.Fatalf("first entry %+v, %v", h, err)
	}
	var got server.StreamState
	if err := json.NewDecoder(r).Decode(&got); err != nil || got.LastSeq != st.LastSeq || got.Msgs != st.Msgs || got.Consumers != 1 {
		t.Fatalf("state %+v, %v", got, err)
	}
	h, err = r.Next()
	if err != nil || h.Name != "consumers/D" {
		t.Fatalf("consumer entry %+v, %v", h, err)
	}
	var c server.SnapshotConsumerState
	if err := json.NewDecoder(r).Decode(&c); err != nil || c.Delivered != cons[0].Delivered || c.Pending[5].Sequence != 2 {
		t.Fatalf("consumer %+v, %v", c, err)
	}
	for _, m := range msgs {
		h, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		if h.Name != m.Subject || h.Sequence != m.Seq || h.Timestamp != m.TS || h.HeaderSize != int64(len(m.Header)) ||
			!bytes.Equal(body, append(append([]byte{}, m.Header...), m.Data...)) {
			t.Fatalf("message %d: got %+v %q", m.Seq, h, body)
		}
	}
	h, err = r.Next()
	if err != nil || *h != (archive.Header{}) {
		t.Fatalf("end marker %+v, %v", h, err)
	}
}

// TestReaderReadsServerArchive reads an archive made with nats-server's writer.
func TestReaderReadsServerArchive(t *testing.T) {
	st, _, msgs := sample()
	st.Consumers = 0
	var buf bytes.Buffer
	enc := s2.NewWriter(&buf)
	w := archive.NewWriter(enc)
	put := func(h archive.Header, b []byte) {
		t.Helper()
		if err := w.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if len(b) > 0 {
			if _, err := w.Write(b); err != nil {
				t.Fatal(err)
			}
		}
	}
	sj, _ := json.Marshal(st)
	put(archive.Header{Name: "state.json", Timestamp: 1, PayloadSize: int64(len(sj))}, sj)
	for _, m := range msgs {
		put(archive.Header{Name: m.Subject, Timestamp: m.TS, Sequence: m.Seq, HeaderSize: int64(len(m.Header)), PayloadSize: int64(len(m.Data))},
			append(append([]byte{}, m.Header...), m.Data...))
	}
	put(archive.Header{}, nil)
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}

	r := jsarchive.NewReader(&buf)
	got, err := r.State()
	if err != nil || got.LastSeq != st.LastSeq {
		t.Fatalf("state %+v, %v", got, err)
	}
	if c, err := r.Consumers(); err != nil || len(c) != 0 {
		t.Fatalf("consumers %v, %v", c, err)
	}
	var m jsarchive.ArchivedMsg
	for _, want := range msgs {
		if err := r.Next(&m); err != nil {
			t.Fatal(err)
		}
		if m.Seq != want.Seq || m.TS != want.TS || m.Subject != want.Subject || !bytes.Equal(m.Header, want.Header) || !bytes.Equal(m.Data, want.Data) {
			t.Fatalf("got %+v, want %+v", m, want)
		}
	}
	if err := r.Next(&m); err != io.EOF {
		t.Fatalf("after the last message: %v, want io.EOF", err)
	}
}

// TestReaderRefuses refuses what is not a whole archive: another format, a cut one, and
// sequences out of order.
func TestReaderRefuses(t *testing.T) {
	var other bytes.Buffer
	enc := s2.NewWriter(&other)
	_, _ = enc.Write([]byte("stream.tar contents, not NATSARC1"))
	_ = enc.Close()
	if _, err := jsarchive.NewReader(&other).State(); !errors.Is(err, jsarchive.ErrFormat) {
		t.Errorf("another format: %v, want ErrFormat", err)
	}

	whole := write(t)
	plain, err := io.ReadAll(s2.NewReader(bytes.NewReader(whole)))
	if err != nil {
		t.Fatal(err)
	}
	var cut bytes.Buffer
	enc = s2.NewWriter(&cut)
	_, _ = enc.Write(plain[:len(plain)-8])
	_ = enc.Close()
	r := jsarchive.NewReader(&cut)
	if _, err := r.State(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Consumers(); err != nil {
		t.Fatal(err)
	}
	var m jsarchive.ArchivedMsg
	for err == nil {
		err = r.Next(&m)
	}
	if !errors.Is(err, jsarchive.ErrTruncated) {
		t.Errorf("a cut archive ends with %v, want ErrTruncated", err)
	}

	var back bytes.Buffer
	w := jsarchive.NewWriter(&back)
	_ = w.State(server.StreamState{FirstSeq: 1, LastSeq: 5, Msgs: 2}, 1)
	_ = w.Msg(&jsarchive.ArchivedMsg{Seq: 4, Subject: "a"})
	_ = w.Msg(&jsarchive.ArchivedMsg{Seq: 3, Subject: "a"})
	_ = w.Close()
	r = jsarchive.NewReader(&back)
	_, _ = r.State()
	_, _ = r.Consumers()
	if err := r.Next(&m); err != nil {
		t.Fatal(err)
	}
	if err := r.Next(&m); !errors.Is(err, jsarchive.ErrFormat) {
		t.Errorf("a sequence going back: %v, want ErrFormat", err)
	}
}
