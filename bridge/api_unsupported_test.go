package bridge

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/jetgres/jetgres/bridge/jsapi"
)

// TestEveryJetStreamRequestIsServedOrRefused sends every API request nats-server knows
// (its subject constants) and checks that none gets the generic "bad request" (10003): each
// is either served or refused as unsupported (10036), naming the request, with the response
// type nats-server uses, and counted. Snapshots and restores, which nats-server too answers
// with 10003 when the request is empty, get a request that is not.
func TestEveryJetStreamRequestIsServedOrRefused(t *testing.T) {
	tb := setup(t)
	unsupported := map[string]bool{}
	for _, name := range jsapi.Unsupported() {
		unsupported[name] = true
	}
	for _, subject := range []string{
		server.JSApiAccountInfo,
		server.JSApiStreamCreate, server.JSApiStreamUpdate, server.JSApiStreams, server.JSApiStreamList,
		server.JSApiStreamInfo, server.JSApiStreamDelete, server.JSApiStreamPurge,
		server.JSApiStreamSnapshot, server.JSApiStreamRestore, server.JSApiMsgDelete, server.JSApiMsgGet,
		server.JSApiConsumerCreate, server.JSApiConsumerCreateEx, server.JSApiDurableCreate,
		server.JSApiConsumers, server.JSApiConsumerList, server.JSApiConsumerInfo,
		server.JSApiConsumerDelete, server.JSApiConsumerPause, server.JSApiConsumerUnpin,
		strings.ReplaceAll(server.JSApiConsumerResetT, "%s", "*"),
		server.JSApiStreamRemovePeer, server.JSApiStreamEvacuatePeer, server.JSApiStreamCancelMove,
		server.JSApiStreamLeaderStepDown, server.JSApiConsumerLeaderStepDown,
		server.JSApiConsumerRemovePeer, server.JSApiConsumerEvacuatePeer,
		server.JSApiLeaderStepDown, server.JSApiRemoveServer, server.JSApiEvacuateServer, server.JSApiMetaRescue,
		server.JSApiAccountPurge, server.JSApiServerStreamMove, server.JSApiServerStreamCancelMove,
	} {
		subject = strings.ReplaceAll(strings.ReplaceAll(subject, "*", "X"), ">", "X")
		body := map[string]string{
			"$JS.API.STREAM.SNAPSHOT.X": `{"deliver_subject":"x"}`,
			"$JS.API.STREAM.RESTORE.X":  `{"config":{"name":"other"}}`,
		}[subject]
		if body == "" {
			body = "{}"
		}
		msg, err := tb.nc.Request(subject, []byte(body), 10*time.Second)
		if errors.Is(err, nats.ErrNoResponders) && subject == "$JS.API.CONSUMER.RESET.X.X" {
			// Served: a reset of a consumer that does not exist hears no responders.
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", subject, err)
			continue
		}
		var resp server.ApiResponse
		if err := json.Unmarshal(msg.Data, &resp); err != nil {
			t.Errorf("%s: %v in %q", subject, err, msg.Data)
			continue
		}
		name := strings.TrimPrefix(subject, "$JS.API.")
		for strings.HasSuffix(name, ".X") {
			name = strings.TrimSuffix(name, ".X")
		}
		if !unsupported[name] {
			if resp.Error != nil && resp.Error.ErrCode == uint16(server.JSBadRequestErr) {
				t.Errorf("%s: served, but answered %+v", subject, resp.Error)
			}
			continue
		}
		want := name + " is not supported by jetgres"
		if resp.Error == nil || resp.Error.Code != 503 || resp.Error.ErrCode != uint16(server.JSClusterUnSupportFeatureErr) || resp.Error.Description != want {
			t.Errorf("%s: answered %+v, want 503, err_code 10036, %q", subject, resp.Error, want)
		}
		if got := labelCount(t, tb.reg, "jetgres_api_unsupported_total", "request", name); got != 1 {
			t.Errorf("%s: counted %v times, want 1", name, got)
		}
		delete(unsupported, name)
	}
	for name := range unsupported {
		t.Errorf("%s is listed as unsupported but is no request nats-server knows", name)
	}
}
