package bridge

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/internal/jsarchive"
	"github.com/jetgres/jetgres/internal/testwait"
)

// restoreUpload restores archive as stream name the way the nats CLI does: the restore
// request, one request per chunk, each waiting for its ack, and an empty request whose
// answer is the stream create response, which it returns.
func restoreUpload(t *testing.T, nc *nats.Conn, name string, archive []byte) (deliver string, final server.JSApiStreamCreateResponse, err error) {
	t.Helper()
	req, _ := json.Marshal(server.JSApiStreamRestoreRequest{Config: server.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: server.FileStorage}})
	m, err := nc.Request("$JS.API.STREAM.RESTORE."+name, req, 5*time.Second)
	if err != nil {
		return "", final, err
	}
	var resp server.JSApiStreamRestoreResponse
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return "", final, err
	}
	if resp.Error != nil {
		return "", final, resp.Error
	}
	for len(archive) > 0 {
		n := min(len(archive), 1024)
		r, err := nc.Request(resp.DeliverSubject, archive[:n], 5*time.Second)
		if err != nil {
			return resp.DeliverSubject, final, err
		}
		if len(r.Data) > 0 {
			// An error answers a chunk when the restore failed under way.
			err := json.Unmarshal(r.Data, &final)
			return resp.DeliverSubject, final, err
		}
		archive = archive[n:]
	}
	r, err := nc.Request(resp.DeliverSubject, nil, 30*time.Second)
	if err != nil {
		return resp.DeliverSubject, final, err
	}
	return resp.DeliverSubject, final, json.Unmarshal(r.Data, &final)
}

// archiveOf is a whole archive of msgs messages.
func archiveOf(t *testing.T, state server.StreamState, msgs int) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := jsarchive.NewWriter(&buf)
	if err := w.State(state, 1); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= msgs; i++ {
		if err := w.Msg(&jsarchive.ArchivedMsg{Seq: uint64(i), TS: int64(i), Subject: "R.a", Data: fmt.Appendf(nil, "m%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// cutArchive is an archive of msgs messages whose end marker is missing.
func cutArchive(t *testing.T, state server.StreamState, msgs int) []byte {
	t.Helper()
	plain, err := s2ReadAll(archiveOf(t, state, msgs))
	if err != nil {
		t.Fatal(err)
	}
	return s2Of(plain[:len(plain)-5])
}

// TestRestoreFailuresLeaveNothing restores archives that cannot be restored: another
// format, and one cut before its end marker. Each is answered with a restore error that
// says why, and the stream the restore created is gone again; a name that is taken is
// refused before any upload.
func TestRestoreFailuresLeaveNothing(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	state := server.StreamState{Msgs: 300, FirstSeq: 1, LastSeq: 300}

	for _, c := range []struct {
		name, want string
		archive    []byte
	}{
		{"OLD", "not the tar archives of older servers", s2Of([]byte("a tar archive, say"))},
		{"CUT", "truncated", cutArchive(t, state, 300)},
	} {
		_, final, err := restoreUpload(t, tb.nc, c.name, c.archive)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if final.Error == nil || final.Error.ErrCode != uint16(server.JSStreamRestoreErrF) || !strings.Contains(final.Error.Description, c.want) {
			t.Fatalf("%s: final response %+v, want a restore error about %q", c.name, final.Error, c.want)
		}
		if _, err := tb.js.Stream(ctx, c.name); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatalf("%s: after the failed restore the stream lookup says %v, want not found", c.name, err)
		}
	}

	_, final, err := restoreUpload(t, tb.nc, "GOOD", archiveOf(t, state, 300))
	if err != nil || final.Error != nil || final.StreamInfo == nil || final.StreamInfo.State.Msgs != 300 {
		t.Fatalf("restore: %v, %+v", err, final.Error)
	}
	if _, _, err := restoreUpload(t, tb.nc, "GOOD", archiveOf(t, state, 300)); !isAPIError(err, server.JSStreamNameExistRestoreFailedErr) {
		t.Fatalf("a restore into a taken name: %v, want err_code %d", err, server.JSStreamNameExistRestoreFailedErr)
	}
}

func isAPIError(err error, code server.ErrorIdentifier) bool {
	var e *server.ApiError
	return errors.As(err, &e) && e.ErrCode == uint16(code)
}

// TestSnapshotNoFlowResponse: a receiver that takes the chunks and never acks them gets a
// window's worth, then, AckTimeout later on the bridge's clock, the 408 status that ends
// the snapshot.
func TestSnapshotNoFlowResponse(t *testing.T) {
	t.Parallel()
	fake := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = fake }})
	ctx := testContext(t)
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "F", Subjects: []string{"f.>"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		// Payloads that s2 cannot shrink much, so the archive spans many 1 KiB chunks.
		if _, err := tb.js.Publish(ctx, "f.x", fmt.Appendf(nil, "%x", time.Now().UnixNano()*int64(i+7919))); err != nil {
			t.Fatal(err)
		}
	}
	inbox := nats.NewInbox()
	sub, err := tb.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	req, _ := json.Marshal(server.JSApiStreamSnapshotRequest{DeliverSubject: inbox, ChunkSize: 1024, WindowSize: 2048})
	m, err := tb.nc.Request("$JS.API.STREAM.SNAPSHOT.F", req, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var resp server.JSApiStreamSnapshotResponse
	if err := json.Unmarshal(m.Data, &resp); err != nil || resp.Error != nil || resp.State.Msgs != 200 {
		t.Fatalf("snapshot response %s, %v", m.Data, err)
	}
	// The window holds two chunks; nothing more comes until one is acked.
	for i := range 2 {
		var c *nats.Msg
		testwait.For(t, 10*time.Second, func() error {
			if i == 0 {
				fake.Advance(10 * time.Millisecond) // the sender may be polling for our interest
			}
			c, err = sub.NextMsg(10 * time.Millisecond)
			return err
		})
		if len(c.Data) != 1024 || c.Reply == "" {
			t.Fatalf("chunk %d: %d bytes, reply %q", i, len(c.Data), c.Reply)
		}
	}
	if c, err := sub.NextMsg(50 * time.Millisecond); err == nil {
		t.Fatalf("a chunk past the window: %d bytes", len(c.Data))
	}
	// Each step passes the whole ack timeout, armed or about to be.
	var end *nats.Msg
	testwait.For(t, 10*time.Second, func() error {
		fake.Advance(5 * time.Second)
		end, err = sub.NextMsg(50 * time.Millisecond)
		return err
	})
	if len(end.Data) != 0 || end.Header.Get("Status") != "408" || end.Header.Get("Description") != "No Flow Response" {
		t.Fatalf("end of the snapshot: %q %v", end.Data, end.Header)
	}
}

func s2Of(b []byte) []byte {
	var buf bytes.Buffer
	w := s2.NewWriter(&buf)
	_, _ = w.Write(b)
	_ = w.Close()
	return buf.Bytes()
}

func s2ReadAll(b []byte) ([]byte, error) {
	var out bytes.Buffer
	_, err := out.ReadFrom(s2.NewReader(bytes.NewReader(b)))
	return out.Bytes(), err
}
