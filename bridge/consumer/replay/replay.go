// Package replay paces a consumer with replay_policy original, as nats-server does: from its
// start until it has caught up with the stream's last message of that moment, each message
// goes out as long after the one before as it was stored after it (gaps under a
// millisecond do not wait), redeliveries included; from then on messages go out at once.
// A Pacer belongs to its consumer's goroutine; the package has no locks.
package replay

import (
	"time"

	"github.com/jetgres/jetgres/pg"
)

// Pacer paces one consumer's deliveries. The zero value lets everything go at once.
type Pacer struct {
	on   bool
	upTo uint64 // the stream's last sequence when the consumer started
	last int64  // the stored time of the message delivered last, 0 before the first
	seq  uint64 // the message being held back, and until when
	at   time.Time
}

// Original paces a consumer that starts while the stream's last sequence is upTo.
func Original(upTo uint64) Pacer { return Pacer{on: true, upTo: upTo} }

// On reports whether deliveries are paced: a caller that must read the clock for Hold
// asks first.
func (r *Pacer) On() bool { return r.on }

// Hold reports whether m must wait, and otherwise takes it as delivered at now. The wait
// starts when m is first found due.
func (r *Pacer) Hold(m pg.Message, now time.Time) bool {
	if !r.on {
		return false
	}
	if gap := time.Duration(m.TS - r.last); r.last > 0 && gap > time.Millisecond {
		if r.seq != m.Seq || r.at.IsZero() {
			r.seq, r.at = m.Seq, now.Add(gap)
		}
		if now.Before(r.at) {
			return true
		}
	}
	r.last, r.seq, r.at = m.TS, 0, time.Time{}
	return false
}

// Delivering says the consumer delivers from next on: once that is past the last sequence
// of its start, it has caught up and live messages go out at once.
func (r *Pacer) Delivering(next uint64) {
	if r.on && next > r.upTo {
		*r = Pacer{}
	}
}

// At is when the message held back may go, zero when none is.
func (r *Pacer) At() time.Time { return r.at }
