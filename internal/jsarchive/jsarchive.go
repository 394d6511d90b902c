// Package jsarchive owns the stream backup format that nats-server (2.15 and later) writes
// for $JS.API.STREAM.SNAPSHOT and reads for $JS.API.STREAM.RESTORE, and that `nats stream
// backup` keeps as stream.arc.s2: an s2 stream holding the magic "NATSARC1" and then a
// sequence of entries. Each entry is a header of varints (the name's length; a signed
// timestamp; a sequence; the sizes of the entry's header part and payload part), the name,
// and the two parts. The entries come in a fixed order: "state.json" (the stream's state,
// whose consumer count says how many consumer entries follow), one "consumers/<name>" entry
// per consumer (its configuration and state as JSON), one entry per stored message (its
// subject as the name, its store time, its sequence, its headers and data), and an entry
// whose fields are all zero that marks the end, so that a truncated archive is told apart
// from a complete one.
//
// It reads and writes one entry at a time: neither side ever holds more than one message,
// whatever the size of the stream.
package jsarchive

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/klauspost/compress/s2"
	"github.com/nats-io/nats-server/v2/server"
)

// Magic opens every archive, inside the s2 stream.
const Magic = "NATSARC1"

const (
	stateName      = "state.json"
	consumerPrefix = "consumers/"
	// maxName bounds an entry's name as read, so that a corrupt length cannot make the
	// reader allocate without bound. Subjects and consumer names are far shorter.
	maxName = 1 << 16
	// maxJSON bounds the state and consumer entries, whose pending maps are the only
	// part that grows with a consumer's backlog.
	maxJSON = 256 << 20
)

// ErrFormat says the data is not an archive of this format, or is a damaged one.
var ErrFormat = errors.New("jsarchive: not a NATSARC1 stream archive")

// ErrTruncated says the archive ended before its end marker.
var ErrTruncated = errors.New("jsarchive: archive truncated before its end marker")

// ArchivedMsg is one stored message as an archive holds it.
type ArchivedMsg struct {
	Seq     uint64
	TS      int64 // unix nanoseconds
	Subject string
	Header  []byte
	Data    []byte
}

// ArchivedConsumer is one consumer's entry: its configuration and its delivery state.
type ArchivedConsumer = server.SnapshotConsumerState

// ArchiveWriter writes an archive: State first, then every consumer, then the messages in
// sequence order, then Close.
type ArchiveWriter struct {
	enc *s2.Writer
	buf []byte
	err error
}

// NewWriter starts an archive on w. Nothing is written until State.
func NewWriter(w io.Writer) *ArchiveWriter {
	return &ArchiveWriter{enc: s2.NewWriter(w)}
}

func (w *ArchiveWriter) entry(name string, ts int64, seq uint64, hdr, data []byte) error {
	if w.err != nil {
		return w.err
	}
	b := w.buf[:0]
	b = binary.AppendUvarint(b, uint64(len(name)))
	b = binary.AppendVarint(b, ts)
	b = binary.AppendUvarint(b, seq)
	b = binary.AppendUvarint(b, uint64(len(hdr)))
	b = binary.AppendUvarint(b, uint64(len(data)))
	b = append(b, name...)
	b = append(b, hdr...)
	b = append(b, data...)
	w.buf = b
	_, w.err = w.enc.Write(b)
	return w.err
}

// State writes the magic and the stream's state; ts is when the archive was taken.
// state.Consumers must be the number of Consumer calls that follow.
func (w *ArchiveWriter) State(state server.StreamState, ts int64) error {
	if w.err == nil {
		_, w.err = w.enc.Write([]byte(Magic))
	}
	j, err := json.Marshal(state)
	if err != nil {
		return fmt.Errorf("jsarchive: encode state: %w", err)
	}
	return w.entry(stateName, ts, 0, nil, j)
}

