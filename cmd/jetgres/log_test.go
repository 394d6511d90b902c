package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestDSNPassword(t *testing.T) {
	tests := map[string]string{
		"host=db user=app password=s3cret dbname=x": "s3cret",
		"password=s3cret": "s3cret",
		"host=db password = 's3 cr''et\\'x' sslmode=disable": "s3 cr'et'x",
		"host=db sslpassword=nothere":                        "",
		"host=db user=app":                                   "",
	}
	for dsn, want := range tests {
		if got := dsnPassword(dsn); got != want {
			t.Errorf("dsnPassword(%q) = %q, want %q", dsn, got, want)
		}
	}
}

func TestLoggerNeverWritesTheDatabasePassword(t *testing.T) {
	t.Setenv("PGPASSWORD", "envpass99")
	for _, format := range []string{"text", "json"} {
		for i, dbURL := range []string{
			"postgres://app:pa%40ss:w0rd@db:5432/x?sslmode=disable",
			"postgres://app@db/x?password=qpass123",
			"host=db user=app password='kw pass 42'",
		} {
			t.Run(fmt.Sprintf("%s/%d", format, i), func(t *testing.T) {
				var out strings.Builder
				cfg := config{LogFormat: format, LogLevel: "debug"}
				secrets := databaseSecrets(dbURL)
				log, err := newLogger(cfg, &out, secrets)
				if err != nil {
					t.Fatal(err)
				}
				err = fmt.Errorf("connect to %s: %w", dbURL, errors.New("refused"))
				log.Error("failed "+dbURL, "err", err, "url", dbURL, "env", "envpass99")
				log.With("dsn", dbURL).WithGroup("g").Info("x", "inner", dbURL)
				for _, s := range append(secrets, "pa@ss:w0rd", "pa%40ss:w0rd", "envpass99") {
					if strings.Contains(out.String(), s) {
						t.Errorf("log output contains secret %q:\n%s", s, out.String())
					}
				}
				if !strings.Contains(out.String(), redacted) {
					t.Errorf("log output has no %q:\n%s", redacted, out.String())
				}
			})
		}
	}
}

func TestRedactDatabaseURL(t *testing.T) {
	got := redactDatabaseURL("postgres://app:hunter2@db:5432/x")
	if strings.Contains(got, "hunter2") || !strings.Contains(got, "app:xxxxx@db:5432/x") {
		t.Errorf("redactDatabaseURL = %q", got)
	}
}
