package bridge

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/clock/clocktest"
)

// The tests in this file compare the flow_control ack policy, the one JetStream's stream
// sourcing creates its consumers with, on jetgres and on a real JetStream: its
// configurations, valid and invalid, on create, info and update; and a delivery sequence
// answered as a sourcing stream answers, read on a plain protocol connection so that the
// flow-control requests and heartbeats compare byte for byte.

func TestAckFlowControlConfigTwin(t *testing.T) {
	t.Parallel()
	tw := newPushTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "FCWQ", Subjects: []string{"fcwq.>"}, Retention: jetstream.WorkQueuePolicy})
	create := func(stream, name, cfg string) [2]server.JSApiConsumerCreateResponse {
		return tw.request("$JS.API.CONSUMER.CREATE."+stream+"."+name, `{"stream_name":"`+stream+`","config":`+cfg+`}`)
	}

	for _, c := range []struct{ what, stream, name, cfg string }{
		{"the defaults it implies", pushStream, "F1", `{"durable_name":"F1","deliver_subject":"dlv.f1","ack_policy":"flow_control"}`},
		{"with max_ack_pending", pushStream, "F2", `{"durable_name":"F2","deliver_subject":"dlv.f2","ack_policy":"flow_control","max_ack_pending":100}`},
		{"as stream sourcing asks", pushStream, "F3", `{"durable_name":"F3","deliver_subject":"dlv.f3","ack_policy":"flow_control","flow_control":true,"idle_heartbeat":1000000000,"max_ack_pending":1000,"deliver_policy":"by_start_sequence","opt_start_seq":1,"filter_subject":"pushc.a","num_replicas":1}`},
		{"another heartbeat is replaced", pushStream, "F4", `{"durable_name":"F4","deliver_subject":"dlv.f4","ack_policy":"flow_control","idle_heartbeat":5000000000}`},
		{"in a deliver group", pushStream, "F5", `{"durable_name":"F5","deliver_subject":"dlv.f5","deliver_group":"g","ack_policy":"flow_control"}`},
		{"on a work queue", "FCWQ", "W1", `{"durable_name":"W1","deliver_subject":"dlv.w1","ack_policy":"flow_control","filter_subject":"fcwq.a"}`},
	} {
		if e := tw.sameAnswer(c.what, create(c.stream, c.name, c.cfg), false); e != nil {
			t.Fatalf("%s: refused: %v", c.what, e)
		}
		tw.cons = append(tw.cons, [2]string{c.stream, c.name})
		tw.compareAll("create " + c.what)
		info := tw.request("$JS.API.CONSUMER.INFO."+c.stream+"."+c.name, "")
		if e := tw.sameAnswer("info of "+c.what, info, false); e != nil {
			t.Fatalf("info of %s: %v", c.what, e)
		}
		if got := info[ours].Config; got.AckPolicy != server.AckFlowControl || !got.FlowControl || got.Heartbeat != time.Second ||
			got.AckWait != 0 || got.MaxDeliver != -1 || got.MaxAckPending <= 0 {
			t.Errorf("info of %s: %+v", c.what, got)
		}
	}

	for _, c := range []struct{ what, stream, cfg string }{
		{"on a pull consumer", pushStream, `{"durable_name":"X","ack_policy":"flow_control"}`},
		{"on a pull consumer with flow control and heartbeat", pushStream, `{"durable_name":"X","ack_policy":"flow_control","flow_control":true,"idle_heartbeat":1000000000}`},
		{"with max_deliver", pushStream, `{"durable_name":"X","deliver_subject":"dlv.x","ack_policy":"flow_control","max_deliver":3}`},
		{"with max_deliver 1", pushStream, `{"durable_name":"X","deliver_subject":"dlv.x","ack_policy":"flow_control","max_deliver":1}`},
		{"with ack_wait", pushStream, `{"durable_name":"X","deliver_subject":"dlv.x","ack_policy":"flow_control","ack_wait":1000000000}`},
		{"with backoff", pushStream, `{"durable_name":"X","deliver_subject":"dlv.x","ack_policy":"flow_control","backoff":[1000000000]}`},
		{"with backoff and max_deliver", pushStream, `{"durable_name":"X","deliver_subject":"dlv.x","ack_policy":"flow_control","backoff":[1000000000],"max_deliver":2}`},
		{"without max_ack_pending", pushStream, `{"durable_name":"X","deliver_subject":"dlv.x","ack_policy":"flow_control","max_ack_pending":-1}`},
		{"to a wildcard", pushStream, `{"durable_name":"X","deliver_subject":"dlv.*","ack_policy":"flow_control"}`},
		{"to the stream's subjects", pushStream, `{"durable_name":"X","deliver_subject":"pushc.x","ack_policy":"flow_control"}`},
		{"on a work queue from new messages", "FCWQ", `{"durable_name":"X","deliver_subject":"dlv.x","ack_policy":"flow_control","deliver_policy":"new","filter_subject":"fcwq.b"}`},
		{"on a work queue overlapping another", "FCWQ", `{"durable_name":"X","deliver_subject":"dlv.x","ack_policy":"flow_control","filter_subject":"fcwq.>"}`},
	} {
		if e := tw.sameAnswer(c.what, create(c.stream, "X", c.cfg), false); e == nil {
			t.Errorf("%s: accepted", c.what)
		}
	}
	tw.compareAll("refused creates")

	update := func(what, cfg string, ok bool) {
		t.Helper()
		e := tw.sameAnswer(what, create(pushStream, "F2", cfg), false)
		switch {
		case ok && e != nil:
			t.Errorf("%s: refused: %v", what, e)
		case !ok && e == nil:
			t.Errorf("%s: accepted", what)
		}
		tw.compareAll(what)
	}
	update("max_ack_pending changes", `{"durable_name":"F2","deliver_subject":"dlv.f2","ack_policy":"flow_control","max_ack_pending":50,"description":"d"}`, true)
	update("the ack policy changes to explicit", `{"durable_name":"F2","deliver_subject":"dlv.f2","ack_policy":"explicit","max_ack_pending":50}`, false)
	update("ack_wait is added", `{"durable_name":"F2","deliver_subject":"dlv.f2","ack_policy":"flow_control","max_ack_pending":50,"ack_wait":1000000000}`, false)
	update("max_ack_pending is removed", `{"durable_name":"F2","deliver_subject":"dlv.f2","ack_policy":"flow_control","max_ack_pending":-1}`, false)
	update("it becomes a pull consumer", `{"durable_name":"F2","ack_policy":"flow_control","max_ack_pending":50}`, false)
	if e := tw.sameAnswer("create explicit", create(pushStream, "E1", `{"durable_name":"E1","deliver_subject":"dlv.e1","ack_policy":"explicit"}`), false); e != nil {
		t.Fatalf("create explicit: %v", e)
	}
	tw.cons = append(tw.cons, [2]string{pushStream, "E1"})
	if e := tw.sameAnswer("explicit to flow_control", create(pushStream, "E1", `{"durable_name":"E1","deliver_subject":"dlv.e1","ack_policy":"flow_control"}`), false); e == nil {
		t.Error("explicit to flow_control: accepted")
	}
	tw.compareAll("updates")
}

