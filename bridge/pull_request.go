package bridge

import (
	"time"

	"github.com/jetgres/jetgres/bridge/consumerstate"
	"github.com/jetgres/jetgres/internal/jswire"
)

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

// newPullRequest is a decoded request, received at now, as it starts to wait.
func newPullRequest(r jswire.PullRequest, now time.Time) pullRequest {
	pr := pullRequest{batch: r.Batch, maxBytes: r.MaxBytes, expires: r.Expires, noWait: r.NoWait, received: now}
	if r.Heartbeat > 0 {
		pr.hb = r.Heartbeat
		pr.hbNext = now.Add(r.Heartbeat)
	}
	return pr
}

// pendingHeader is a status carrying what was left of a request.
func pendingHeader(code int, desc string, pr *pullRequest) []byte {
	return jswire.PendingStatus(code, desc, pr.batch, pr.maxBytes)
}

// heartbeatHeader is the idle heartbeat after delivery d.
func heartbeatHeader(d consumerstate.Pair) []byte {
	return jswire.HeartbeatStatus(d.Consumer, d.Stream)
}
