package pg

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// ChunkRowsDefault is how many messages a chunk table holds before appends move on to a new
// one, for a stream without limits (ChunkRowsFor). Retention frees space one whole chunk at a
// time, so this is also the granularity at which a consumed stream gives its disk back.
const ChunkRowsDefault = 1 << 16

// ChunkRowsMin is the smallest chunk a limited stream's limits choose (ChunkRowsClose):
// besides its DDL, every chunk a stream holds is five relations, and PostgreSQL's work on
// jetgres.msgs's partitions grows with their number.
const ChunkRowsMin = 1 << 12

// ChunkRowsAppendMin is the smallest chunk the append path opens (ChunkRowsFor). A chunk
// costs DDL: its creation (a table, an index and an attach, in the append transaction that
// opens it, under the stream's row lock) and later its detach and drop, after each of which
// every connection plans its statements on jetgres.msgs again. A stream published to at
// full speed opens a chunk every ChunkRowsAppendMin messages at most: chunks of ChunkRowsMin
// cost such a stream about a third of its append rate where PostgreSQL is the bottleneck,
// chunks of this size nothing measurable (BENCHMARKS.md, "Chunk sizes"). Smaller chunks are
// closed by the maintainer instead, at most once every ChunkCloseAge per stream.
const ChunkRowsAppendMin = 1 << 14

// ChunkCloseAge is the youngest chunk the maintainer closes for its size (ChunkRowsClose):
// it bounds the DDL the maintainer adds to a stream, whatever its rate.
const ChunkCloseAge = 10 * time.Second

// chunkMsgBytes is the message size a max_bytes limit is turned into messages with, when
// the stream sets no max_msg_size: a small JetStream message, so that the chunk of a stream
// of small messages is not too small; larger messages make its chunks hold more bytes.
const chunkMsgBytes = 128

// ChunkSizing is what of a stream's configuration its chunk size follows.
type ChunkSizing struct {
	Limits Limits
	// Subjects is how many distinct subjects the stream can store, 0 when its subjects have
	// wildcards (a key-value bucket's): with MaxMsgsPer it bounds the messages held.
	Subjects int
	// MaxMsgSize is the stream's max_msg_size, 0 or less for none.
	MaxMsgSize int64
}

// chunkTarget is the chunk size a stream's limits ask for, as nats-server's file store sizes
// its blocks from them (autoTuneFileStorageBlockSize): a quarter of the most messages its
// limits let it hold, so that retention, which drops whole chunks, keeps at most about a
// quarter more than the limits beyond them; within ChunkRowsMin and ChunkRowsDefault. A
// stream with no limit on what it holds asks for ChunkRowsDefault; a key-value bucket's, but
// for its per-subject limit, for ChunkRowsMin: its live messages are spread over all its
// chunks, and a chunk goes only once every key in it was overwritten.
func chunkTarget(c ChunkSizing) int64 {
	l := c.Limits
	held := int64(-1)
	bound := func(n int64) {
		if n > 0 && (held < 0 || n < held) {
			held = n
		}
	}
	if l.MaxMsgs > 0 {
		bound(l.MaxMsgs)
	}
	if l.MaxBytes > 0 {
		size := int64(chunkMsgBytes)
		if c.MaxMsgSize > 0 {
			size = c.MaxMsgSize
		}
		bound(max(l.MaxBytes/size, 1))
	}
	if l.MaxMsgsPer > 0 {
		if c.Subjects <= 0 {
			return ChunkRowsMin
		}
		if l.MaxMsgsPer <= math.MaxInt64/int64(c.Subjects) {
			bound(l.MaxMsgsPer * int64(c.Subjects))
		}
	}
	if held < 0 {
		return ChunkRowsDefault
	}
	return min(max(held/4+1, ChunkRowsMin), ChunkRowsDefault)
}

// ChunkRowsFor chooses the size of the chunks a stream's appends open: what its limits ask
// for (see chunkTarget), at least ChunkRowsAppendMin. The configuration alone decides, so
// every replica and every restart of a process chooses the same, and a stream update
// changes the size of the chunks opened after it.
func ChunkRowsFor(c ChunkSizing) int64 { return max(chunkTarget(c), ChunkRowsAppendMin) }

// ChunkRowsClose is the size at which the maintainer closes a stream's chunk once it is
// ChunkCloseAge old (CloseChunks), when its limits ask for chunks smaller than its appends
// open, and 0 otherwise: a stream slower than ChunkRowsAppendMin messages in ChunkCloseAge
// then has chunks of the size its limits ask for, and a faster one pays no more DDL.
func ChunkRowsClose(c ChunkSizing) int64 {
	if t := chunkTarget(c); t < ChunkRowsFor(c) {
		return t
	}
	return 0
}