// Consumer writes one consumer's entry; ts is when the archive was taken.
func (w *ArchiveWriter) Consumer(c ArchivedConsumer, ts int64) error {
	if c.ConsumerConfig == nil || c.ConsumerState == nil {
		return errors.New("jsarchive: consumer entry without configuration or state")
	}
	j, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("jsarchive: encode consumer %q: %w", c.Name, err)
	}
	return w.entry(consumerPrefix+c.Name, ts, 0, nil, j)
}

// Msg writes one message. Sequences must rise and be above zero.
func (w *ArchiveWriter) Msg(m *ArchivedMsg) error {
	if m.Seq == 0 {
		return errors.New("jsarchive: a message needs a sequence")
	}
	return w.entry(m.Subject, m.TS, m.Seq, m.Header, m.Data)
}

// Close writes the end marker and flushes the s2 stream. It does not close the
// underlying writer.
func (w *ArchiveWriter) Close() error {
	if err := w.entry("", 0, 0, nil, nil); err != nil {
		return err
	}
	return w.enc.Close()
}

// Reader reads an archive written by nats-server or by Writer.
type Reader struct {
	r *bufio.Reader
	// MaxPayload bounds a message's headers and data together; a larger one is refused
	// before it is read. Zero is no bound.
	MaxPayload int64
	consumers  int
	state      bool
	done       bool
	last       uint64 // the sequence of the message read last
	buf        []byte
}

// NewReader reads an archive from r, which holds the s2 stream as `nats stream backup`
// stored it.
func NewReader(r io.Reader) *Reader {
	return &Reader{r: bufio.NewReaderSize(s2.NewReader(r), 64<<10)}
}

type entryHead struct {
	name       string
	ts         int64
	seq        uint64
	hdr, data  uint64
	endOfInput bool
}

func (r *Reader) head() (entryHead, error) {
	var h entryHead
	nameLen, err := binary.ReadUvarint(r.r)
	if errors.Is(err, io.EOF) {
		h.endOfInput = true
		return h, nil
	}
	if err != nil {
		return h, r.damaged(err)
	}
	if h.ts, err = binary.ReadVarint(r.r); err != nil {
		return h, r.damaged(err)
	}
	for _, p := range []*uint64{&h.seq, &h.hdr, &h.data} {
		if *p, err = binary.ReadUvarint(r.r); err != nil {
			return h, r.damaged(err)
		}
	}
	if nameLen > maxName || h.hdr > 1<<40 || h.data > 1<<40 {
		return h, ErrFormat
	}
	name := make([]byte, nameLen)
	if _, err := io.ReadFull(r.r, name); err != nil {
		return h, r.damaged(err)
	}
	h.name = string(name)
	return h, nil
}

// damaged turns a read error inside an entry into what it means for the archive.
func (r *Reader) damaged(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return ErrTruncated
	}
	if errors.Is(err, s2.ErrCorrupt) || errors.Is(err, s2.ErrUnsupported) {
		return fmt.Errorf("%w: %v", ErrFormat, err)
	}
	return err
}

func (r *Reader) payload(n uint64) ([]byte, error) {
	if uint64(cap(r.buf)) < n {
		r.buf = make([]byte, n)
	}
	b := r.buf[:n]
	if _, err := io.ReadFull(r.r, b); err != nil {
		return nil, r.damaged(err)
	}
	return b, nil
}

// State reads the magic and the stream's state. It must be the first call.
func (r *Reader) State() (server.StreamState, error) {
	var st server.StreamState
	magic := make([]byte, len(Magic))
	if _, err := io.ReadFull(r.r, magic); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return st, ErrFormat
		}
		return st, r.damaged(err)
	}
	if string(magic) != Magic {
		return st, ErrFormat
	}
	h, err := r.head()
	if err != nil {
		return st, err
	}
	if h.endOfInput || h.name != stateName || h.hdr != 0 || h.data > maxJSON {
		return st, fmt.Errorf("%w: the first entry is not %s", ErrFormat, stateName)
	}
	b, err := r.payload(h.data)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%w: %s: %v", ErrFormat, stateName, err)
	}
	if err := checkState(&st); err != nil {
		return st, err
	}
	r.state, r.consumers = true, st.Consumers
	return st, nil
}

