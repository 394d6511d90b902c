package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// TestMirrorSourceCLI makes a mirror and a sourcing stream with `nats stream add --mirror`
// and `--source`, on a real JetStream and on jetgres, and compares what `nats stream info`
// shows of them once they copied what their origins hold: the configuration, the state, and
// the mirror and sources blocks (their activity times left out).
func TestMirrorSourceCLI(t *testing.T) {
	t.Parallel()
	servers := []natsServer{startJetStream(t), {name: "jetgres", url: startWithDatabase(t, testDatabase(t)).natsURL}}
	var info [2]string
	for i, s := range servers {
		natsAt(t, s, "stream", "add", "ORDERS", "--subjects", "orders.>", "--defaults")
		natsAt(t, s, "stream", "add", "RETURNS", "--subjects", "returns.>", "--defaults")
		js, err := jetstream.New(connectURL(t, s.url))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
		defer cancel()
		for n := range 10 {
			for _, subj := range []string{"orders.new", "returns.new"} {
				if _, err := js.Publish(ctx, subj, fmt.Appendf(nil, "%s %d", subj, n)); err != nil {
					t.Fatalf("%s: publish: %v", s.name, err)
				}
			}
		}
		natsAt(t, s, "stream", "add", "COPY", "--mirror", "ORDERS", "--defaults")
		natsAt(t, s, "stream", "add", "ALL", "--source", "ORDERS", "--source", "RETURNS", "--defaults")
		var got string
		testwait.For(t, 30*time.Second, func() error {
			got = ""
			for _, name := range []string{"COPY", "ALL"} {
				var si struct {
					Config  json.RawMessage  `json:"config"`
					State   map[string]any   `json:"state"`
					Mirror  map[string]any   `json:"mirror"`
					Sources []map[string]any `json:"sources"`
				}
				if err := json.Unmarshal([]byte(natsAt(t, s, "stream", "info", name, "--json")), &si); err != nil {
					return err
				}
				if si.State["messages"] != map[string]float64{"COPY": 10, "ALL": 20}[name] {
					return fmt.Errorf("%s: %s holds %v messages", s.name, name, si.State["messages"])
				}
				for _, block := range append([]map[string]any{si.Mirror}, si.Sources...) {
					if block == nil {
						continue
					}
					if a, ok := block["active"].(float64); !ok || a < 0 {
						return fmt.Errorf("%s: %s: origin not heard from: %v", s.name, name, block)
					}
					delete(block, "active")
				}
				var cfg map[string]any
				if err := json.Unmarshal(si.Config, &cfg); err != nil {
					return err
				}
				delete(cfg, "metadata")
				delete(si.State, "first_ts")
				delete(si.State, "last_ts")
				// nats-server lists sources in no particular order.
				slices.SortFunc(si.Sources, func(a, b map[string]any) int { return strings.Compare(fmt.Sprint(a["name"]), fmt.Sprint(b["name"])) })
				b, _ := json.Marshal([]any{cfg, si.State, si.Mirror, si.Sources})
				got += name + " " + string(b) + "\n"
			}
			return nil
		})
		info[i] = got
		text := natsAt(t, s, "stream", "info", "COPY")
		wantAll(t, s.name+": nats stream info COPY", text, "Mirror Information", "Stream Name: ORDERS")
	}
	if info[0] != info[1] {
		t.Errorf("stream info differs:\njetstream %s\njetgres   %s", info[0], info[1])
	}
}
