package pg

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// TTLNever is AppendMsg.TTL for a message that never expires, not even by max_age.
const TTLNever = -1

// ttlRows are the jetgres.msg_ttl rows of the messages one batch stores with a TTL.
type ttlRows struct {
	seqs    []int64
	expires []int64 // unix ns on PostgreSQL's clock, or TTLNever
}

func (t *ttlRows) add(m Message, ttl int64) {
	switch {
	case ttl == TTLNever:
		t.seqs, t.expires = append(t.seqs, int64(m.Seq)), append(t.expires, TTLNever)
	case ttl > 0:
		t.seqs, t.expires = append(t.seqs, int64(m.Seq)), append(t.expires, m.TS+ttl*int64(time.Second))
	}
}

// queue adds the rows' insert to the batch's write round trip.
func (t *ttlRows) queue(b *pgx.Batch, streamID int64) {
	if len(t.seqs) == 0 {
		return
	}
	b.Queue(`INSERT INTO jetgres.msg_ttl (stream_id, seq, expires)
		SELECT $1, s, NULLIF(e, $4) FROM unnest($2::bigint[], $3::bigint[]) AS t(s, e)`,
		streamID, t.seqs, t.expires, int64(TTLNever))
}

// ExpireParams says what one expiry pass over a stream removes.
type ExpireParams struct {
	StreamID int64
	// Now is the time, unix ns on the replica's clock (moved onto PostgreSQL's as Append
	// moves store times), at which TTLs are due and max_age measures back from.
	Now int64
	// MaxAge is the stream's max_age, 0 for none. A message whose TTL is "never" outlives it.
	MaxAge time.Duration
	// IsMarker, when set, turns on subject delete markers: when what expires leaves a
	// subject without a message, its newest expiring message stays, named in
	// ExpireResult.Markers for the caller to replace with a marker, unless IsMarker says
	// its header makes it a marker already.
	IsMarker func(hdr []byte) bool
	// Limit bounds the messages one pass looks at; ExpireResult.More says it bit.
	Limit int
}

// ExpireResult is what an expiry pass did.
type ExpireResult struct {
	// Removed counts the live messages the pass removed.
	Removed uint64
	// Markers are the newest messages of the subjects that expiry empties, in sequence
	// order, left in place for the caller's markers to roll up.
	Markers []Message
	// More says that Limit stopped the pass before everything due was looked at.
	More bool
}

// Expire removes what a stream's message TTLs and max_age make due at p.Now, in one short
// transaction: the front of the stream by moving its first sequence when nothing in it is
// kept, and tombstones otherwise; message rows are never changed. The TTL rows of what it
// handled go, and so do those below the first sequence, whose messages other removals took.
func (db *DB) Expire(ctx context.Context, p ExpireParams) (ExpireResult, error) {
	now := db.pgUnixNano(p.Now)
	limit := max(p.Limit, 1)
	if due, err := db.expiryDue(ctx, p.StreamID, now, p.MaxAge); err != nil || !due {
		if err != nil && !errors.Is(err, ErrNotFound) {
			err = fmt.Errorf("pg: expire messages: %w", err)
		}
		return ExpireResult{}, err
	}
	var res ExpireResult
	err := db.backgroundTx(ctx, func(ctx context.Context, q querier) error {
		res = ExpireResult{}
		st, err := lockState(ctx, q, p.StreamID)
		if err != nil {
			return err
		}
		rows, err := q.Query(ctx, `SELECT seq FROM jetgres.msg_ttl WHERE stream_id = $1 AND expires <= $2
			ORDER BY expires LIMIT $3`, p.StreamID, now, limit)
		if err != nil {
			return fmt.Errorf("find expired TTLs of stream %d: %w", p.StreamID, err)
		}
		due, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return fmt.Errorf("find expired TTLs of stream %d: %w", p.StreamID, err)
		}
		res.More = len(due) == limit
		slices.Sort(due)
		aged := st.first // the age range is [st.first, aged)
		if p.MaxAge > 0 && st.msgs > 0 {
			if aged, err = db.ageTarget(ctx, q, st, now-p.MaxAge.Nanoseconds()); err != nil {
				return err
			}
		}
		var keep []int64
		if aged > st.first {
			rows, err := q.Query(ctx, `SELECT seq FROM jetgres.msg_ttl WHERE stream_id = $1 AND expires IS NULL
				AND seq >= $2 AND seq < $3`, p.StreamID, int64(st.first), int64(aged))
			if err != nil {
				return fmt.Errorf("find messages of stream %d that never expire: %w", p.StreamID, err)
			}
			if keep, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
				return fmt.Errorf("find messages of stream %d that never expire: %w", p.StreamID, err)
			}
		}
		if p.IsMarker != nil {
			marked, more, err := db.lastOfSubjects(ctx, q, st, &aged, due, keep, limit, p.IsMarker)
			if err != nil {
				return err
			}
			res.More = res.More || more
			res.Markers = marked
			for _, m := range marked {
				keep = append(keep, int64(m.Seq))
			}
		}
		slices.Sort(keep)
		if aged > st.first {
			var n uint64
			if len(keep) == 0 {
				n, err = db.advanceFirst(ctx, q, st, aged)
			} else {
				n, err = db.tombstoneWhere(ctx, q, st, st.first, aged-1, `NOT m.seq = ANY($4)`, keep)
			}
			if err != nil {
				return err
			}
			res.Removed += n
		}
		gone := slices.DeleteFunc(slices.Clone(due), func(s int64) bool { _, kept := slices.BinarySearch(keep, s); return kept })
		if len(gone) > 0 {
			n, err := db.tombstoneWhere(ctx, q, st, uint64(gone[0]), uint64(gone[len(gone)-1]), `m.seq = ANY($4)`, gone)
			if err != nil {
				return err
			}
			res.Removed += n
		}
		if res.Removed > 0 {
			if err := db.settleFirst(ctx, q, st); err != nil {
				return err
			}
			if err := st.save(ctx, q); err != nil {
				return err
			}
		}
		if _, err := q.Exec(ctx, `DELETE FROM jetgres.msg_ttl WHERE stream_id = $1 AND (seq < $2 OR seq = ANY($3))`,
			p.StreamID, int64(st.first), gone); err != nil {
			return fmt.Errorf("forget expired TTLs of stream %d: %w", p.StreamID, err)
		}
		return nil
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return ExpireResult{}, fmt.Errorf("pg: expire messages: %w", err)
	}
	return res, err
}

