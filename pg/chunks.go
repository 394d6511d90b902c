package pg

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// ChunkRowsDefault is how many messages a chunk table holds before appends move on to a new
// one. Retention frees space one whole chunk at a time, so this is also the granularity at
// which a consumed stream gives its disk back.
const ChunkRowsDefault = 1 << 16

func chunkName(streamID, chunk int64) string { return fmt.Sprintf("msgs_%d_%d", streamID, chunk) }

// chunkTable is the quoted, schema-qualified name of a chunk table. Only numbers go into it.
func chunkTable(streamID, chunk int64) string {
	return pgx.Identifier{"jetgres", chunkName(streamID, chunk)}.Sanitize()
}

func createChunk(ctx context.Context, q querier, streamID, chunk int64, firstSeq uint64) error {
	for _, ddl := range chunkDDL(streamID, chunk) {
		if _, err := q.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("create chunk %d: %w", chunk, err)
		}
	}
	_, err := q.Exec(ctx, `INSERT INTO jetgres.chunks (stream_id, chunk, first_seq) VALUES ($1, $2, $3)`, streamID, chunk, int64(firstSeq))
	return err
}

// chunkDDL creates a chunk table: one statement each, as a pipeline takes them.
func chunkDDL(streamID, chunk int64) []string {
	return ChunkShapeDDL(chunkTable(streamID, chunk))
}

// ChunkShapeDDL creates a table called t shaped as a chunk table is, its columns and its
// indexes, one statement each: benchmarks that measure what storing a message costs at the
// least store into tables exactly as jetgres's are.
//
// Subjects are compared byte by byte, as NATS does, whatever the database's collation: under
// a linguistic collation (en_US and the like, the default of many databases jetgres is
// pointed at) every comparison of the subject index costs a collation lookup, and an
// anchored pattern such as a wildcard filter's cannot use the index at all.
func ChunkShapeDDL(t string) []string {
	return []string{`CREATE TABLE ` + t + ` (
		seq        bigint PRIMARY KEY,
		ts         bigint NOT NULL,
		subject    text   COLLATE "C" NOT NULL,
		hdr        bytea,
		data       bytea  NOT NULL,
		cum_before bigint NOT NULL
	)`, `CREATE INDEX ON ` + t + ` (subject, seq)`}
}

type chunkInfo struct {
	chunk    int64
	firstSeq uint64
}

// chunkCache remembers each stream's chunk list. Another replica may open a chunk we have
// not seen; a read that needs sequences beyond what the newest known chunk can explain
// reloads the list.
type chunkCache struct {
	mu     sync.Mutex
	byID   map[int64][]chunkInfo
	loaded map[int64]uint64 // the UpTo the list was loaded for
}

func (c *chunkCache) list(ctx context.Context, q querier, streamID int64, upTo uint64) ([]chunkInfo, error) {
	c.mu.Lock()
	l, ok := c.byID[streamID]
	at := c.loaded[streamID]
	c.mu.Unlock()
	if ok && upTo <= at {
		return l, nil
	}
	rows, err := q.Query(ctx, `SELECT chunk, first_seq FROM jetgres.chunks WHERE stream_id = $1 ORDER BY chunk`, streamID)
	if err != nil {
		return nil, err
	}
	l, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (chunkInfo, error) {
		var ci chunkInfo
		var first int64
		err := r.Scan(&ci.chunk, &first)
		ci.firstSeq = uint64(first)
		return ci, err
	})
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byID == nil {
		c.byID, c.loaded = make(map[int64][]chunkInfo), make(map[int64]uint64)
	}
	c.byID[streamID] = l
	c.loaded[streamID] = upTo
	return l, nil
}

// committed records that this process committed a stream's sequences up to lastSeq, the
// newest of them in chunk. When the list ends with that chunk and has no gap (another
// replica may have opened a chunk this process never saw), it explains every sequence up to
// lastSeq, so reads up to there need not reload it: a read right after a local commit then
// costs no extra round trip.
func (c *chunkCache) committed(streamID, chunk int64, lastSeq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.byID[streamID]
	if !ok || len(l) == 0 || l[len(l)-1].chunk != chunk || lastSeq <= c.loaded[streamID] {
		return
	}
	for i := 1; i < len(l); i++ {
		if l[i].chunk != l[i-1].chunk+1 {
			return
		}
	}
	c.loaded[streamID] = lastSeq
}

// add records a chunk this process opened, once its transaction has committed.
func (c *chunkCache) add(streamID int64, ci chunkInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.byID[streamID]
	if !ok {
		return
	}
	if n := len(l); n > 0 && l[n-1].chunk >= ci.chunk {
		return
	}
	c.byID[streamID] = append(l, ci)
}

// dropped forgets a chunk the maintainer dropped.
func (c *chunkCache) dropped(streamID, chunk int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.byID[streamID]; ok {
		c.byID[streamID] = slices.DeleteFunc(slices.Clone(l), func(ci chunkInfo) bool { return ci.chunk == chunk })
	}
}

func (c *chunkCache) forget(streamID int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.byID, streamID)
	delete(c.loaded, streamID)
}

