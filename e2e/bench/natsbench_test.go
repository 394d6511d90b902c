package bench

import (
	"fmt"
	"testing"
)

// Outputs of natscli v0.5.0's nats bench, one client and two, trimmed to what matters.
const (
	natsBenchOneClient = `03:12:10 [1] Starting JetStream synchronous publisher, publishing 500 messages

NATS JetStream synchronous publisher stats: 6,119 msgs/sec ~ 765 KiB/sec ~ min: 107.93us ~ avg: 162.73us ~ max: 1,626.78us ~ P50: 151.74us ~ P90: 200.83us ~ P99: 290.47us ~ P99.9: 1,626.78us
`
	natsBenchTwoClients = `
  [1] 3,888 msgs/sec ~ 486 KiB/sec ~ min: 103.90us ~ avg: 256.87us ~ max: 4,090.28us ~ P50: 215.15us ~ P90: 367.04us ~ P99: 867.65us ~ P99.9: 4,090.28us (1,000 msgs)
  [2] 3,806 msgs/sec ~ 476 KiB/sec ~ min: 99.74us ~ avg: 262.42us ~ max: 4,278.95us ~ P50: 213.27us ~ P90: 383.75us ~ P99: 978.24us ~ P99.9: 4,278.95us (1,000 msgs)

 NATS JetStream synchronous getter aggregated stats: 7,613 msgs/sec ~ 952 KiB/sec
 message rates min 3,806 | avg 3,847 | max 3,888 | stddev 41 msgs
 latencies per operation min 99.74us | avg 259.64us | max 4,278.95us | stddev 348.30us | P50 214.53us | P90 378.06us | P99 896.35us | P99.9: 4,090.28us
`
	natsBenchNoLatency = `
  [1] 121,498 msgs/sec ~ 15 MiB/sec (1,000 msgs)
  [2] 70,774 msgs/sec ~ 8.6 MiB/sec (1,000 msgs)

 NATS JetStream ordered ephemeral consumer aggregated stats: 122,140 msgs/sec ~ 15 MiB/sec
 message rates min 70,774 | avg 96,136 | max 121,498 | stddev 25,362 msgs
`
)