func chunkName(streamID, chunk int64) string { return fmt.Sprintf("msgs_%d_%d", streamID, chunk) }

// chunkTable is the quoted, schema-qualified name of a chunk table. Only numbers go into it.
func chunkTable(streamID, chunk int64) string {
	return pgx.Identifier{"jetgres", chunkName(streamID, chunk)}.Sanitize()
}

// createChunk creates a chunk table and attaches it to jetgres.msgs. A table created as a
// partition (CREATE TABLE … PARTITION OF) would lock jetgres.msgs against every reader and
// writer of every stream until the transaction ends; attaching a table created apart takes
// only a lock that readers and writers do not conflict with, and checks an empty table.
//
// The table's storage follows the stream's stored configuration as it is when the chunk
// opens (sqlChunkCompressed), so that a stream update changes the chunks opened after it and
// never rewrites one.
func createChunk(ctx context.Context, q querier, streamID, chunk int64, firstSeq uint64) error {
	t := chunkTable(streamID, chunk)
	var compressed bool
	if err := q.QueryRow(ctx, sqlChunkCompressed, streamID).Scan(&compressed); err != nil {
		return fmt.Errorf("create chunk %d: %w", chunk, err)
	}
	ddls := []string{
		`CREATE TABLE ` + t + ` (stream_id bigint NOT NULL, chunk bigint NOT NULL, ` + messageColumns + `)`,
		`CREATE INDEX ON ` + t + ` (subject, seq)`,
	}
	if compressed {
		ddls = append(ddls, `ALTER TABLE `+t+` ALTER COLUMN data SET COMPRESSION pglz`)
	}
	ddls = append(ddls, fmt.Sprintf(`ALTER TABLE jetgres.msgs ATTACH PARTITION %s FOR VALUES FROM (%d, %d) TO (%d, %d)`,
		t, streamID, chunk, streamID, chunk+1))
	for _, ddl := range ddls {
		if _, err := q.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("create chunk %d: %w", chunk, err)
		}
	}
	_, err := q.Exec(ctx, `INSERT INTO jetgres.chunks (stream_id, chunk, first_seq) VALUES ($1, $2, $3)`, streamID, chunk, int64(firstSeq))
	return err
}

// sqlChunkCompressed tells whether a stream's new chunk stores its payloads with the
// compression that serves `compression: s2` (JetStream's StreamConfig.Compression, stored as
// "s2" or "none"): pglz, pinned on the data column whatever default_toast_compression says.
//
// PostgreSQL compresses a value only when its row is over TOAST_TUPLE_THRESHOLD (about
// 2 KB, fixed when PostgreSQL is built; a lower toast_tuple_target does not lower it), one
// value at a time, for every stream alike: a chunk table's settings cannot make it compress
// a message smaller than that. Above it, pglz stores JSON payloads a tenth to a fifth
// smaller than lz4, the other method, and the default storage, which moves what is still
// over 2 KB once compressed into the TOAST table, packs pages better than keeping it in the
// row (STORAGE MAIN) or moving more of it (a lower toast_tuple_target): BENCHMARKS.md,
// "Compression". A stream with compression "none" keeps the server's default method.
// Before PostgreSQL 14 there is only pglz, and no COMPRESSION clause to ask for it.
const sqlChunkCompressed = `SELECT coalesce(config->>'compression' = 's2', false)
	AND current_setting('server_version_num')::int >= 140000
	FROM jetgres.streams WHERE id = $1`

// messageColumns are a message row's own columns, as a chunk table holds them after its
// partition key (stream_id, chunk).
//
// Subjects are compared byte by byte, as NATS does, whatever the database's collation: under
// a linguistic collation (en_US and the like, the default of many databases jetgres is
// pointed at) every comparison of the subject index costs a collation lookup, and an
// anchored pattern such as a wildcard filter's cannot use the index at all.
const messageColumns = `seq bigint PRIMARY KEY, ts bigint NOT NULL, subject text COLLATE "C" NOT NULL,
	hdr bytea, data bytea NOT NULL, cum_before bigint NOT NULL`

