package jserr

import (
	"errors"
	"strconv"

	"github.com/jetgres/jetgres/pg"
)

// Status is an inline status-line answer, such as "404 Message Not Found": a header-only
// message, the shape direct gets answer in when they send no message. As an error it is
// that verdict, which StatusOf passes on as it is.
type Status struct {
	Code        int
	Description string
}

func (s *Status) Error() string { return strconv.Itoa(s.Code) + " " + s.Description }

// The status lines nats-server answers a direct get with.
var (
	// NotServed is what a requester hears when no JetStream serves a direct get of the
	// stream: a stream that does not exist or does not allow direct gets. Clients retry it.
	NotServed = &Status{503, ""}
	// NoMessage: the message asked for is not in the stream.
	NoMessage = &Status{404, "Message Not Found"}
	// NoResults: no subject matched a multi_last request.
	NoResults = &Status{404, "No Results"}
	// TooManyResults: more subjects matched a multi_last request than one answer holds.
	TooManyResults = &Status{413, "Too Many Results"}
	// APILevel: the client requires a later JetStream API level than jetgres speaks.
	APILevel = &Status{412, "Required Api Level"}
)

// NoResponders is what a pull request hears when the replica it reached cannot serve its
// consumer now (too many loads in flight, or the database unreachable): the status a
// request with no subscriber gets, which clients retry.
var NoResponders = &Status{503, "No Responders"}

// BadRequest is a malformed direct get, desc saying what is wrong with it.
func BadRequest(desc string) *Status { return &Status{408, desc} }

// IsStatus reports whether err is a status-line verdict, as opposed to a failure to log.
func IsStatus(err error) bool {
	var s *Status
	return errors.As(err, &s)
}

// DirectLookup is a direct get's message read error as a status line answers it:
// PostgreSQL's not found is NoMessage, anything else stays as it is for StatusOf.
func DirectLookup(err error) error {
	if errors.Is(err, pg.ErrNotFound) {
		return NoMessage
	}
	return err
}

// StatusOf maps a direct get's error to the status line it answers with: a *Status is its
// own verdict; a database that cannot be reached is the 503 a client also hears while no
// JetStream serves the stream, which it retries; any other failure is the database's own
// 500.
func StatusOf(err error) *Status {
	var s *Status
	switch {
	case errors.As(err, &s):
		return s
	case Transient(err):
		return NotServed
	}
	return &Status{500, "Database Error"}
}
