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
// state.LastSeq, read in batches. now is when the backup was taken.
func WriteArchive(ctx context.Context, w io.Writer, db Messages, streamID int64, state server.StreamState, consumers []jsarchive.Consumer, now time.Time) error {
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
	for from := max(state.FirstSeq, 1); state.Msgs > 0 && from <= state.LastSeq; {
		msgs, through, _, err := db.ReadFiltered(ctx, pg.ReadParams{StreamID: streamID, From: from, UpTo: state.LastSeq,
			MaxMsgs: batchMsgs, MaxBytes: batchBytes}, nil)
		if err != nil {
			return fmt.Errorf("snapshot: read messages from %d: %w", from, err)
		}
		for i := range msgs {
			m := &msgs[i]
			if err := aw.Msg(&jsarchive.Msg{Seq: m.Seq, TS: m.TS, Subject: m.Subject, Header: m.Header, Data: m.Data}); err != nil {
				return err
			}
		}
		if through < from {
			break
		}
		from = through + 1
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
// them in batches of at most a few megabytes, up to the archive's end marker. It returns
// jsarchive.ErrTruncated when the archive ends before it.
func Load(ctx context.Context, ar *jsarchive.Reader, db Restorer, p LoadParams) (stored uint64, err error) {
	var batch []pg.Message
	size := 0
	flush := func(through uint64) error {
		if len(batch) == 0 && through == 0 {
			return nil
		}
		if err := db.RestoreMessages(ctx, pg.RestoreParams{StreamID: p.StreamID, Msgs: batch, Through: through, ChunkRows: p.ChunkRows}); err != nil {
			return err
		}
		stored += uint64(len(batch))
		if p.Progress != nil {
			p.Progress(stored)
		}
		batch, size = batch[:0], 0
		return nil
	}
	var m jsarchive.Msg
	for {
		err := ar.Next(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return stored, err
		}
		batch = append(batch, pg.Message{Seq: m.Seq, TS: m.TS, Subject: m.Subject, Header: bytes.Clone(m.Header), Data: bytes.Clone(m.Data)})
		size += len(m.Subject) + len(m.Header) + len(m.Data)
		if len(batch) >= batchMsgs || size >= batchBytes {
			if err := flush(0); err != nil {
				return stored, err
			}
		}
	}
	return stored, flush(p.Through)
}