// TestAckFlowControlDeliveryTwin drives a flow_control consumer with max_ack_pending 4 as a
// sourcing stream would: requests at max_ack_pending, answers whose headers ack, an ack
// on the ack subject that must not count, an answer without headers, and the request
// that follows a heartbeat while deliveries are pending. Every step compares what was sent
// and the consumer info (ack floor, num_ack_pending, delivered) with JetStream's.
func TestAckFlowControlDeliveryTwin(t *testing.T) {
	t.Parallel()
	tw, clock := newClockTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "FCA", Subjects: []string{"fca.>"}})
	tw.pubN("fca.x", 10, 16)
	var raw [2]*rawConn
	for side, js := range tw.js {
		raw[side] = dialRaw(t, js.Conn().ConnectedUrl(), "dlv.fca")
	}
	if e := tw.sameAnswer("create", tw.request("$JS.API.CONSUMER.CREATE.FCA.F",
		`{"stream_name":"FCA","config":{"durable_name":"F","deliver_subject":"dlv.fca","ack_policy":"flow_control","max_ack_pending":4}}`), false); e != nil {
		t.Fatalf("create: %v", e)
	}
	tw.cons = append(tw.cons, [2]string{"FCA", "F"})

	// expect reads each side's next n deliveries and requests, heartbeats aside, and
	// compares them; it returns each side's last flow-control reply.
	expect := func(step string, n int) [2]string {
		t.Helper()
		var got [2][]string
		var fc [2]string
		for side, rc := range raw {
			for len(got[side]) < n {
				f := rc.next(t, sideName[side], 10*time.Second)
				if f.isHeartbeat() {
					continue
				}
				if f.isFlowControl() {
					fc[side] = f.reply
				}
				got[side] = append(got[side], f.String())
			}
		}
		if !slices.Equal(got[ours], got[theirs]) {
			t.Fatalf("%s: jetgres sent\n%s\njetstream sent\n%s", step, strings.Join(got[ours], "\n"), strings.Join(got[theirs], "\n"))
		}
		tw.compareAll(step)
		return fc
	}
	answer := func(fc [2]string, hdr string) {
		t.Helper()
		for side, rc := range raw {
			rc.publish(t, fc[side], hdr)
		}
	}
	lastHdr := func(dseq, sseq int) string {
		return fmt.Sprintf("NATS/1.0\r\nNats-Last-Consumer: %d\r\nNats-Last-Stream: %d\r\n\r\n", dseq, sseq)
	}

	fc := expect("deliveries up to max_ack_pending", 5)
	answer(fc, lastHdr(4, 4))
	fc = expect("the answer acks 4", 5)

	// An ack of 8 on its ack subject would move the floor past what the answer names.
	for _, rc := range raw {
		rc.publish(t, rc.acks["8"], "")
	}
	answer(fc, lastHdr(6, 6))
	fc = expect("the answer acks 6, the ack of 8 counts for nothing", 3)

	// An answer without headers opens the window and acks nothing; the heartbeat after it
	// asks again, for what is still pending.
	answer(fc, "")
	fc, hb := requestAfterHeartbeat(t, raw, clock)
	for side := range hb {
		if n := len(hb[side]); n < 2 || strings.Contains(hb[side][n-2], "Nats-Consumer-Stalled") {
			t.Fatalf("%s: the request did not follow an unstalled heartbeat: %v", sideName[side], hb[side])
		}
		hb[side] = hb[side][len(hb[side])-2:]
	}
	if !slices.Equal(hb[ours], hb[theirs]) {
		t.Fatalf("heartbeat and request: jetgres\n%s\njetstream\n%s", strings.Join(hb[ours], "\n"), strings.Join(hb[theirs], "\n"))
	}
	tw.compareAll("the answer without headers acks nothing")

	answer(fc, lastHdr(10, 10))
	tw.pub("fca.x", make([]byte, 16))
	expect("the answer acks 10, the next message goes out", 1)
}

