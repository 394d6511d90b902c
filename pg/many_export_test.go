package pg

import "context"

// FloorAppend is the least SQL a dense per-stream sequence needs for one publish on this
// schema, for BenchmarkAppendManyStreams to set beside Append: one implicit transaction that
// advances the stream's state row and inserts the message, numbered by it, into the stream's
// first chunk, through jetgres.msgs as Append inserts. It keeps none of the state Append
// keeps, so it runs on streams of its own.
func (db *DB) FloorAppend(ctx context.Context, streamID int64, subject string, data []byte) error {
	_, err := db.pool.Exec(ctx, `WITH u AS (UPDATE jetgres.stream_state SET last_seq = last_seq + 1 WHERE stream_id = $1 RETURNING last_seq)
		INSERT INTO jetgres.msgs (stream_id, chunk, seq, ts, subject, hdr, data, cum_before)
		SELECT $1, 0, u.last_seq, 0, $2, NULL, $3, 0 FROM u`, streamID, subject, data)
	return err
}

// ChunkInsert inserts one message into a stream's first chunk at seq and nothing else: the
// floor without the state row, to tell what the row costs from what many tables cost. It
// names the chunk table itself, so that what routing through jetgres.msgs costs shows too.
func (db *DB) ChunkInsert(ctx context.Context, streamID int64, seq int64, subject string, data []byte) error {
	_, err := db.pool.Exec(ctx, `INSERT INTO `+chunkTable(streamID, 0)+` (stream_id, chunk, seq, ts, subject, hdr, data, cum_before)
		VALUES ($1, 0, $2, 0, $3, NULL, $4, 0)`, streamID, seq, subject, data)
	return err
}