// expiryDue reports, without the state row's lock, whether a TTL of the stream has passed
// at now or its first message is older than maxAge: most of the time neither holds, and the
// maintainer's once-a-second look then does not queue behind appends. A "never" message at
// the front of a stream with max_age makes it look every time.
func (db *DB) expiryDue(ctx context.Context, id int64, now int64, maxAge time.Duration) (bool, error) {
	due := false
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		return q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM jetgres.msg_ttl WHERE stream_id = $1 AND expires <= $2)`, id, now).Scan(&due)
	})
	if err != nil || due || maxAge <= 0 {
		return due, err
	}
	return db.frontAged(ctx, id, now-maxAge.Nanoseconds())
}

// ageTarget is the first sequence of the stream's messages stored after cutoff (unix ns
// on PostgreSQL's clock), last + 1 when every message was stored at or before it.
func (db *DB) ageTarget(ctx context.Context, q querier, st *stateRow, cutoff int64) (uint64, error) {
	chunks, err := db.chunks.list(ctx, q, st.id, st.last)
	if err != nil {
		return 0, err
	}
	for _, c := range liveChunks(chunks, st.first, st.last) {
		var seq *int64
		err := q.QueryRow(ctx, `SELECT min(seq) FROM `+chunkTable(st.id, c.chunk)+` WHERE seq >= $1 AND ts > $2`,
			int64(st.first), cutoff).Scan(&seq)
		if err != nil {
			return 0, fmt.Errorf("find unexpired messages of stream %d: %w", st.id, err)
		}
		if seq != nil {
			return uint64(*seq), nil
		}
	}
	return st.last + 1, nil
}

// lastOfSubjects finds the subjects that the messages that expire (the age range
// [st.first, *aged) less keep, and due) leave without a message, as nats-server finds
// them, and returns the newest expiring message of each, unless that is a marker itself.
// It looks at no more than limit messages of the age range, and shortens the range to
// what it looked at.
func (db *DB) lastOfSubjects(ctx context.Context, q querier, st *stateRow, aged *uint64, due, keep []int64, limit int, isMarker func([]byte) bool) (last []Message, more bool, err error) {
	var expiring []Message
	if *aged > st.first {
		msgs, through, err := db.readRange(ctx, q, ReadParams{StreamID: st.id, From: st.first, UpTo: *aged - 1, MaxMsgs: limit}, nil)
		if err != nil {
			return nil, false, err
		}
		if len(msgs) == limit && through+1 < *aged {
			*aged, more = through+1, true
		}
		for _, m := range msgs {
			if !slices.Contains(keep, int64(m.Seq)) {
				expiring = append(expiring, m)
			}
		}
	}
	if len(due) > 0 {
		rows, err := q.Query(ctx, `SELECT seq, ts, subject, hdr, data, cum_before FROM jetgres.msgs m
			WHERE m.stream_id = $1 AND m.seq = ANY($2) AND m.seq >= $3 AND `+notTombstoned("$1")+` ORDER BY m.seq`,
			customPlan, st.id, due, int64(st.first))
		if err != nil {
			return nil, false, fmt.Errorf("read expired messages of stream %d: %w", st.id, err)
		}
		msgs, err := pgx.CollectRows(rows, scanMessage)
		if err != nil {
			return nil, false, fmt.Errorf("read expired messages of stream %d: %w", st.id, err)
		}
		expiring = append(expiring, msgs...)
	}
	bySubject := make(map[string][]int64)
	var subjects []string
	newest := make(map[string]Message)
	for _, m := range expiring {
		if _, ok := bySubject[m.Subject]; !ok {
			subjects = append(subjects, m.Subject)
		}
		bySubject[m.Subject] = append(bySubject[m.Subject], int64(m.Seq))
		if m.Seq > newest[m.Subject].Seq {
			newest[m.Subject] = m
		}
	}
	for _, subj := range subjects {
		m := newest[subj]
		if isMarker(m.Header) {
			continue
		}
		var others bool
		if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM jetgres.msgs m WHERE m.stream_id = $1 AND m.subject = $2
				AND m.seq >= $3 AND NOT m.seq = ANY($4) AND `+notTombstoned("$1")+`)`,
			customPlan, st.id, subj, int64(st.first), bySubject[subj]).Scan(&others); err != nil {
			return nil, false, fmt.Errorf("look for other messages of subject %q of stream %d: %w", subj, st.id, err)
		}
		if !others {
			last = append(last, m)
		}
	}
	// nats-server stores the markers in the order of the messages they replace.
	slices.SortFunc(last, func(a, b Message) int { return cmp.Compare(a.Seq, b.Seq) })
	return last, more, nil
}