// TestAckFlowControlWorkQueueTwin: on a work-queue stream, what an answer acks leaves the
// stream, as stream sourcing from a work queue consumes it; an answer that names only part
// of what was delivered removes only that part, and one past what was delivered (nats-server
// lets a flow-controlled consumer's acks run ahead) removes all that was and no more.
func TestAckFlowControlWorkQueueTwin(t *testing.T) {
	t.Parallel()
	tw, clock := newClockTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "FCW", Subjects: []string{"fcw.>"}, Retention: jetstream.WorkQueuePolicy})
	tw.pubN("fcw.x", 6, 16)
	var raw [2]*rawConn
	for side, js := range tw.js {
		raw[side] = dialRaw(t, js.Conn().ConnectedUrl(), "dlv.fcw")
	}
	if e := tw.sameAnswer("create", tw.request("$JS.API.CONSUMER.CREATE.FCW.W",
		`{"stream_name":"FCW","config":{"durable_name":"W","deliver_subject":"dlv.fcw","ack_policy":"flow_control","max_ack_pending":3}}`), false); e != nil {
		t.Fatalf("create: %v", e)
	}
	tw.cons = append(tw.cons, [2]string{"FCW", "W"})
	// takeUpTo reads each side's deliveries up to the request that max_ack_pending brings.
	takeUpTo := func() [2]string {
		t.Helper()
		var fc [2]string
		for side, rc := range raw {
			for fc[side] == "" {
				if f := rc.next(t, sideName[side], 10*time.Second); f.isFlowControl() {
					fc[side] = f.reply
				}
			}
		}
		return fc
	}
	fc := takeUpTo()
	tw.compareAll("three delivered")
	for side, rc := range raw {
		rc.publish(t, fc[side], "NATS/1.0\r\nNats-Last-Consumer: 2\r\nNats-Last-Stream: 2\r\n\r\n")
	}
	tw.settle("FCW", func(st jetstream.StreamState) bool { return st.Msgs == 4 })
	tw.compareAll("the answer acks 2")
	fc = takeUpTo()
	for side, rc := range raw {
		rc.publish(t, fc[side], "NATS/1.0\r\nNats-Last-Consumer: 6\r\nNats-Last-Stream: 6\r\n\r\n")
	}
	// Here JetStream reports the ack floor its store kept, 2, which refused the update past
	// what it delivered, while it acts on 5; jetgres reports 5. The stream agrees, and so
	// does everything once the last message is delivered and acked.
	tw.settle("FCW", func(st jetstream.StreamState) bool { return st.Msgs == 1 })
	for side, rc := range raw {
		if f := rc.next(t, sideName[side], 10*time.Second); !strings.Contains(f.reply, ".6.6.") {
			t.Fatalf("%s: after the answer: %s", sideName[side], f)
		}
	}
	fc, _ = requestAfterHeartbeat(t, raw, clock)
	for side, rc := range raw {
		rc.publish(t, fc[side], "NATS/1.0\r\nNats-Last-Consumer: 6\r\nNats-Last-Stream: 6\r\n\r\n")
	}
	tw.settle("FCW", func(st jetstream.StreamState) bool { return st.Msgs == 0 })
	tw.compareAll("the answer acks 6")
}

