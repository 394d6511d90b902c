package pg

import "errors"

// MaxSeq is the largest sequence a message can take. JetStream's sequences are uint64;
// PostgreSQL keeps them as bigint, and a stream's first sequence, one past its last when it
// is empty, must fit too: so the last is at most 2^63-2. Requests that name a sequence
// above it are refused before they reach the database (see the bridge), and a publish that
// would need one fails with ErrSeqExhausted: nothing is ever stored under a wrapped
// sequence.
const MaxSeq uint64 = 1<<63 - 2

var (
	// ErrSeqExhausted is the outcome of a publish to a stream whose last sequence is
	// MaxSeq. The stream stays as it was: it can still be read, purged or deleted.
	ErrSeqExhausted = errors.New("sequence space exhausted: the stream's last sequence is the largest jetgres stores")
	// ErrSeqRange is returned when a purge or a stream create names a sequence above
	// MaxSeq.
	ErrSeqRange = errors.New("pg: sequence out of range")
)