// ChunkShapeDDL creates a table called t that holds messages as a chunk table does, its
// message columns and its indexes, one statement each: benchmarks that measure what storing a
// message costs at the least store into tables shaped as jetgres's are.
func ChunkShapeDDL(t string) []string {
	return []string{`CREATE TABLE ` + t + ` (` + messageColumns + `)`, `CREATE INDEX ON ` + t + ` (subject, seq)`}
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

// ChunkDropLockTimeout bounds how long dropping a detached chunk table waits for its lock.
// Only readers of messages already gone can hold one, but a DROP that waited would queue
// every later reader of that table behind it; giving up and trying again later is cheaper.
const ChunkDropLockTimeout = 100 * time.Millisecond

// ChunkDropCandidates returns the streams for which DropChunks has something to do: a chunk
// whose successor starts at or below the stream's first sequence, or an empty stream that
// has seen no append for idle and still has rows in its chunk. One statement for all
// streams, so that a maintenance pass over thousands of streams with nothing to drop costs
// one round trip instead of several per stream.
func (db *DB) ChunkDropCandidates(ctx context.Context, idle time.Duration) ([]int64, error) {
	var ids []int64
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		rows, err := q.Query(ctx, `SELECT s.stream_id FROM jetgres.stream_state s
			WHERE s.first_seq > s.last_seq AND s.chunk_rows > 0 AND s.last_ts < $1
				OR (SELECT count(*) FROM jetgres.chunks c WHERE c.stream_id = s.stream_id AND c.first_seq <= s.first_seq) > 1
			ORDER BY s.stream_id`, time.Now().Add(-idle).UnixNano())
		if err != nil {
			return err
		}
		ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("pg: chunk drop candidates: %w", err)
	}
	return ids, nil
}

// DropChunks drops the chunk tables of a stream that its first sequence has passed, with
// their chunk rows and the tombstones that fell in them. When the stream is empty and has
// seen no append for idle, the chunk that receives appends is retired first, so that a
// consumed stream gives back its last chunk too. It returns how many tables it dropped; a
// table it could not drop yet is left to ReapChunks.
func (db *DB) DropChunks(ctx context.Context, id int64, idle time.Duration) (int, error) {
	if err := db.retireIdleChunk(ctx, id, idle); err != nil {
		return 0, err
	}
	var chunkIDs []int64
	err := db.backgroundTx(ctx, func(ctx context.Context, q querier) error {
		var first uint64
		if err := q.QueryRow(ctx, `SELECT first_seq FROM jetgres.stream_state WHERE stream_id = $1`, id).Scan(&first); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrNotFound
			}
			return err
		}
		rows, err := q.Query(ctx, `DELETE FROM jetgres.chunks c USING (
				SELECT chunk, lead(first_seq) OVER (ORDER BY chunk) AS next_first
				FROM jetgres.chunks WHERE stream_id = $1) k
			WHERE c.stream_id = $1 AND c.chunk = k.chunk AND k.next_first <= $2
			RETURNING c.chunk, k.next_first`, id, int64(first))
		if err != nil {
			return err
		}
		var below int64
		for rows.Next() {
			var chunk, next int64
			if err := rows.Scan(&chunk, &next); err != nil {
				rows.Close()
				return err
			}
			chunkIDs = append(chunkIDs, chunk)
			below = max(below, next)
		}
		rows.Close()
		if err := rows.Err(); err != nil || below == 0 {
			return err
		}
		_, err = q.Exec(ctx, `DELETE FROM jetgres.deleted WHERE stream_id = $1 AND seq < $2`, id, below)
		return err
	})
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return 0, err
		}
		return 0, fmt.Errorf("pg: drop chunks of stream %d: %w", id, err)
	}
	dropped := 0
	for _, chunk := range chunkIDs {
		db.chunks.dropped(id, chunk)
		ok, err := db.dropChunkTable(ctx, chunkName(id, chunk), true)
		if err != nil {
			return dropped, fmt.Errorf("pg: drop chunk %d of stream %d: %w", chunk, id, err)
		}
		if !ok {
			break
		}
		dropped++
	}
	return dropped, nil
}

// ReapChunks drops the chunk tables that no chunk row lists any more: those of deleted
// streams, and those DropChunks could not drop at once. It returns how many it dropped.
func (db *DB) ReapChunks(ctx context.Context) (int, error) {
	type orphan struct {
		name     string
		attached bool
	}
	var orphans []orphan
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		rows, err := q.Query(ctx, `SELECT c.relname, EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)
			FROM pg_class c
			WHERE c.relnamespace = 'jetgres'::regnamespace AND c.relkind = 'r' AND c.relname ~ '^msgs_[0-9]+_[0-9]+$'
				AND NOT EXISTS (SELECT 1 FROM jetgres.chunks k WHERE c.relname = 'msgs_' || k.stream_id || '_' || k.chunk)`)
		if err != nil {
			return err
		}
		orphans, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (orphan, error) {
			var o orphan
			err := r.Scan(&o.name, &o.attached)
			return o, err
		})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("pg: list orphaned chunks: %w", err)
	}
	dropped := 0
	for _, o := range orphans {
		ok, err := db.dropChunkTable(ctx, o.name, o.attached)
		if err != nil {
			return dropped, fmt.Errorf("pg: drop orphaned chunk %s: %w", o.name, err)
		}
		if !ok {
			break
		}
		dropped++
	}
	return dropped, nil
}

