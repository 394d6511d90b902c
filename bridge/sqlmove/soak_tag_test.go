//go:build soak

package sqlmove

import "testing"

// TestSQLPublishSoak publishes 1,000,000 messages from SQL and checks that staging stays
// bounded and ends empty: go test -tags soak -run TestSQLPublishSoak -v ./bridge/sqlmove/
func TestSQLPublishSoak(t *testing.T) {
	soakSQLPublish(t, 1_000_000)
}