// requestAfterHeartbeat reads each side's heartbeats up to the flow-control request one of
// them brings, advancing jetgres's clock a heartbeat at a time; it fails on a delivery. It
// returns the request's reply and what was read, the request last.
func requestAfterHeartbeat(t *testing.T, raw [2]*rawConn, clock *clocktest.Fake) (fc [2]string, seen [2][]string) {
	t.Helper()
	for side, rc := range raw {
		deadline := time.Now().Add(10 * time.Second)
		if side == ours {
			clock.Advance(time.Second)
		}
		for {
			f, ok := rc.poll(200 * time.Millisecond)
			if !ok {
				if time.Now().After(deadline) {
					t.Fatalf("%s: no flow-control request after a heartbeat; saw last %v", sideName[side], seen[side][max(len(seen[side])-3, 0):])
				}
				// Another heartbeat, in case the first came before the answer was taken.
				if side == ours {
					clock.Advance(time.Second)
				}
				continue
			}
			seen[side] = append(seen[side], f.String())
			if f.isFlowControl() {
				fc[side] = f.reply
				break
			}
			if !f.isHeartbeat() {
				t.Fatalf("%s: delivered %s", sideName[side], f)
			}
		}
	}
	return fc, seen
}

// rawConn is a subscription on a plain NATS protocol connection, which keeps each
// message's header block as the server wrote it.
type rawConn struct {
	c      net.Conn
	frames chan rawFrame
	// acks are the ack replies of the deliveries seen so far, by stream sequence.
	acks map[string]string
}

type rawFrame struct {
	subject, reply string
	hdr, data      []byte
}

func (f rawFrame) isHeartbeat() bool {
	return bytes.HasPrefix(f.hdr, []byte("NATS/1.0 100 Idle Heartbeat"))
}

func (f rawFrame) isFlowControl() bool {
	return bytes.HasPrefix(f.hdr, []byte("NATS/1.0 100 FlowControl Request"))
}