// checkState refuses a state whose sequences and counts cannot belong together, as
// nats-server refuses it.
func checkState(st *server.StreamState) error {
	switch {
	case st.Consumers < 0:
		return fmt.Errorf("%w: negative consumer count", ErrFormat)
	case st.FirstSeq == 0 && (st.LastSeq != 0 || st.Msgs != 0):
		return fmt.Errorf("%w: inconsistent message count or sequence range", ErrFormat)
	case st.FirstSeq > st.LastSeq && st.FirstSeq != 0 && (st.FirstSeq-1 != st.LastSeq || st.Msgs != 0):
		return fmt.Errorf("%w: inconsistent message count or sequence range", ErrFormat)
	case st.FirstSeq != 0 && st.FirstSeq <= st.LastSeq && st.Msgs > st.LastSeq-st.FirstSeq+1:
		return fmt.Errorf("%w: message count exceeds sequence range", ErrFormat)
	}
	return nil
}

// Consumers reads the consumer entries that the state announced.
func (r *Reader) Consumers() ([]ArchivedConsumer, error) {
	if !r.state {
		return nil, errors.New("jsarchive: Consumers before State")
	}
	var out []ArchivedConsumer
	for ; r.consumers > 0; r.consumers-- {
		h, err := r.head()
		if err != nil {
			return nil, err
		}
		name, ok := strings.CutPrefix(h.name, consumerPrefix)
		if h.endOfInput || !ok || h.hdr != 0 || h.data > maxJSON {
			return nil, fmt.Errorf("%w: expected a consumer, found %q", ErrFormat, h.name)
		}
		b, err := r.payload(h.data)
		if err != nil {
			return nil, err
		}
		var c ArchivedConsumer
		if err := json.Unmarshal(b, &c); err != nil {
			return nil, fmt.Errorf("%w: consumer %q: %v", ErrFormat, name, err)
		}
		if c.ConsumerConfig == nil || c.ConsumerState == nil {
			return nil, fmt.Errorf("%w: consumer %q lacks its configuration or state", ErrFormat, name)
		}
		if c.Name == "" {
			c.Name = name
		}
		out = append(out, c)
	}
	return out, nil
}

// Next reads the next message into m, whose Header and Data stay valid only until the
// next call. It returns io.EOF at the end marker, and ErrTruncated when the input ends
// before it.
func (r *Reader) Next(m *ArchivedMsg) error {
	if r.done {
		return io.EOF
	}
	if !r.state || r.consumers > 0 {
		return errors.New("jsarchive: Next before State and Consumers")
	}
	h, err := r.head()
	if err != nil {
		return err
	}
	if h.endOfInput {
		return ErrTruncated
	}
	if h.seq == 0 {
		if h.name == "" && h.ts == 0 && h.hdr == 0 && h.data == 0 {
			r.done = true
			return io.EOF
		}
		return fmt.Errorf("%w: entry %q has no sequence", ErrFormat, h.name)
	}
	if r.MaxPayload > 0 && h.hdr+h.data > uint64(r.MaxPayload) {
		return fmt.Errorf("jsarchive: message %d has %d bytes, more than the maximum payload %d", h.seq, h.hdr+h.data, r.MaxPayload)
	}
	if h.seq <= r.last {
		return fmt.Errorf("%w: message %d after %d", ErrFormat, h.seq, r.last)
	}
	r.last = h.seq
	b, err := r.payload(h.hdr + h.data)
	if err != nil {
		return err
	}
	m.Seq, m.TS, m.Subject = h.seq, h.ts, h.name
	m.Header, m.Data = b[:h.hdr:h.hdr], b[h.hdr:]
	if h.hdr == 0 {
		m.Header = nil
	}
	return nil
}
