package pg

import (
	"errors"
	"fmt"
	"time"
)

// ErrDiskFull is returned (wrapped) when PostgreSQL could not write because its disk is full
// (SQLSTATE 53100, disk_full): a table or index it could not extend, a WAL segment it could
// not create. A statement that failed with it on a live connection stored nothing; one whose
// backend PANICked on it (PostgreSQL cannot go on without its WAL) also wraps ErrUnavailable,
// and a COMMIT among them ErrOutcomeUnknown. It passes once space is freed, without anything
// done to jetgres.
var ErrDiskFull = errors.New("pg: database disk full")

// sqlStateDiskFull is disk_full, which PostgreSQL also reports for any file write that failed
// with ENOSPC.
const sqlStateDiskFull = "53100"

// classifyDiskFull wraps err with ErrDiskFull when PostgreSQL said its disk is full, and
// records when, for LastDiskFull.
func (db *DB) classifyDiskFull(err error) error {
	if !hasSQLState(err, sqlStateDiskFull) {
		return err
	}
	db.diskFullAt.Store(time.Now().UnixNano())
	return fmt.Errorf("%w: %w", ErrDiskFull, err)
}

// LastDiskFull is when a statement last failed because PostgreSQL's disk was full, or the
// zero time if none has: readiness is off while such failures keep coming.
func (db *DB) LastDiskFull() time.Time {
	ns := db.diskFullAt.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}
