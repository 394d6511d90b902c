// Package priority is a pull consumer's priority groups as nats-server 2.15 serves them:
// what a pull request's priority fields may ask of a consumer with or without a
// priority_policy, which waiting request may take the next message (overflow's min_pending
// and min_ack_pending, the pinned client and its pin id), the order of the requests of a
// prioritized consumer, the pin's lifetime (pinned_ttl, renewed by each request that
// carries the pin, and nothing of it kept by a replica that takes the consumer over, as a
// new JetStream leader keeps none), and what a consumer's info reports of it.
//
// The queue of waiting requests (bridge/consumer/pullqueue) owns a Pin and asks it as
// requests come and messages go. The pin's expiry is judged against the time it is given,
// the consumer's clock: a Pin has no timer of its own, and the queue wakes its consumer at
// Deadline.
//
// # Locks
//
// It has none: a Pin belongs to its consumer's goroutine, which holds the consumer's lock
// while it calls it, and API requests that read or clear it take that lock too.
package priority

import (
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nuid"

	"github.com/jetgres/jetgres/internal/jswire"
)

// Status descriptions of pull requests to a consumer with priority groups, nats-server's
// words: a request naming a pin that is not the current one is refused with the first
// when it comes, and dropped with the second when it waits while the pin changed.
const (
	DescPinMismatch = "Nats-Pin-Id mismatch"
	DescWrongPin    = "Nats-Wrong-Pin-Id"
)

// ErrUnknownGroup is the answer to an unpin of a group the consumer does not have.
var ErrUnknownGroup = errors.New("priority: not a priority group of the consumer")

// Check applies a request's priority fields to cfg as nats-server does when the request
// comes, after the consumer's request limits: nil when it may wait, otherwise the 400 to
// answer. g is nil for a request that is not JSON, which nothing is asked of.
func Check(cfg *server.ConsumerConfig, g *server.PriorityGroup) *jswire.PullStatus {
	if g == nil {
		return nil
	}
	switch {
	case (g.MinPending != 0 || g.MinAckPending != 0) && cfg.PriorityPolicy != server.PriorityOverflow:
		return &jswire.PullStatus{Code: 400, Desc: "Bad Request - Not a Overflow Priority consumer"}
	case g.Id != "" && cfg.PriorityPolicy != server.PriorityPinnedClient:
		return &jswire.PullStatus{Code: 400, Desc: "Bad Request - Not a Pinned Client Priority consumer"}
	case g.Priority < 0 || g.Priority > 9:
		return &jswire.PullStatus{Code: 400, Desc: "Bad Request - Priority must be between 0 and 9"}
	case cfg.PriorityPolicy == server.PriorityNone:
		return nil
	case g.Group == "":
		return &jswire.PullStatus{Code: 400, Desc: "Bad Request - Priority Group missing"}
	case !slices.Contains(cfg.PriorityGroups, g.Group):
		return &jswire.PullStatus{Code: 400, Desc: "Bad Request - Invalid Priority Group"}
	}
	return nil
}

// Level is where a request stands in a prioritized consumer's queue: its priority, 0 the
// first, and a request that is not JSON after all others.
func Level(g *server.PriorityGroup) int {
	if g == nil {
		return maxLevel
	}
	return g.Priority
}

// maxLevel is nats-server's level of a request without priority fields.
const maxLevel = 1<<31 - 1

// Verdict is what becomes of the request at the head of the queue when a message waits.
type Verdict uint8

const (
	// Serve: it may take the message, if its byte limit and its client allow.
	Serve Verdict = iota
	// Skip: it waits on at the back of the queue (not pinned, or overflow not reached).
	Skip
	// WrongPin: it names a pin that is no longer the current one, and is dropped with a 423.
	WrongPin
)

// Pin is a pinned_client consumer's current pin: the id that the requests of the client
// holding it carry, when it was given, and when it lapses unless a request renews it. The
// zero Pin holds nothing.
type Pin struct {
	id      string
	since   time.Time
	expires time.Time
}