func TestParseNatsBench(t *testing.T) {
	for _, tc := range []struct {
		name string
		out  string
		want NatsBenchResult
	}{
		{"one client", natsBenchOneClient, NatsBenchResult{MsgsPerSec: 6119, P50us: 151.74, P90us: 200.83, P99us: 290.47}},
		{"aggregate, not a client's", natsBenchTwoClients, NatsBenchResult{MsgsPerSec: 7613, P50us: 214.53, P90us: 378.06, P99us: 896.35}},
		{"no latency", natsBenchNoLatency, NatsBenchResult{MsgsPerSec: 122140}},
	} {
		got, err := parseNatsBench(tc.out)
		if err != nil || got != tc.want {
			t.Errorf("%s: parseNatsBench = %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
	if _, err := parseNatsBench("nats: error: nats: no servers available for connection\n"); err == nil {
		t.Error("an output without a summary parsed")
	}
}

func TestNatsBenchGoals(t *testing.T) {
	nb := &NatsBench{}
	add := func(bench string, clients int, target string, rate, p50 float64) {
		nb.Results = append(nb.Results, NatsBenchResult{Bench: bench, Clients: clients, Target: target, MsgsPerSec: rate, P50us: p50})
	}
	add("js get sync", 1, TargetJetgresCommitOn, 1000, 140)
	add("js get sync", 1, TargetJetStream, 5000, 100)
	add("kv put", 1, TargetJetgresCommitOn, 900, 1200)
	add("js pub sync", 1, TargetJetgresCommitOn, 1000, 1000)
	add("js pub async", 1, TargetJetStream, 100_000, 0)
	add("js pub async", 1, TargetJetgresCommitOn, 85_000, 0)
	add("js pub async", 1, TargetJetgresCommitOff, 90_000, 0)
	got := map[string]bool{}
	for _, g := range natsBenchGoals(nb) {
		got[g.Name] = g.Met
	}
	want := map[string]bool{
		"nats bench js get sync p50 vs JetStream":                                   true,
		"nats bench kv put p50 vs jetgres's own js pub sync p50":                    false,
		"nats bench js pub async, jetgres, commit on, vs JetStream (default sync)":  true,
		"nats bench js pub async, jetgres, commit off, vs JetStream (default sync)": false,
	}
	if len(got) != len(want) {
		t.Errorf("goals %v, want %v (a goal without its numbers is left out)", got, want)
	}
	for name, met := range want {
		if m, ok := got[name]; !ok || m != met {
			t.Errorf("goal %q: met %v (present %v), want %v", name, m, ok, met)
		}
	}
}

// The link floor and the storage floor show under jetgres's columns, in that order, right
// after jetgres's own js pub async row, each with its ratio to JetStream's rate.
func TestNatsBenchFloorRow(t *testing.T) {
	nb := &NatsBench{Results: []NatsBenchResult{
		{Bench: "js pub async", Clients: 1, Target: TargetJetStream, MsgsPerSec: 100_000},
		{Bench: "js pub async", Clients: 1, Target: TargetJetgresCommitOn, MsgsPerSec: 50_000},
		{Bench: "js pub async", Clients: 1, Target: TargetNatsBenchStoreFloor, MsgsPerSec: 60_000},
		{Bench: "js pub async", Clients: 1, Target: TargetNatsBenchFloor, MsgsPerSec: 80_000},
	}}
	rows := nb.rows()
	if len(rows) != 3 {
		t.Fatalf("rows %q, want jetgres's js pub async, its link floor and its storage floor", rows)
	}
	for i, want := range []struct {
		label string
		rate  float64
	}{{"js pub async, link floor (no storage)", 80_000}, {"js pub async, storage floor (COPY + commit per batch)", 60_000}} {
		floor := rows[1+i]
		if floor[0] != want.label || floor[1] != fmtRate(want.rate) || floor[2] != fmtRate(want.rate) || floor[3] != "—" ||
			floor[len(floor)-2] != fmtRatio(want.rate/100_000) {
			t.Errorf("floor row %q, want %s at %s", floor, want.label, fmtRate(want.rate))
		}
	}
	nb.Results = nb.Results[:3]
	if rows := nb.rows(); len(rows) != 2 || rows[1][0] != "js pub async, storage floor (COPY + commit per batch)" {
		t.Errorf("without a link floor, rows %q", rows)
	}
	nb.Results = nb.Results[:2]
	if rows := nb.rows(); len(rows) != 1 {
		t.Errorf("without a floor, rows %q", rows)
	}
}

// A get's link floor shows right after jetgres's own row of the same run and client count,
// with its p50.
func TestNatsBenchGetFloorRows(t *testing.T) {
	nb := &NatsBench{Results: []NatsBenchResult{
		{Bench: "kv get", Clients: 1, Target: TargetJetStream, MsgsPerSec: 10_000, P50us: 90},
		{Bench: "kv get", Clients: 1, Target: TargetJetgresCommitOn, MsgsPerSec: 5_000, P50us: 180},
		{Bench: "kv get", Clients: 1, Target: TargetNatsBenchFloor, MsgsPerSec: 8_000, P50us: 110},
		{Bench: "kv get", Clients: natsBenchClients, Target: TargetJetStream, MsgsPerSec: 40_000, P50us: 150},
		{Bench: "kv get", Clients: natsBenchClients, Target: TargetJetgresCommitOn, MsgsPerSec: 20_000, P50us: 300},
		{Bench: "kv get", Clients: natsBenchClients, Target: TargetNatsBenchFloor, MsgsPerSec: 30_000, P50us: 200},
	}}
	rows := nb.rows()
	if len(rows) != 4 {
		t.Fatalf("rows %q, want each kv get row followed by its floor", rows)
	}
	for i, want := range []struct {
		label, cell, ratio string
	}{
		{"kv get, link floor (nothing looked up)", fmtRate(8_000) + ", p50 " + fmtMs(110), fmtRatio(0.8)},
		{fmt.Sprintf("kv get, %d clients, link floor (nothing looked up)", natsBenchClients), fmtRate(30_000) + ", p50 " + fmtMs(200), fmtRatio(0.75)},
	} {
		floor := rows[2*i+1]
		if floor[0] != want.label || floor[1] != want.cell || floor[2] != want.cell || floor[3] != "—" || floor[len(floor)-1] != want.ratio {
			t.Errorf("floor row %q, want %s: %s, ratio %s", floor, want.label, want.cell, want.ratio)
		}
	}
}
