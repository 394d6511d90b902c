package bench

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that a run stops everything it started: the benchmark starts PostgreSQL,
// jetgres and JetStream servers in-process.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
