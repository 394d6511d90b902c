package bridge

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/consumerstate"
)

// Status lines a pull consumer sends to a request's inbox. Clients match on the code and
// on the lower-cased description, so the wording is nats-server's.
const (
	descNoMessages     = "No Messages"
	descRequestTimeout = "Request Timeout"
	descIdleHeartbeat  = "Idle Heartbeat"
	descMaxBytes       = "Message Size Exceeds MaxBytes"
	descBatchCompleted = "Batch Completed"
	descDeleted        = "Consumer Deleted"
	descMaxWaiting     = "Exceeded MaxWaiting"
	descRequestsPend   = "Requests Pending"
	descLeadership     = "Leadership Change"
)

// minPullHeartbeat is the shortest idle heartbeat a pull request may ask for. nats-server
// sets none, but each heartbeat is a message to the client, and a request asking for one
// every nanosecond would keep its consumer busy sending them; clients ask for seconds.
const minPullHeartbeat = 10 * time.Millisecond

// pullStatus is a status reply to a pull request: "NATS/1.0 <code> <desc>".
type pullStatus struct {
	code int
	desc string
}

func (p *pullStatus) Error() string { return strconv.Itoa(p.code) + " " + p.desc }

// pullRequest is one waiting MSG.NEXT request. batch and maxBytes count down as messages go
// out; a request is done when batch reaches zero.
type pullRequest struct {
	reply    string
	batch    int
	maxBytes int       // bytes still allowed; 0 means no limit
	expires  time.Time // zero: no expiry
	noWait   bool
	hb       time.Duration
	hbNext   time.Time
	received time.Time
	sent     int  // messages delivered to it so far
	seen     bool // its inbox had a subscriber once, so losing it means the client left
	// seenAt is the link's interest version when the inbox last had a subscriber: until
	// the version moves it still has, and a delivery need not look again.
	seenAt uint64
}

// decodePullRequest reads a MSG.NEXT body as nats-server does: empty means one message, a
// bare number is a batch size, otherwise the JSON request. The error is the 400 to send.
func decodePullRequest(body []byte, now time.Time) (pullRequest, *pullStatus) {
	req := bytes.TrimSpace(body)
	pr := pullRequest{batch: 1, received: now}
	switch {
	case len(req) == 0:
		return pr, nil
	case req[0] == '{':
		var r server.JSApiConsumerGetNextRequest
		if err := json.Unmarshal(req, &r); err != nil {
			return pr, &pullStatus{400, "Bad Request - " + err.Error()}
		}
		// Halving expires rather than doubling the heartbeat cannot overflow.
		if r.Heartbeat > 0 && r.Heartbeat > r.Expires/2 {
			return pr, &pullStatus{400, "Bad Request - heartbeat value too large"}
		}
		if r.Heartbeat > 0 && r.Heartbeat < minPullHeartbeat {
			return pr, &pullStatus{400, "Bad Request - heartbeat value too small"}
		}
		if r.MinPending != 0 || r.MinAckPending != 0 {
			return pr, &pullStatus{400, "Bad Request - Not a Overflow Priority consumer"}
		}
		if r.Id != "" {
			return pr, &pullStatus{400, "Bad Request - Not a Pinned Client Priority consumer"}
		}
		if r.Priority < 0 || r.Priority > 9 {
			return pr, &pullStatus{400, "Bad Request - Priority must be between 0 and 9"}
		}
		pr.batch = max(r.Batch, 1)
		pr.maxBytes = max(r.MaxBytes, 0)
		pr.noWait = r.NoWait
		// A negative expiry has passed already: the request times out at once, as in
		// nats-server, rather than wait forever.
		if r.Expires != 0 {
			pr.expires = now.Add(r.Expires)
		}
		if r.Heartbeat > 0 {
			pr.hb = r.Heartbeat
			pr.hbNext = now.Add(r.Heartbeat)
		}
		return pr, nil
	default:
		if n, err := strconv.Atoi(string(req)); err == nil {
			pr.batch = max(n, 1)
		}
		return pr, nil
	}
}

// checkPullLimits applies the consumer's max_batch, max_expires and max_bytes to a request.
func checkPullLimits(cfg *server.ConsumerConfig, pr *pullRequest, now time.Time) *pullStatus {
	if cfg.MaxRequestBatch > 0 && pr.batch > cfg.MaxRequestBatch {
		return &pullStatus{409, fmt.Sprintf("Exceeded MaxRequestBatch of %d", cfg.MaxRequestBatch)}
	}
	if !pr.expires.IsZero() && cfg.MaxRequestExpires > 0 && pr.expires.After(now.Add(cfg.MaxRequestExpires)) {
		return &pullStatus{409, fmt.Sprintf("Exceeded MaxRequestExpires of %v", cfg.MaxRequestExpires)}
	}
	if pr.maxBytes > 0 && cfg.MaxRequestMaxBytes > 0 && pr.maxBytes > cfg.MaxRequestMaxBytes {
		return &pullStatus{409, fmt.Sprintf("Exceeded MaxRequestMaxBytes of %v", cfg.MaxRequestMaxBytes)}
	}
	return nil
}

// pendingHeader is a status carrying what was left of a request, which clients subtract
// from what they think is outstanding; without it a Consume loop stalls.
func pendingHeader(code int, desc string, pr *pullRequest) []byte {
	return statusHeader(code, desc,
		server.JSPullRequestPendingMsgs, strconv.Itoa(pr.batch),
		server.JSPullRequestPendingBytes, strconv.Itoa(pr.maxBytes))
}

// heartbeatHeader is the idle heartbeat, naming the last consumer and stream sequences.
func heartbeatHeader(d consumerstate.Pair) []byte {
	return statusHeader(100, descIdleHeartbeat,
		server.JSLastConsumerSeq, strconv.FormatUint(d.Consumer, 10),
		server.JSLastStreamSeq, strconv.FormatUint(d.Stream, 10))
}
