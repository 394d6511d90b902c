package pg

import "testing"

// A batch into a stream with max_msgs or max_bytes takes the fast path while it stays
// within them from the counts last committed, as nats bench's streams (max_bytes 1 GB) do;
// one that may reach a limit needs the general path's decision under the row lock.
func TestFastEligibleUnderLimits(t *testing.T) {
	st := tailState{lastSeq: 10, msgs: 10, bytes: 1000, chunkRows: 10}
	msgs := []AppendMsg{{Subject: "a", Data: make([]byte, 40)}, {Subject: "a", Data: make([]byte, 40)}}
	size := 2 * MessageSize(false, "a", nil, make([]byte, 40))
	for _, tc := range []struct {
		name string
		l    Limits
		want bool
	}{
		{"no limits", Limits{}, true},
		{"far from max_bytes", Limits{MaxBytes: 1 << 30, DiscardNew: true}, true},
		{"at max_bytes", Limits{MaxBytes: int64(1000 + size)}, true},
		{"past max_bytes", Limits{MaxBytes: int64(1000 + size - 1), DiscardNew: true}, false},
		{"at max_msgs", Limits{MaxMsgs: 12}, true},
		{"past max_msgs", Limits{MaxMsgs: 11}, false},
		{"per subject", Limits{MaxMsgsPer: 5}, false},
	} {
		if got := fastEligible(AppendBatch{Msgs: msgs, Limits: tc.l}, st); got != tc.want {
			t.Errorf("%s: fastEligible = %v, want %v", tc.name, got, tc.want)
		}
	}
}