func isUndefinedTable(err error) bool { return hasSQLState(err, "42P01") }

// hasSQLState reports whether err is a PostgreSQL error with this SQLSTATE code.
func hasSQLState(err error, code string) bool {
	var pgErr interface{ SQLState() string }
	return errors.As(err, &pgErr) && pgErr.SQLState() == code
}

// ChunkDropLockTimeout bounds how long dropping a chunk table waits for its lock. Only
// readers of messages already gone can hold one, but a DROP that waited would queue every
// later reader of that table behind it; giving up and trying again later is cheaper.
const ChunkDropLockTimeout = 100 * time.Millisecond

// DropChunks drops the chunk tables of a stream that its first sequence has passed, with
// their chunk rows and the tombstones that fell in them, one short transaction each. When the
// stream is empty and has seen no append for idle, the chunk that receives appends is
// retired first, so that a consumed stream gives back its last chunk too. It returns how many
// tables it dropped.
func (db *DB) DropChunks(ctx context.Context, id int64, idle time.Duration) (int, error) {
	if err := db.retireIdleChunk(ctx, id, idle); err != nil {
		return 0, err
	}
	var droppable []SeqRange
	var chunkIDs []int64
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		var first uint64
		if err := q.QueryRow(ctx, `SELECT first_seq FROM jetgres.stream_state WHERE stream_id = $1`, id).Scan(&first); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrNotFound
			}
			return err
		}
		rows, err := q.Query(ctx, `SELECT chunk, first_seq, next_first FROM (
				SELECT chunk, first_seq, lead(first_seq) OVER (ORDER BY chunk) AS next_first
				FROM jetgres.chunks WHERE stream_id = $1) k
			WHERE next_first <= $2 ORDER BY chunk`, id, int64(first))
		if err != nil {
			return err
		}
		for rows.Next() {
			var chunk int64
			var r SeqRange
			if err := rows.Scan(&chunk, &r.From, &r.To); err != nil {
				rows.Close()
				return err
			}
			chunkIDs = append(chunkIDs, chunk)
			droppable = append(droppable, r)
		}
		rows.Close()
		return rows.Err()
	})
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return 0, err
		}
		return 0, fmt.Errorf("pg: list chunks to drop: %w", err)
	}
	dropped := 0
	for i, chunk := range chunkIDs {
		err := db.backgroundTx(ctx, func(ctx context.Context, q querier) error {
			if _, err := q.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, ChunkDropLockTimeout.Milliseconds())); err != nil {
				return err
			}
			if _, err := q.Exec(ctx, `DROP TABLE IF EXISTS `+chunkTable(id, chunk)); err != nil {
				return err
			}
			if _, err := q.Exec(ctx, `DELETE FROM jetgres.chunks WHERE stream_id = $1 AND chunk = $2`, id, chunk); err != nil {
				return err
			}
			_, err := q.Exec(ctx, `DELETE FROM jetgres.deleted WHERE stream_id = $1 AND seq < $2`, id, int64(droppable[i].To))
			return err
		})
		if isLockTimeout(err) {
			break
		}
		if err != nil {
			return dropped, fmt.Errorf("pg: drop chunk %d of stream %d: %w", chunk, id, err)
		}
		db.chunks.dropped(id, chunk)
		dropped++
	}
	return dropped, nil
}

// retireIdleChunk opens a new, empty chunk for a stream that holds nothing and has seen no
// append for idle, so that the chunk that received its last messages can be dropped. Idle
// keeps a stream that empties and refills many times a second from creating and dropping a
// table each time.
func (db *DB) retireIdleChunk(ctx context.Context, id int64, idle time.Duration) error {
	const sqlIdle = `SELECT first_seq > last_seq AND chunk_rows > 0 AND last_ts < $2, last_seq, chunk
		FROM jetgres.stream_state WHERE stream_id = $1`
	before := time.Now().Add(-idle).UnixNano()
	var retire bool
	var last, chunk int64
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		return q.QueryRow(ctx, sqlIdle, id, before).Scan(&retire, &last, &chunk)
	})
	if err == nil && retire {
		// Check again under the lock: an append may have come in between.
		err = db.backgroundTx(ctx, func(ctx context.Context, q querier) error {
			if err := q.QueryRow(ctx, sqlIdle+` FOR UPDATE`, id, before).Scan(&retire, &last, &chunk); err != nil || !retire {
				return err
			}
			if err := createChunk(ctx, q, id, chunk+1, uint64(last+1)); err != nil {
				return err
			}
			_, err := q.Exec(ctx, `UPDATE jetgres.stream_state SET chunk = $2, chunk_rows = 0 WHERE stream_id = $1`, id, chunk+1)
			return err
		})
		if err == nil && retire {
			db.chunks.add(id, chunkInfo{chunk: chunk + 1, firstSeq: uint64(last + 1)})
		}
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ErrNotFound
	case err != nil:
		return fmt.Errorf("pg: retire idle chunk of stream %d: %w", id, err)
	}
	return nil
}

func isLockTimeout(err error) bool { return hasSQLState(err, "55P03") }