// expire forgets a pin whose pinned_ttl ran out at now.
func (p *Pin) expire(now time.Time) {
	if p.id != "" && !now.Before(p.expires) {
		*p = Pin{}
	}
}

// Admit takes a request's pin id as it comes at now: a request carrying the current pin
// renews it, one carrying another is answered with the returned 423. Called after Check.
func (p *Pin) Admit(cfg *server.ConsumerConfig, g *server.PriorityGroup, now time.Time) *jswire.PullStatus {
	p.expire(now)
	if g == nil || cfg.PriorityPolicy == server.PriorityNone || p.id == "" {
		return nil
	}
	switch g.Id {
	case p.id:
		p.expires = now.Add(cfg.PinnedTTL)
	case "":
	default:
		return &jswire.PullStatus{Code: 423, Desc: DescPinMismatch}
	}
	return nil
}

// Needed reports whether the next request to take a message is given a new pin: a
// pinned_client consumer with none at now. The queue asks once per message, as
// nats-server does, however many requests it then looks at.
func (p *Pin) Needed(cfg *server.ConsumerConfig, now time.Time) bool {
	p.expire(now)
	return cfg.PriorityPolicy == server.PriorityPinnedClient && p.id == ""
}

// Pick judges the request at the head of the queue, whose priority fields are g (its
// pin id set here when it is given the pin), for a message: needPin is Needed's answer,
// numPending the consumer's messages not yet delivered, this one included, and ackPending
// those waiting for an ack. assigned reports whether the request was given the pin, which
// Release takes back if it cannot take the message after all.
func (p *Pin) Pick(cfg *server.ConsumerConfig, g *server.PriorityGroup, needPin bool, numPending int64, ackPending int, now time.Time) (v Verdict, assigned bool) {
	switch {
	case needPin:
		if g != nil && g.Id != "" {
			return WrongPin, false
		}
		// A request that is not JSON names no group and gets no pin, but the message all the
		// same, as from nats-server.
		if g != nil && g.Group != "" {
			p.id, p.since, p.expires = nuid.Next(), now.UTC(), now.Add(cfg.PinnedTTL)
			g.Id = p.id
		}
		assigned = true
	case p.id != "":
		switch {
		case g != nil && g.Id == p.id:
		case g == nil || g.Id == "":
			return Skip, false
		default:
			return WrongPin, false
		}
	}
	if cfg.PriorityPolicy == server.PriorityOverflow && g != nil && (g.MinPending > 0 || g.MinAckPending > 0) &&
		!(g.MinPending > 0 && g.MinPending <= numPending || g.MinAckPending > 0 && g.MinAckPending <= int64(ackPending)) {
		return Skip, assigned
	}
	return Serve, assigned
}

// Release takes back a pin Pick just gave.
func (p *Pin) Release() { *p = Pin{} }

// Unpin takes the pin away from the client holding it, as CONSUMER.UNPIN does: the next
// request to take a message gets a new one.
func (p *Pin) Unpin() { *p = Pin{} }

// ID is the current pin id at now, empty when none is held.
func (p *Pin) ID(now time.Time) string {
	p.expire(now)
	return p.id
}

// Deadline is when the pin held at now lapses unless renewed, zero when none is: a
// consumer with requests waiting looks again then, to give the pin to one of them.
func (p *Pin) Deadline(now time.Time) time.Time {
	p.expire(now)
	return p.expires
}

// States is a consumer info's priority_groups as nats-server reports it: the first group
// of cfg with the pin p holds at now (p nil: none), nothing for a consumer without groups.
func States(cfg *server.ConsumerConfig, p *Pin, now time.Time) []server.PriorityGroupState {
	if len(cfg.PriorityGroups) == 0 {
		return nil
	}
	st := server.PriorityGroupState{Group: cfg.PriorityGroups[0]}
	if p != nil {
		p.expire(now)
		st.PinnedClientID, st.PinnedTS = p.id, p.since
	}
	return []server.PriorityGroupState{st}
}
