package jswire

import (
	"fmt"

	"github.com/nats-io/nats-server/v2/server"
)

// MaxSeq is the largest stream sequence jetgres stores: 2^63-2, as package pg's MaxSeq
// (PostgreSQL keeps sequences as bigint, and an empty stream's first sequence, one past its
// last, must fit as well). JetStream's sequences span the whole uint64 range; a request
// that names one above MaxSeq is refused here, never stored wrapped.
const MaxSeq uint64 = 1<<63 - 2

// CheckSeq refuses a sequence a request names in field when jetgres cannot store it, with
// JetStream's bad-request error and a description that names the field.
func CheckSeq(field string, seq uint64) *server.ApiError {
	if seq <= MaxSeq {
		return nil
	}
	return &server.ApiError{Code: 400, ErrCode: server.ApiErrors[server.JSBadRequestErr].ErrCode,
		Description: fmt.Sprintf("bad request: %s %d is above %d, the largest sequence jetgres stores", field, seq, MaxSeq)}
}

// CheckPurgeRequest validates a STREAM.PURGE request as nats-server does (seq and keep
// exclude each other) and refuses a seq jetgres cannot store. keep is a count, not a
// sequence: any value is faithful.
func CheckPurgeRequest(req *server.JSApiStreamPurgeRequest) *server.ApiError {
	if req.Sequence > 0 && req.Keep > 0 {
		return server.NewJSBadRequestError()
	}
	return CheckSeq("seq", req.Sequence)
}
