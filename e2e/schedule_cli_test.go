package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/testwait"
)

// TestScheduleCLI schedules messages with `nats pub --schedule-*` on a real JetStream and
// on jetgres, and compares what the CLI prints, with times taken out, and what each
// schedule produced: a one-shot after two seconds, whose schedule then goes, and a message
// every second whose schedule stays.
func TestScheduleCLI(t *testing.T) {
	t.Parallel()
	servers := []natsServer{startJetStream(t), {name: "jetgres", url: startWithDatabase(t, testDatabase(t)).natsURL}}
	var out [2]string
	var got [2]string
	for i, s := range servers {
		natsAt(t, s, "stream", "add", "SC", "--subjects", "sc.>", "--allow-schedules", "--defaults")
		out[i] = natsAt(t, s, "pub", "sc.sched.once", "hello", "--schedule-after", "2s", "--schedule-dest", "sc.out.once")
		out[i] += natsAt(t, s, "pub", "sc.sched.every", "tick", "--schedule-every", "1s", "--schedule-dest", "sc.out.every")
		testwait.For(t, 20*time.Second, func() error {
			var subj map[string]uint64
			if err := json.Unmarshal([]byte(natsAt(t, s, "stream", "subjects", "SC", "--json")), &subj); err != nil {
				return err
			}
			if subj["sc.out.once"] != 1 || subj["sc.out.every"] < 2 || subj["sc.sched.once"] != 0 || subj["sc.sched.every"] != 1 {
				return fmt.Errorf("%s: subjects %v", s.name, subj)
			}
			return nil
		})
		var m struct {
			Subject string `json:"subject"`
			Header  []byte `json:"hdrs"`
			Data    []byte `json:"data"`
		}
		if err := json.Unmarshal([]byte(natsAt(t, s, "stream", "get", "SC", "--last-for", "sc.out.once", "--json")), &m); err != nil {
			t.Fatalf("%s: stream get: %v", s.name, err)
		}
		lines := strings.Split(strings.TrimSpace(string(m.Header)), "\r\n")
		slices.Sort(lines)
		got[i] = fmt.Sprintf("%s %q %q", m.Subject, lines, m.Data)
	}
	if a, b := cliTimes.ReplaceAllString(out[0], "T"), cliTimes.ReplaceAllString(out[1], "T"); a != b {
		t.Errorf("nats pub --schedule-* differs:\n--- jetstream\n%s\n--- jetgres\n%s", out[0], out[1])
	}
	if got[0] != got[1] {
		t.Errorf("produced:\njetstream %s\njetgres   %s", got[0], got[1])
	}
}
