package jserr

import (
	"context"
	"errors"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/pg"
)

// Fail builds a request's own JetStream error for a database failure that was not
// transient, such as server.NewJSStreamCreateError.
type Fail func(error, ...server.ErrorOption) *server.ApiError

// errDatabase is the description of a database failure that was not transient; the cause
// goes to the log, not to clients.
var errDatabase = errors.New("database error")

// Transient reports whether err means the database could not be reached in time, or could
// not write until its disk has room again, as opposed to a database that answered.
func Transient(err error) bool {
	return errors.Is(err, pg.ErrUnavailable) || errors.Is(err, pg.ErrTimeout) || errors.Is(err, pg.ErrDiskFull) || errors.Is(err, pg.ErrOwnershipLost) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// API maps a request's error to the JetStream API error a client receives:
//
//   - a *server.ApiError is a verdict already (a bad request, a stream that does not exist,
//     ...) and goes out as it is;
//   - a transient failure is "JetStream system temporarily unavailable", 503 with err_code
//     10008, which clients retry;
//   - any other failure is the database refusing what the request asked: fail's error (a
//     stream create error for a stream create, ...) saying "database error".
func API(err error, fail Fail) *server.ApiError {
	var ae *server.ApiError
	switch {
	case errors.As(err, &ae):
		return ae
	case Transient(err):
		return server.NewJSClusterNotAvailError()
	default:
		return fail(errDatabase)
	}
}

// IsVerdict reports whether err is already a JetStream API error, a verdict on the request
// rather than a failure to log.
func IsVerdict(err error) bool {
	var ae *server.ApiError
	return errors.As(err, &ae)
}

// StreamLookup is a stream lookup's error as the API answers it: PostgreSQL's not found is
// "stream not found", anything else, a database it could not read among them, stays as it
// is for API to map.
func StreamLookup(err error) error {
	if errors.Is(err, pg.ErrNotFound) {
		return server.NewJSStreamNotFoundError()
	}
	return err
}

// StreamCreate is a stream create's database error as the API answers it: a name
// PostgreSQL already holds is "stream name already in use".
func StreamCreate(err error) error {
	if errors.Is(err, pg.ErrExists) {
		return server.NewJSStreamNameExistError()
	}
	return err
}

// MsgLookup is a message get's error as the API answers it: PostgreSQL's not found is "no
// message found".
func MsgLookup(err error) error {
	if errors.Is(err, pg.ErrNotFound) {
		return server.NewJSNoMessageFoundError()
	}
	return err
}

// MsgDelete is a message delete's error as the API answers it, as nats-server's file store
// words it: a sequence past the stream's last is "stream store EOF", whatever the sequence,
// and one below it that holds no message is "no message found".
func MsgDelete(err error) error {
	switch {
	case errors.Is(err, pg.ErrPastLast):
		return server.NewJSStreamMsgDeleteFailedError(errors.New("stream store EOF"))
	case errors.Is(err, pg.ErrNotFound):
		return server.NewJSStreamMsgDeleteFailedError(errors.New("no message found"))
	}
	return err
}

// PublishFailed is the PubAck error for a publish whose transaction failed without storing
// it: a store failure (503, err_code 10077) that says whether the database's disk is full,
// it timed out or it could not be reached, never why beyond that.
func PublishFailed(err error) *server.ApiError {
	if errors.Is(err, pg.ErrDiskFull) {
		return server.NewJSStreamStoreFailedError(errors.New("database disk full"))
	}
	if errors.Is(err, pg.ErrTimeout) {
		return server.NewJSStreamStoreFailedError(errors.New("database timeout"))
	}
	return server.NewJSStreamStoreFailedError(errors.New("database unavailable"))
}

// PublishRefused is the PubAck error for one message its transaction refused:
//
//   - an expectation that did not hold is the wrong last sequence or message id nats-server
//     answers, naming the stream's actual one;
//   - a stream PostgreSQL no longer holds (deleted, by another replica, while the publish
//     waited for its transaction) is "stream not found";
//   - a discard-new limit, or a sequence space used up, is a store failure whose
//     description names it, as nats-server sends it;
//   - an atomic batch refused for a duplicate message, or for an expectation that cannot
//     hold inside a batch, is what nats-server answers its commit.
func PublishRefused(err error) *server.ApiError {
	var ee *pg.ExpectError
	var le *pg.LimitError
	var ae *server.ApiError
	switch {
	case errors.As(err, &ae):
		// A derived message's own refusal (pg.AppendMsg.Derive), already JetStream's.
		return ae
	case errors.Is(err, pg.ErrBatchDuplicate):
		return server.NewJSAtomicPublishContainsDuplicateMessageError()
	case errors.Is(err, pg.ErrExpectInBatch):
		return server.NewJSStreamWrongLastSequenceConstantError()
	case errors.As(err, &le):
		return server.NewJSStreamStoreFailedError(le)
	case errors.Is(err, pg.ErrNotFound):
		return server.NewJSStreamNotFoundError()
	case errors.As(err, &ee) && ee.Kind == pg.ExpectLastMsgIDKind:
		return server.NewJSStreamWrongLastMsgIDError(ee.LastID)
	case errors.As(err, &ee):
		return server.NewJSStreamWrongLastSequenceError(ee.LastSeq)
	}
	return server.NewJSStreamStoreFailedError(err)
}

// ConsumerLookup is the error of a request that names a consumer as the API answers it:
// PostgreSQL's not found is "consumer not found", anything else stays as it is for API to
// map.
func ConsumerLookup(err error) error {
	if errors.Is(err, pg.ErrNotFound) {
		return server.NewJSConsumerNotFoundError()
	}
	return err
}

// ConsumerCreate is a consumer create's database error as the API answers it: a name
// PostgreSQL already holds, the stream's max_consumers reached (PostgreSQL counted, under
// the stream's lock), or a stream PostgreSQL no longer holds.
func ConsumerCreate(err error) error {
	switch {
	case errors.Is(err, pg.ErrExists):
		return server.NewJSConsumerNameExistError()
	case errors.Is(err, pg.ErrMaxConsumers):
		return server.NewJSMaximumConsumersLimitError()
	case errors.Is(err, pg.ErrNotFound):
		return server.NewJSStreamNotFoundError()
	}
	return err
}
