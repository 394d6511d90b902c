package pg_test

import (
	"math"
	"testing"

	"github.com/jetgres/jetgres/pg"
)

// A stream's chunk size is a quarter of the most messages its limits let it hold, within
// pg.ChunkRowsMin and pg.ChunkRowsDefault, as nats-server sizes a file store's blocks.
func TestChunkRowsForFollowsLimits(t *testing.T) {
	for _, c := range []struct {
		name string
		in   pg.ChunkSizing
		want int64
	}{
		{"no limits", pg.ChunkSizing{}, pg.ChunkRowsDefault},
		{"max_msgs 1000", pg.ChunkSizing{Limits: pg.Limits{MaxMsgs: 1000}}, pg.ChunkRowsMin},
		{"max_msgs 100,000", pg.ChunkSizing{Limits: pg.Limits{MaxMsgs: 100_000}}, 25_001},
		{"max_msgs 10 million", pg.ChunkSizing{Limits: pg.Limits{MaxMsgs: 10_000_000}}, pg.ChunkRowsDefault},
		{"discard new too", pg.ChunkSizing{Limits: pg.Limits{MaxMsgs: 100_000, DiscardNew: true}}, 25_001},
		{"max_bytes 16 MiB", pg.ChunkSizing{Limits: pg.Limits{MaxBytes: 16 << 20}}, 16<<20/128/4 + 1},
		{"max_bytes 16 MiB of messages up to 1 KiB", pg.ChunkSizing{Limits: pg.Limits{MaxBytes: 16 << 20}, MaxMsgSize: 1024}, 16<<20/1024/4 + 1},
		{"the smaller of max_msgs and max_bytes", pg.ChunkSizing{Limits: pg.Limits{MaxMsgs: 80_000, MaxBytes: 1 << 30}}, 20_001},
		{"key-value bucket", pg.ChunkSizing{Limits: pg.Limits{MaxMsgsPer: 1}}, pg.ChunkRowsMin},
		{"key-value bucket with max_bytes", pg.ChunkSizing{Limits: pg.Limits{MaxMsgsPer: 5, MaxBytes: 1 << 30}}, pg.ChunkRowsMin},
		{"per subject over 40,000 literal subjects", pg.ChunkSizing{Limits: pg.Limits{MaxMsgsPer: 2}, Subjects: 40_000}, 20_001},
		{"per subject with max_msgs smaller", pg.ChunkSizing{Limits: pg.Limits{MaxMsgsPer: 2, MaxMsgs: 60_000}, Subjects: 40_000}, 15_001},
		{"per subject past int64", pg.ChunkSizing{Limits: pg.Limits{MaxMsgsPer: math.MaxInt64 / 2}, Subjects: 3}, pg.ChunkRowsDefault},
	} {
		if got := pg.ChunkRowsFor(c.in); got != c.want {
			t.Errorf("%s: %d rows, want %d", c.name, got, c.want)
		}
	}
}

