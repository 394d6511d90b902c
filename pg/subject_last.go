package pg

import (
	"context"
	"strings"
)

// A consumer that delivers the last message of each subject first (every key-value watcher)
// starts from the sequences of those messages. Read from the rows, that list is a grouped
// read of the whole stream: on a bucket of 100,000 keys about 200 ms, before the watcher's
// first delivery, where nats-server answers from memory. A stream with a subject index
// (subject_index.go) at the state the list is asked for holds the answer in memory too.

// lastSeqsIndexed returns the sequence of the newest live message of each subject that
// matches filters (every subject with none), unordered, if the stream has a subject index
// at the state its row holds now and that state's last sequence is upTo. A failed look is
// no answer: the read of the rows that follows reports what failed.
func (db *DB) lastSeqsIndexed(ctx context.Context, streamID int64, filters []string, upTo uint64) ([]uint64, bool) {
	var pin statePin
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		return q.QueryRow(ctx, `SELECT first_seq, last_seq, msgs, bytes FROM jetgres.stream_state WHERE stream_id = $1`, streamID).
			Scan(&pin.first, &pin.last, &pin.msgs, &pin.bytes)
	})
	if err != nil || pin.last != upTo {
		return nil, false
	}
	return db.subjects.lastSeqs(streamID, pin, filters)
}

// lastSeqs is lastSeqsIndexed's look at the index, if the stream has one at pin. It reads
// the index under the lock that appends take it out with, so that none changes it meanwhile.
func (s *subjectIndexes) lastSeqs(id int64, pin statePin, filters []string) ([]uint64, bool) {
	prefixes, literal := subjectPrefixes(filters)
	matches := func(subject string) bool {
		if len(filters) == 0 {
			return true
		}
		for i, f := range filters {
			if literal && strings.HasPrefix(subject, prefixes[i]) || !literal && SubjectMatches(f, subject) {
				return true
			}
		}
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	x, ok := s.m[id]
	if !ok || !x.matches(pin.first, pin.last, pin.msgs, pin.bytes) {
		return nil, false
	}
	out := make([]uint64, 0, len(x.bySubject))
	for subject, live := range x.bySubject {
		if len(live) > 0 && matches(subject) {
			out = append(out, live[len(live)-1].seq)
		}
	}
	return out, true
}
