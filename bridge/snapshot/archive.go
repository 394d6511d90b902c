package snapshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/internal/jsarchive"
	"github.com/jetgres/jetgres/pg"
)

// A batch is what one read of a backup, or one transaction of a restore, holds: the bound
// on a transfer's memory besides its window of chunks.
const (
	batchMsgs  = 4096
	batchBytes = 4 << 20
)

// Messages reads a stream's messages; *pg.DB is the one implementation.
type Messages interface {
	ReadFiltered(ctx context.Context, p pg.ReadParams, filters []string) ([]pg.Message, uint64, time.Duration, error)
}

// WriteArchive writes the archive of the stream streamID to w: state (whose Consumers it
// sets), the consumers, and the stream's messages from state.FirstSeq through
// state.LastSeq, read in batches. The next batch is read while the last is written, so that
// the database and the transfer work at once; no more than two batches are held. now is
// when the backup was taken.
func WriteArchive(ctx context.Context, w io.Writer, db Messages, streamID int64, state server.StreamState, consumers []jsarchive.ArchivedConsumer, now time.Time) error {
	aw := jsarchive.NewWriter(w)
	state.Consumers = len(consumers)
	if err := aw.State(state, now.UnixNano()); err != nil {
		return err
	}
	for _, c := range consumers {
		if err := aw.Consumer(c, now.UnixNano()); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type read struct {
		msgs []pg.Message
		err  error
	}
	batches := make(chan read)
	go func() {
		defer close(batches)
		for from := max(state.FirstSeq, 1); state.Msgs > 0 && from <= state.LastSeq; {
			msgs, through, _, err := db.ReadFiltered(ctx, pg.ReadParams{StreamID: streamID, From: from, UpTo: state.LastSeq,
				MaxMsgs: batchMsgs, MaxBytes: batchBytes}, nil)
			if err != nil {
				err = fmt.Errorf("snapshot: read messages from %d: %w", from, err)
			}
			select {
			case batches <- read{msgs, err}:
			case <-ctx.Done():
				return
			}
			if err != nil || through < from {
				return
			}
			from = through + 1
		}
	}()
	for b := range batches {
		if b.err != nil {
			return b.err
		}
		for i := range b.msgs {
			m := &b.msgs[i]
			if err := aw.Msg(&jsarchive.ArchivedMsg{Seq: m.Seq, TS: m.TS, Subject: m.Subject, Header: m.Header, Data: m.Data}); err != nil {
				return err
			}
		}
	}
	return aw.Close()
}

// Restorer stores restored messages; *pg.DB is the one implementation.
type Restorer interface {
	RestoreMessages(ctx context.Context, p pg.RestoreParams) error
}

// LoadParams says where Load stores an archive's messages.
type LoadParams struct {
	StreamID int64
	// Through is the archive's last sequence (its state's), which the stream's last
	// sequence reaches even when the messages end before it.
	Through uint64
	// ChunkRows is the stream's chunk size; 0 is pg.ChunkRowsDefault.
	ChunkRows int64
	// Progress, if set, hears how many messages are stored after each batch.
	Progress func(stored uint64)
}

// Load reads the messages of ar, whose state and consumers were read already, and stores
// them in batches of at most a few megabytes, up to the archive's end marker. One batch is
// stored while the next is read, so that the upload and the database work at once; no more
// than two batches are held. It returns jsarchive.ErrTruncated when the archive ends before
// its end marker.
func Load(ctx context.Context, ar *jsarchive.Reader, db Restorer, p LoadParams) (stored uint64, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type job struct {
		msgs    []pg.Message
		through uint64
	}
	jobs := make(chan job)
	free := make(chan []pg.Message, 1)
	stopped := make(chan error, 1)
	go func() {
		for j := range jobs {
			if err := db.RestoreMessages(ctx, pg.RestoreParams{StreamID: p.StreamID, Msgs: j.msgs, Through: j.through, ChunkRows: p.ChunkRows}); err != nil {
				stopped <- err
				cancel()
				for range jobs {
				}
				return
			}
			stored += uint64(len(j.msgs))
			if p.Progress != nil {
				p.Progress(stored)
			}
			free <- j.msgs[:0]
		}
		stopped <- nil
	}()
	// hand gives the writer a batch, and takes back the one it stored before.
	var spare []pg.Message
	hand := func(j job) bool {
		select {
		case jobs <- j:
		case <-ctx.Done():
			return false
		}
		select {
		case spare = <-free:
		default:
		}
		return true
	}
	finish := func(readErr error) (uint64, error) {
		close(jobs)
		werr := <-stopped
		if werr != nil {
			return stored, werr
		}
		return stored, readErr
	}

	var batch []pg.Message
	size := 0
	var m jsarchive.ArchivedMsg
	for {
		err := ar.Next(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return finish(err)
		}
		batch = append(batch, pg.Message{Seq: m.Seq, TS: m.TS, Subject: m.Subject, Header: bytes.Clone(m.Header), Data: bytes.Clone(m.Data)})
		size += len(m.Subject) + len(m.Header) + len(m.Data)
		if len(batch) >= batchMsgs || size >= batchBytes {
			if !hand(job{msgs: batch}) {
				return finish(ctx.Err())
			}
			batch, size = spare, 0
			spare = nil
		}
	}
	if len(batch) > 0 || p.Through > 0 {
		hand(job{msgs: batch, through: p.Through})
	}
	return finish(nil)
}