// String is the frame with what differs between servers by design left out: the random id
// of a flow-control reply, and an ack reply's timestamp.
func (f rawFrame) String() string {
	reply := f.reply
	if strings.HasPrefix(reply, "$JS.FC.") {
		reply = reply[:strings.LastIndexByte(reply, '.')] + ".<id>"
	} else if tok := strings.Split(reply, "."); len(tok) == 9 && tok[1] == "ACK" {
		tok[7] = "<ts>"
		reply = strings.Join(tok, ".")
	}
	hdr := string(f.hdr)
	if i := strings.Index(hdr, "Nats-Consumer-Stalled: $JS.FC."); i >= 0 {
		end := i + strings.Index(hdr[i:], "\r\n")
		hdr = hdr[:strings.LastIndexByte(hdr[:end], '.')] + ".<id>" + hdr[end:]
	}
	return fmt.Sprintf("%s reply=%s hdr=%q data=%q", f.subject, reply, hdr, f.data)
}

// dialRaw connects to url, subscribes to subject and returns once the server has the
// subscription.
func dialRaw(t *testing.T, rawURL, subject string) *rawConn {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	rc := &rawConn{c: c, frames: make(chan rawFrame, 1024), acks: map[string]string{}}
	r := bufio.NewReader(c)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "INFO ") {
		t.Fatalf("%s: %q, %v", rawURL, line, err)
	}
	if _, err := fmt.Fprintf(c, "CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,\"protocol\":1}\r\nSUB %s 1\r\nPING\r\n", subject); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	go rc.read(r, ready)
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no PONG", rawURL)
	}
	return rc
}

// read parses what the server sends until the connection closes; the first PONG closes
// ready.
func (rc *rawConn) read(r *bufio.Reader, ready chan struct{}) {
	defer close(rc.frames)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimRight(line, "\r\n")
		args := strings.Fields(line)
		if len(args) == 0 {
			continue
		}
		switch args[0] {
		case "PING":
			if _, err := io.WriteString(rc.c, "PONG\r\n"); err != nil {
				return
			}
			continue
		case "PONG":
			if ready != nil {
				close(ready)
				ready = nil
			}
			continue
		case "MSG", "HMSG":
		default:
			continue
		}
		f := rawFrame{subject: args[1]}
		sizes := args[3:]
		if len(sizes) == 3 || args[0] == "MSG" && len(sizes) == 2 {
			f.reply, sizes = sizes[0], sizes[1:]
		}
		hlen := 0
		if args[0] == "HMSG" {
			hlen, _ = strconv.Atoi(sizes[0])
			sizes = sizes[1:]
		}
		total, _ := strconv.Atoi(sizes[0])
		buf := make([]byte, total+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return
		}
		f.hdr, f.data = buf[:hlen], buf[hlen:total]
		rc.frames <- f
	}
}

// next returns the next frame, failing t when none comes within d.
func (rc *rawConn) next(t *testing.T, side string, d time.Duration) rawFrame {
	t.Helper()
	f, ok := rc.poll(d)
	if !ok {
		t.Fatalf("%s: nothing delivered within %s", side, d)
	}
	return f
}

// poll returns the next frame if one comes within d, and notes a delivery's ack reply.
func (rc *rawConn) poll(d time.Duration) (rawFrame, bool) {
	select {
	case f, ok := <-rc.frames:
		if ok {
			if tok := strings.Split(f.reply, "."); len(tok) == 9 && tok[1] == "ACK" {
				rc.acks[tok[5]] = f.reply
			}
		}
		return f, ok
	case <-time.After(d):
		return rawFrame{}, false
	}
}

// publish sends an empty message to subject with the header block hdr ("" for none), as
// a sourcing stream answers a flow-control request. What follows on the connection reaches
// the server after it.
func (rc *rawConn) publish(t *testing.T, subject, hdr string) {
	t.Helper()
	if subject == "" {
		t.Fatal("publish to no subject")
	}
	var err error
	if hdr == "" {
		_, err = fmt.Fprintf(rc.c, "PUB %s 0\r\n\r\n", subject)
	} else {
		_, err = fmt.Fprintf(rc.c, "HPUB %s %d %d\r\n%s\r\n", subject, len(hdr), len(hdr), hdr)
	}
	if err != nil {
		t.Fatal(err)
	}
}
