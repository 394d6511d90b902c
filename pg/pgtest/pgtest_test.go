package pgtest

import (
	"strings"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

func TestMain(m *testing.M) { Main(m) }

func currentDatabase(t *testing.T, url string) string {
	t.Helper()
	var name string
	if err := rawsql.Open(t, url).QueryRow(t.Context(), `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	return name
}

func TestDatabasesAreFreshAndDropped(t *testing.T) {
	var first, second string
	t.Run("first", func(t *testing.T) {
		start := time.Now()
		url := NewDB(t)
		t.Logf("NewDB (first use: starts the cluster): %v", time.Since(start))
		first = currentDatabase(t, url)
	})
	t.Run("second", func(t *testing.T) {
		start := time.Now()
		url := NewDB(t)
		OpenAt(t, url)
		t.Logf("NewDB and OpenAt (CREATE DATABASE, connect, migrate): %v", time.Since(start))
		second = currentDatabase(t, url)
	})
	if first == second || !strings.HasPrefix(first, "t_testdatabasesarefreshanddropped_first_") {
		t.Errorf("database names %q and %q", first, second)
	}
	start := time.Now()
	db := rawsql.Open(t, NewDB(t))
	t.Logf("NewDB on a running cluster: %v", time.Since(start))
	var n int
	if err := db.QueryRow(t.Context(), `SELECT count(*) FROM pg_database WHERE datname IN ($1, $2)`, first, second).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d of the finished tests' databases still exist", n)
	}
}

func TestWithDatabase(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"host=/run/jetgres port=5432 user=jetgres dbname=jetgres sslmode=disable", "host=/run/jetgres port=5432 user=jetgres dbname=jetgres sslmode=disable dbname=t_1"},
		{"postgres://u:p@h:5432/jetgres?sslmode=disable", "postgres://u:p@h:5432/t_1?sslmode=disable"},
		{"postgresql://h/?dbname=x&sslmode=disable", "postgresql://h/t_1?sslmode=disable"},
	} {
		got, err := withDatabase(tc.in, "t_1")
		if err != nil || got != tc.want {
			t.Errorf("withDatabase(%q) = %q, %v, want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestWithParam(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"host=/run/jetgres dbname=t_1", "host=/run/jetgres dbname=t_1 default_query_exec_mode=exec"},
		{"postgres://u:p@h:5432/t_1?sslmode=disable", "postgres://u:p@h:5432/t_1?default_query_exec_mode=exec&sslmode=disable"},
	} {
		if got := WithParam(t, tc.in, "default_query_exec_mode", "exec"); got != tc.want {
			t.Errorf("WithParam(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestDBName(t *testing.T) {
	name := dbName("TestSomething/with spaces & Ünïcode/" + strings.Repeat("x", 80))
	if len(name) > 63 || !strings.HasPrefix(name, "t_testsomething_with_spaces_n_code_xxxxx") {
		t.Errorf("dbName = %q (%d bytes)", name, len(name))
	}
}
