package pg_test

import (
	"testing"

	"github.com/jetgres/jetgres/pg/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
