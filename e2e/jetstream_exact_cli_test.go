package e2e

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// TestJetStreamExactCLI runs nats CLI commands whose output differed from JetStream's against
// a real JetStream and against jetgres, and compares what they print once times and server
// names are taken out: stream info, the server's metadata, a consumer with replay original,
// a filtered consumer's positions after `nats consumer next` and its report, the account's
// reserved storage, and a key-value bucket's and an object store's add, status, info, seal
// and delete.
func TestJetStreamExactCLI(t *testing.T) {
	t.Parallel()
	servers := []natsServer{startJetStream(t), {name: "jetgres", url: startWithDatabase(t, testDatabase(t)).natsURL}}
	run := func(s natsServer) map[string]string {
		out := map[string]string{}
		natsAt(t, s, "stream", "add", "EX", "--subjects", "ex.>", "--max-bytes", "1MiB", "--defaults")
		for _, subj := range []string{"ex.a", "ex.b", "ex.a", "ex.b", "ex.b", "ex.a", "ex.a", "ex.b", "ex.b"} {
			natsAt(t, s, "pub", subj, "x")
		}
		out["stream info"] = natsAt(t, s, "stream", "info", "EX")
		out["stream info --json"] = natsAt(t, s, "stream", "info", "EX", "--json")
		out["consumer add replay original"] = natsAt(t, s, "consumer", "add", "EX", "RO", "--pull", "--replay", "original", "--ack", "explicit", "--defaults")
		natsAt(t, s, "consumer", "add", "EX", "F", "--pull", "--filter", "ex.a", "--ack", "explicit", "--defaults")
		// One at a time, each acked, as `nats consumer next` does: the filter skips 2, 4, 5,
		// 8 and 9, and the positions stop at 7.
		for range 4 {
			natsAt(t, s, "consumer", "next", "EX", "F")
		}
		out["consumer info --json"] = natsAt(t, s, "consumer", "info", "EX", "F", "--json")
		out["account info"] = natsAt(t, s, "account", "info")
		out["consumer report"] = natsAt(t, s, "consumer", "report", "EX")
		out["kv add"] = natsAt(t, s, "kv", "add", "CFG")
		natsAt(t, s, "kv", "put", "CFG", "k", "v")
		out["kv status"] = natsAt(t, s, "kv", "status", "CFG")
		out["object add"] = natsAt(t, s, "object", "add", "FILES")
		out["object info"] = natsAt(t, s, "object", "info", "FILES")
		out["object seal"] = natsAt(t, s, "object", "seal", "FILES", "-f")
		out["object del"] = natsAt(t, s, "object", "del", "FILES", "-f")
		return out
	}
	got := [2]map[string]string{run(servers[0]), run(servers[1])}

	for _, k := range []string{"stream info", "consumer add replay original", "consumer report", "kv add", "kv status",
		"object add", "object info", "object seal", "object del"} {
		want, ours := normaliseCLI(got[0][k]), normaliseCLI(got[1][k])
		if want != ours {
			t.Errorf("nats %s differs:\n--- jetstream\n%s\n--- jetgres\n%s", k, want, ours)
		}
	}
	if !strings.Contains(got[1]["consumer add replay original"], "Replay Policy: Original") {
		t.Errorf("jetgres printed no replay policy:\n%s", got[1]["consumer add replay original"])
	}

	var positions [2]struct {
		Delivered struct {
			Stream uint64 `json:"stream_seq"`
		} `json:"delivered"`
		AckFloor struct {
			Stream uint64 `json:"stream_seq"`
		} `json:"ack_floor"`
	}
	var metadata [2]struct {
		Config struct {
			Metadata map[string]string `json:"metadata"`
		} `json:"config"`
	}
	for i := range got {
		if err := json.Unmarshal([]byte(got[i]["consumer info --json"]), &positions[i]); err != nil {
			t.Fatalf("%s: consumer info --json: %v", servers[i].name, err)
		}
		if err := json.Unmarshal([]byte(got[i]["stream info --json"]), &metadata[i]); err != nil {
			t.Fatalf("%s: stream info --json: %v", servers[i].name, err)
		}
	}
	if positions[0] != positions[1] || positions[1].Delivered.Stream != 7 {
		t.Errorf("filtered consumer positions: jetstream %+v, jetgres %+v", positions[0], positions[1])
	}
	for _, k := range []string{"_nats.req.level", "_nats.ver"} {
		if a, b := metadata[0].Config.Metadata[k], metadata[1].Config.Metadata[k]; a == "" || a != b {
			t.Errorf("stream metadata %s: jetstream %q, jetgres %q", k, a, b)
		}
	}
	reserved := regexp.MustCompile(`\(.*reserved\)`)
	if a, b := reserved.FindAllString(got[0]["account info"], -1), reserved.FindAllString(got[1]["account info"], -1); strings.Join(a, ",") != strings.Join(b, ",") || len(a) == 0 {
		t.Errorf("account info reservations: jetstream %q, jetgres %q\n%s", a, b, got[1]["account info"])
	}
}

// normaliseCLI takes out of the CLI's output what legitimately differs between two servers:
// times and durations, server names and ids, and the API level each serves.
func normaliseCLI(out string) string {
	var keep []string
	for _, line := range strings.Split(out, "\n") {
		l := strings.TrimSpace(line)
		switch {
		case l == "",
			strings.HasPrefix(l, "Created:"), strings.HasPrefix(l, "Leader:"), strings.HasPrefix(l, "First Message:"),
			strings.HasPrefix(l, "Last Message:"), strings.HasPrefix(l, "Host Version:"), strings.HasPrefix(l, "Required API Level:"),
			strings.HasPrefix(l, "Information for"), strings.HasPrefix(l, "Last Delivered Message:"):
			continue
		}
		if at := strings.Index(l, " @ "); at >= 0 {
			l = l[:at] // a message's time on each server
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n")
}
