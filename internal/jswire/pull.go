package jswire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Status lines a pull consumer sends to a request's inbox. Clients match on the code and
// on the lower-cased description, so the wording is nats-server's.
const (
	DescNoMessages     = "No Messages"
	DescRequestTimeout = "Request Timeout"
	descIdleHeartbeat  = "Idle Heartbeat"
	DescMaxBytes       = "Message Size Exceeds MaxBytes"
	DescBatchCompleted = "Batch Completed"
	DescDeleted        = "Consumer Deleted"
	DescMaxWaiting     = "Exceeded MaxWaiting"
	DescRequestsPend   = "Requests Pending"
	DescLeadership     = "Leadership Change"
)

// minPullHeartbeat is the shortest idle heartbeat a pull request may ask for. nats-server
// sets none, but each heartbeat is a message to the client, and a request asking for one
// every nanosecond would keep its consumer busy sending them; clients ask for seconds.
const minPullHeartbeat = 10 * time.Millisecond

// PullStatus is a status reply to a pull request: "NATS/1.0 <code> <desc>".
type PullStatus struct {
	Code int
	Desc string
}

func (p *PullStatus) Error() string { return strconv.Itoa(p.Code) + " " + p.Desc }

// PullRequest is a MSG.NEXT request as the client asked for it.
type PullRequest struct {
	Batch     int
	MaxBytes  int       // 0 means no limit
	Expires   time.Time // zero: no expiry
	NoWait    bool
	Heartbeat time.Duration
	// Group is the request's priority group fields, nil for a request that is not JSON, as
	// nats-server tells the two apart (bridge/consumer/priority judges them).
	Group *server.PriorityGroup
}

// DecodePullRequest reads a MSG.NEXT body as nats-server does: empty means one message, a
// bare number is a batch size, otherwise the JSON request. The error is the 400 to send.
func DecodePullRequest(body []byte, now time.Time) (PullRequest, *PullStatus) {
	req := bytes.TrimSpace(body)
	pr := PullRequest{Batch: 1}
	switch {
	case len(req) == 0:
		return pr, nil
	case req[0] == '{':
		var r server.JSApiConsumerGetNextRequest
		if err := json.Unmarshal(req, &r); err != nil {
			return pr, &PullStatus{400, "Bad Request - " + err.Error()}
		}
		// Halving expires rather than doubling the heartbeat cannot overflow.
		if r.Heartbeat > 0 && r.Heartbeat > r.Expires/2 {
			return pr, &PullStatus{400, "Bad Request - heartbeat value too large"}
		}
		if r.Heartbeat > 0 && r.Heartbeat < minPullHeartbeat {
			return pr, &PullStatus{400, "Bad Request - heartbeat value too small"}
		}
		pr.Batch = max(r.Batch, 1)
		pr.MaxBytes = max(r.MaxBytes, 0)
		pr.NoWait = r.NoWait
		pr.Group = &r.PriorityGroup
		// A negative expiry has passed already: the request times out at once, as in
		// nats-server, rather than wait forever.
		if r.Expires != 0 {
			pr.Expires = now.Add(r.Expires)
		}
		if r.Heartbeat > 0 {
			pr.Heartbeat = r.Heartbeat
		}
		return pr, nil
	default:
		if n, err := strconv.Atoi(string(req)); err == nil {
			pr.Batch = max(n, 1)
		}
		return pr, nil
	}
}

// CheckPullLimits applies the consumer's max_batch, max_expires and max_bytes to a request.
func CheckPullLimits(cfg *server.ConsumerConfig, pr *PullRequest, now time.Time) *PullStatus {
	if cfg.MaxRequestBatch > 0 && pr.Batch > cfg.MaxRequestBatch {
		return &PullStatus{409, fmt.Sprintf("Exceeded MaxRequestBatch of %d", cfg.MaxRequestBatch)}
	}
	if !pr.Expires.IsZero() && cfg.MaxRequestExpires > 0 && pr.Expires.After(now.Add(cfg.MaxRequestExpires)) {
		return &PullStatus{409, fmt.Sprintf("Exceeded MaxRequestExpires of %v", cfg.MaxRequestExpires)}
	}
	if pr.MaxBytes > 0 && cfg.MaxRequestMaxBytes > 0 && pr.MaxBytes > cfg.MaxRequestMaxBytes {
		return &PullStatus{409, fmt.Sprintf("Exceeded MaxRequestMaxBytes of %v", cfg.MaxRequestMaxBytes)}
	}
	return nil
}

// PendingStatus is a status carrying what was left of a request (batch messages and
// maxBytes bytes), which clients subtract from what they think is outstanding; without it a
// Consume loop stalls.
func PendingStatus(code int, desc string, batch, maxBytes int) []byte {
	return StatusHeader(code, desc,
		server.JSPullRequestPendingMsgs, strconv.Itoa(batch),
		server.JSPullRequestPendingBytes, strconv.Itoa(maxBytes))
}

// HeartbeatStatus is the idle heartbeat, naming the last consumer and stream sequences.
func HeartbeatStatus(consumerSeq, streamSeq uint64) []byte {
	return StatusHeader(100, descIdleHeartbeat,
		server.JSLastConsumerSeq, strconv.FormatUint(consumerSeq, 10),
		server.JSLastStreamSeq, strconv.FormatUint(streamSeq, 10))
}