// dropChunkTable detaches a chunk table that no chunk row lists (when attached) and drops
// it. It reports false, and no error, when a transaction kept it from finishing within its
// bounds, or would have: the next pass tries again.
//
// Detaching CONCURRENTLY neither blocks nor waits behind the readers and writers of other
// chunks; a plain DETACH, or a DROP of a partition, would lock all of jetgres.msgs. A
// partitioned table can have one detach pending at a time, left by one that gave up: it is
// finished first.
func (db *DB) dropChunkTable(ctx context.Context, name string, attached bool) (bool, error) {
	t := pgx.Identifier{"jetgres", name}.Sanitize()
	if attached {
		dctx, cancel := context.WithTimeout(ctx, db.cfg.ChunkDetachTimeout)
		defer cancel()
		var held bool
		err := db.background(dctx, func(ctx context.Context, q querier) (err error) {
			var pending string
			err = q.QueryRow(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
				WHERE i.inhparent = 'jetgres.msgs'::regclass AND i.inhdetachpending`).Scan(&pending)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			if held, err = db.detachWouldWait(ctx, q, pending != ""); err != nil || held {
				return err
			}
			if pending != "" {
				if _, err := q.Exec(ctx, `ALTER TABLE jetgres.msgs DETACH PARTITION `+pgx.Identifier{"jetgres", pending}.Sanitize()+` FINALIZE`); err != nil {
					return err
				}
				if pending == name {
					return nil
				}
			}
			_, err = q.Exec(ctx, `ALTER TABLE jetgres.msgs DETACH PARTITION `+t+` CONCURRENTLY`)
			if isUndefinedTable(err) {
				// Another replica detached or dropped it first: it is no partition any more.
				return nil
			}
			return err
		})
		switch {
		case err != nil && dctx.Err() != nil && ctx.Err() == nil:
			return false, nil
		case hasSQLState(err, "55000"):
			// Another replica's detach is under way.
			return false, nil
		case err != nil:
			return false, err
		case held:
			return false, nil
		}
	}
	err := db.backgroundTx(ctx, func(ctx context.Context, q querier) error {
		if _, err := q.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, ChunkDropLockTimeout.Milliseconds())); err != nil {
			return err
		}
		_, err := q.Exec(ctx, `DROP TABLE IF EXISTS `+t)
		return err
	})
	if isLockTimeout(err) {
		return false, nil
	}
	return err == nil, err
}

// detachWouldWait reports whether a detach would wait for a transaction that has run for
// longer than the detach may wait: while it waits it holds a lock that the creation of a
// chunk waits for, so it would hold up publishes for its whole bound each pass and give up.
// A detach waits for the transactions that hold a lock on jetgres.msgs (a pg_dump, a report
// reading it); finishing one that gave up (finalize) waits for every transaction of the
// database that holds a snapshot, whatever it reads. A session of another role counts only
// where jetgres's role may see its transaction's start (pg_read_all_stats): one it cannot
// see makes a detach begin, wait its bound and stay pending until the transaction ends.
func (db *DB) detachWouldWait(ctx context.Context, q querier, finalize bool) (bool, error) {
	var held bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity a
		WHERE a.pid <> pg_backend_pid() AND a.datname = current_database()
			AND a.xact_start < now() - make_interval(secs => $1)
			AND ($2 AND a.backend_xmin IS NOT NULL
				OR EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'relation'
					AND l.relation = 'jetgres.msgs'::regclass)))`,
		db.cfg.ChunkDetachTimeout.Seconds(), finalize).Scan(&held)
	return held, err
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
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		var last, chunk int64
		return q.QueryRow(ctx, sqlIdle, id, before).Scan(&retire, &last, &chunk)
	})
	if err == nil && retire {
		// Check again under the lock: an append may have come in between.
		_, err = db.openNextChunk(ctx, id, sqlIdle, before)
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ErrNotFound
	case err != nil:
		return fmt.Errorf("pg: retire idle chunk of stream %d: %w", id, err)
	}
	return nil
}

// openNextChunk opens the chunk after a stream's current one, when sqlCheck (a read of the
// stream's state row, $1 its id and args the rest, for whether to, its last sequence and its
// chunk) says so with the row locked. It reports whether it opened one.
func (db *DB) openNextChunk(ctx context.Context, id int64, sqlCheck string, args ...any) (bool, error) {
	var open bool
	var last, chunk int64
	err := db.backgroundTx(ctx, func(ctx context.Context, q querier) error {
		if err := q.QueryRow(ctx, sqlCheck+` FOR UPDATE`, append([]any{customPlan, id}, args...)...).Scan(&open, &last, &chunk); err != nil || !open {
			return err
		}
		if err := createChunk(ctx, q, id, chunk+1, uint64(last+1)); err != nil {
			return err
		}
		_, err := q.Exec(ctx, `UPDATE jetgres.stream_state SET chunk = $2, chunk_rows = 0 WHERE stream_id = $1`, id, chunk+1)
		return err
	})
	if err != nil || !open {
		return false, err
	}
	db.chunks.add(id, chunkInfo{chunk: chunk + 1, firstSeq: uint64(last + 1)})
	return true, nil
}

// ChunkClose asks CloseChunks to close a stream's chunk once it holds Rows messages and
// began with one stored before Before (Unix nanoseconds on the replica's clock, as
// Append's).
type ChunkClose struct {
	StreamID int64
	Rows     int64
	Before   int64
}

// sqlChunkDue reports, for the stream $1, whether the chunk taking its appends holds at
// least $3 messages and began with one stored before $2.
const sqlChunkDue = `SELECT s.chunk_rows >= $3 AND coalesce((SELECT m.ts < $2 FROM jetgres.msgs m
		WHERE m.stream_id = s.stream_id AND m.chunk = s.chunk ORDER BY m.seq LIMIT 1), false),
	s.last_seq, s.chunk FROM jetgres.stream_state s WHERE s.stream_id = $1`

// CloseChunks closes the chunk of each stream of closes that holds at least its Rows
// messages and began before its Before, and opens the next. The maintainer closes so the
// chunks of a stream slower than its appends' chunk size (ChunkRowsClose), and those of a
// stream limited by max_age, which without it would fill its chunks long after their
// messages expired. One statement finds the streams of closes whose chunk is full enough,
// and a probe of each such chunk's first message which began too long ago; it returns how
// many chunks it closed.
func (db *DB) CloseChunks(ctx context.Context, closes []ChunkClose) (int, error) {
	ids, befores, rows := make([]int64, len(closes)), make([]int64, len(closes)), make([]int64, len(closes))
	for i, c := range closes {
		ids[i], befores[i], rows[i] = c.StreamID, db.pgUnixNano(c.Before), max(c.Rows, 1)
	}
	type due struct{ id, before, rows int64 }
	var dues []due
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		dues = dues[:0]
		r, err := q.Query(ctx, `SELECT a.id, a.before, a.rows, s.chunk
			FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS a(id, before, rows)
				JOIN jetgres.stream_state s ON s.stream_id = a.id
			WHERE s.chunk_rows >= a.rows ORDER BY a.id`, ids, befores, rows)
		if err != nil {
			return err
		}
		type full struct{ id, before, rows, chunk int64 }
		fulls, err := pgx.CollectRows(r, func(r pgx.CollectableRow) (full, error) {
			var f full
			err := r.Scan(&f.id, &f.before, &f.rows, &f.chunk)
			return f, err
		})
		if err != nil {
			return err
		}
		// One probe per full chunk, each planned for its stream and chunk: a statement that
		// joined jetgres.msgs to the state rows would open every chunk of every stream.
		for _, f := range fulls {
			var old bool
			if err := q.QueryRow(ctx, `SELECT coalesce((SELECT m.ts < $3 FROM jetgres.msgs m
					WHERE m.stream_id = $1 AND m.chunk = $2 ORDER BY m.seq LIMIT 1), false)`,
				customPlan, f.id, f.chunk, f.before).Scan(&old); err != nil {
				return err
			}
			if old {
				dues = append(dues, due{id: f.id, before: f.before, rows: f.rows})
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("pg: find chunks to close: %w", err)
	}
	closed := 0
	for _, d := range dues {
		ok, err := db.openNextChunk(ctx, d.id, sqlChunkDue, d.before, d.rows)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return closed, fmt.Errorf("pg: close the chunk of stream %d: %w", d.id, err)
		}
		if ok {
			closed++
		}
	}
	return closed, nil
}

func isLockTimeout(err error) bool { return hasSQLState(err, "55P03") }
