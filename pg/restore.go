package pg

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrRestoreOrder says a restored message does not come after what the stream holds.
var ErrRestoreOrder = errors.New("pg: restored messages must come after the stream's last sequence")

// RestoreParams is one batch of a stream restored from a backup (a JetStream snapshot).
type RestoreParams struct {
	StreamID int64
	// Msgs are stored with their own sequences and store times, in rising sequence order,
	// all above the stream's last sequence. Sequences skipped between them are deleted
	// ones, as the backup's interior deletes are.
	Msgs []Message
	// Through raises the stream's last sequence to at least this one after Msgs, as
	// deleted sequences at the end of a backup do. Zero leaves it at the last message.
	Through uint64
	// ChunkRows is how many messages the stream's chunks take; 0 is ChunkRowsDefault.
	ChunkRows int64
}

// restoreState is the part of a stream's state row a restore moves.
type restoreState struct {
	first, last, cumBytes, msgs, bytes uint64
	lastTS, chunk, chunkRows           int64
	memory                             bool
}

// RestoreResult is where a batch of a restore left its stream.
type RestoreResult struct {
	// Prev is the stream's last sequence before the batch: every message of the batch, and
	// every sequence it skipped, comes after it.
	Prev uint64
	// First and Last are the stream's first and last sequences after the batch.
	First, Last uint64
}

// RestoreMessages stores one batch of a restore in one transaction under the stream's row
// lock: the messages with the sequences and times they had, COPY into the stream's chunks
// (opening new ones as they fill), a size-zero tombstone for every sequence skipped after
// the stream's first message (a skip before it moves the first sequence instead, as
// JetStream's first sequence is its first message), and the state row. It returns
// ErrRestoreOrder when a message does not come after the stream's last sequence and
// ErrNotFound when the stream is gone. Batches are meant to be a few megabytes: the
// messages are held until the transaction commits.
//
// Nothing but a restore may append to the stream meanwhile: the caller keeps the stream
// sealed until the last batch.
func (db *DB) RestoreMessages(ctx context.Context, p RestoreParams) error {
	_, err := db.RestoreBatch(ctx, p)
	return err
}

// RestoreBatch is RestoreMessages, and tells where the batch left the stream: a mirror
// announces what it stored after the stream's last sequence as a commit.
func (db *DB) RestoreBatch(ctx context.Context, p RestoreParams) (RestoreResult, error) {
	var res RestoreResult
	chunkRows := p.ChunkRows
	if chunkRows <= 0 {
		chunkRows = ChunkRowsDefault
	}
	err := db.backgroundTx(ctx, func(ctx context.Context, q querier) error {
		var st restoreState
		err := q.QueryRow(ctx, `SELECT first_seq, last_seq, last_ts, cum_bytes, msgs, bytes, chunk, chunk_rows, memory
			FROM jetgres.stream_state WHERE stream_id = $1 FOR UPDATE`, p.StreamID).
			Scan(&st.first, &st.last, &st.lastTS, &st.cumBytes, &st.msgs, &st.bytes, &st.chunk, &st.chunkRows, &st.memory)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return fmt.Errorf("lock state of stream %d: %w", p.StreamID, err)
		}
		res.Prev = st.last
		var gapLo, gapHi []int64
		skipTo := func(seq uint64) {
			if seq <= st.last+1 {
				return
			}
			if st.msgs == 0 {
				st.first = seq
				return
			}
			gapLo, gapHi = append(gapLo, int64(st.last+1)), append(gapHi, int64(seq-1))
		}
		for i := range p.Msgs {
			m := &p.Msgs[i]
			if m.Seq <= st.last || m.Seq > MaxSeq {
				return fmt.Errorf("message %d after %d: %w", m.Seq, st.last, ErrRestoreOrder)
			}
			skipTo(m.Seq)
			size := MessageSize(st.memory, m.Subject, m.Header, m.Data)
			m.cumBefore = st.cumBytes
			st.cumBytes += size
			st.msgs++
			st.bytes += size
			st.last, st.lastTS = m.Seq, m.TS
		}
		if p.Through > MaxSeq {
			return fmt.Errorf("restore through %d: %w", p.Through, ErrSeqRange)
		}
		if p.Through > st.last {
			skipTo(p.Through + 1)
			if st.msgs == 0 {
				st.first = p.Through + 1
			}
			st.last = p.Through
		}
		for rest := p.Msgs; len(rest) > 0; {
			if st.chunkRows >= chunkRows {
				st.chunk++
				st.chunkRows = 0
				if err := createChunk(ctx, q, p.StreamID, st.chunk, rest[0].Seq); err != nil {
					return err
				}
			}
			n := min(int64(len(rest)), chunkRows-st.chunkRows)
			if _, err := q.CopyFrom(ctx, pgx.Identifier{"jetgres", "msgs"},
				[]string{"stream_id", "chunk", "seq", "ts", "subject", "hdr", "data", "cum_before"},
				copyRows(p.StreamID, st.chunk, rest[:n])); err != nil {
				return fmt.Errorf("copy restored messages of stream %d: %w", p.StreamID, err)
			}
			st.chunkRows += n
			rest = rest[n:]
		}
		if len(gapLo) > 0 {
			if _, err := q.Exec(ctx, `INSERT INTO jetgres.deleted (stream_id, seq, size)
				SELECT $1, s, 0 FROM unnest($2::bigint[], $3::bigint[]) AS g(lo, hi), generate_series(g.lo, g.hi) AS s`,
				p.StreamID, gapLo, gapHi); err != nil {
				return fmt.Errorf("mark deleted sequences of stream %d: %w", p.StreamID, err)
			}
		}
		_, err = q.Exec(ctx, `UPDATE jetgres.stream_state SET first_seq = $2, last_seq = $3, last_ts = $4, cum_bytes = $5,
			msgs = $6, bytes = $7, chunk = $8, chunk_rows = $9, last_msg_id = '' WHERE stream_id = $1`,
			p.StreamID, int64(st.first), int64(st.last), st.lastTS, int64(st.cumBytes), int64(st.msgs), int64(st.bytes), st.chunk, st.chunkRows)
		res.First, res.Last = st.first, st.last
		return err
	})
	// What this process remembers of the stream (its tail state, chunks, subject index and
	// counts) describes it before the batch, committed or not.
	db.forgetState(p.StreamID)
	db.counts.forget(p.StreamID)
	if err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrRestoreOrder) {
		return RestoreResult{}, fmt.Errorf("pg: restore messages: %w", err)
	}
	if err != nil {
		return RestoreResult{}, err
	}
	return res, nil
}
