package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jswire"
)

// natsBenchFloorAPI is the JetStream API prefix of the get floors: nats bench's gets under it
// reach the floor's responder on jetgres's link, and never the bridge, which serves $JS.API.
const natsBenchFloorAPI = "$JGFLOOR.API"

// natsBenchGetFloor runs nats bench's gets (js get sync and kv get, with one client and with
// natsBenchClients) under natsBenchFloorAPI against a responder on t's leafnode link. The
// responder answers each direct get on the link's read loop, at once, with a message made
// from the request, the headers a stored message carries and a payload of the run's size:
// nothing is looked up. The stream infos nats.go asks for before its first get are jetgres's
// own, asked once. What it measures is a get's round trip through jetgres's architecture
// (client → nats-server → leafnode link → bridge → back), the part of a jetgres get that no
// cache can take away. It needs the stream and bucket of t's runs, so it runs before they are
// deleted.
func (r *runner) natsBenchGetFloor(ctx context.Context, bin string, t *benchTarget, nb *NatsBench) error {
	c, err := dial(t.url, "jetgres-bench nats bench get floor")
	if err != nil {
		return err
	}
	defer c.close()
	infos := map[string][]byte{}
	for _, name := range []string{natsBenchStream, "KV_" + natsBenchBucket} {
		m, err := c.nc.RequestWithContext(ctx, "$JS.API.STREAM.INFO."+name, nil)
		if err != nil {
			return fmt.Errorf("get floor: stream info %s: %w", name, err)
		}
		infos[name] = m.Data
	}
	payload := make([]byte, nb.Size)
	link := t.node.link
	prefix := natsBenchFloorAPI + "."
	sub, err := respondOnLink(ctx, t, prefix+">", func(m *leaf.Msg) {
		if m.Reply == "" {
			return
		}
		rest := strings.TrimPrefix(m.Subject, prefix)
		if name, ok := strings.CutPrefix(rest, "STREAM.INFO."); ok {
			_ = link.Publish(m.Reply, "", nil, infos[name])
			return
		}
		get, ok := strings.CutPrefix(rest, "DIRECT.GET.")
		if !ok {
			return
		}
		stream, key, _ := strings.Cut(get, ".")
		var tok []string
		if key != "" {
			tok = strings.Split(key, ".")
		}
		req, desc := jswire.DirectRequest(tok, m.Data)
		if desc != "" {
			_ = link.Publish(m.Reply, "", jswire.StatusHeader(400, desc), nil)
			return
		}
		subject := req.LastFor
		if subject == "" {
			subject = natsBenchSubj
		}
		hdr := jswire.AppendHeaders(nil, "Nats-Stream", stream, "Nats-Subject", subject,
			"Nats-Sequence", strconv.FormatUint(max(req.Seq, 1), 10), "Nats-Time-Stamp", time.Now().UTC().Format(time.RFC3339Nano))
		_ = link.Publish(m.Reply, "", hdr, payload)
	})
	if err != nil {
		return fmt.Errorf("get floor: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	for _, run := range natsBenchRuns() {
		if !run.getFloor() {
			continue
		}
		r.prog.phase(fmt.Sprintf("nats bench     %s, link floor, on %s", run.label(), t.name), 0, 0)
		args := nb.natsBenchArgs(t.url, []string{"--js-api-prefix", natsBenchFloorAPI}, run.args, nb.SyncMsgs)
		res, err := runNatsBenchCLI(ctx, bin, args, nb.SyncMsgs)
		if err != nil {
			return fmt.Errorf("%s: %w", run.label(), err)
		}
		res.Bench, res.Clients, res.Target = run.name, max(run.clients, 1), TargetNatsBenchFloor
		nb.Results = append(nb.Results, res)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// getFloor tells the runs that the get floor repeats: the gets.
func (run natsBenchRun) getFloor() bool {
	return run.name == "js get sync" || run.name == "kv get"
}
