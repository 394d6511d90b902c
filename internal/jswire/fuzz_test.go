package jswire

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Fuzz targets for what clients send the JSON API: each decodes a body the way its handler
// does and checks what the validation lets through. FuzzAckSubject (ack_test.go)
// covers ack subjects, embedded/leaf's FuzzParser the link's protocol.

// FuzzStreamConfig feeds STREAM.CREATE bodies to DecodeRequest and CheckStreamConfig. An
// accepted configuration must be complete, within the limits the checks promise, storable
// as JSON, and a fixed point: checking it again, as an update with the same body does,
// changes nothing.
func FuzzStreamConfig(f *testing.F) {
	for _, seed := range []string{
		`{"name":"S","subjects":["s.>"]}`,
		`{"name":"S"}`,
		`{}`,
		`{"name":"ORDERS","subjects":["orders.*","returns.>"],"retention":"workqueue","max_consumers":-1,"max_msgs":-1,"max_bytes":-1,"max_age":0,"max_msgs_per_subject":-1,"max_msg_size":-1,"discard":"new","storage":"file","num_replicas":1,"duplicate_window":120000000000,"allow_rollup_hdrs":true,"deny_delete":true}`,
		`{"name":"S","subjects":["a.>","a.b"]}`,
		`{"name":"S","max_age":100000000,"duplicate_window":200000000}`,
		`{"name":"S","subjects":["$JS.API.>"]}`,
		`{"name":"S","discard":"new","discard_new_per_subject":true,"max_msgs_per_subject":1}`,
		`{"name":"S","description":"\u0000"}`,
		`{"name":"a.b"}`,
		`{"name":"S","mirror":{"name":"M"}}`,
		`{"name":"S","mirror":{"name":"M","external":{"api":"$JS.hub.API"},"subject_transforms":[{"src":"a.>","dest":"b.>"}]}}`,
		`{"name":"S","sources":[{"name":"A","filter_subject":"a.>"},{"name":"B","opt_start_seq":5}]}`,
		`{"name":"S","max_msg_size":2000000}`,
		`{"name":"S","subjects":["s.>"],"republish":{"src":"s.>","dest":"r.>","headers_only":true}}`,
		`{"name":"S","subjects":["s.>"],"subject_transform":{"src":"s.>","dest":"t.>"},"republish":{"src":">","dest":">"}}`,
		`{"name":"S","subjects":["s.*.*"],"subject_transform":{"src":"s.*.*","dest":"t.{{wildcard(2)}}.{{partition(3,1)}}"}}`,
		`{"name":`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req server.StreamConfig
		if e := DecodeRequest(body, &req); e != nil {
			return
		}
		if req.Name == "" {
			req.Name = "S" // the subject's token, as the bridge's stream create fills it in
		}
		cfg, e := CheckStreamConfig(req, fuzzMaxPayload)
		if e != nil {
			return
		}
		switch {
		case !ValidName(cfg.Name) || len(cfg.Name) > server.JSMaxNameLen:
			t.Fatalf("accepted name %q", cfg.Name)
		case len(cfg.Subjects) == 0 && cfg.Mirror == nil && len(cfg.Sources) == 0 || len(cfg.Subjects) > MaxStreamSubjects:
			t.Fatalf("accepted %d subjects", len(cfg.Subjects))
		case cfg.Mirror != nil && (len(cfg.Subjects) > 0 || len(cfg.Sources) > 0):
			t.Fatalf("accepted a mirror with subjects or sources: %+v", cfg)
		case cfg.Storage != server.FileStorage && cfg.Storage != server.MemoryStorage:
			t.Fatalf("accepted storage %v", cfg.Storage)
		case cfg.Replicas < 1 || cfg.Replicas > server.StreamMaxReplicas:
			t.Fatalf("accepted %d replicas", cfg.Replicas)
		case cfg.MaxMsgs < -1 || cfg.MaxMsgs == 0 || cfg.MaxBytes < -1 || cfg.MaxBytes == 0 || cfg.MaxMsgsPer < -1 || cfg.MaxMsgsPer == 0 ||
			cfg.MaxMsgSize < -1 || cfg.MaxMsgSize == 0 || cfg.MaxConsumers < -1 || cfg.MaxConsumers == 0:
			t.Fatalf("accepted limits outside -1 or positive: %+v", cfg)
		case cfg.MaxMsgSize > fuzzMaxPayload:
			t.Fatalf("accepted max_msg_size %d above the max payload", cfg.MaxMsgSize)
		case cfg.MaxAge < 0 || cfg.Duplicates < 100*time.Millisecond && (cfg.Duplicates != 0 || cfg.Mirror == nil && len(cfg.Sources) == 0) ||
			cfg.MaxAge != 0 && cfg.Duplicates > cfg.MaxAge:
			t.Fatalf("accepted max_age %v with duplicate_window %v", cfg.MaxAge, cfg.Duplicates)
		}
		for i, s := range cfg.Subjects {
			if !server.IsValidSubject(s) {
				t.Fatalf("accepted subject %q", s)
			}
			for _, o := range cfg.Subjects[i+1:] {
				if server.SubjectsCollide(s, o) {
					t.Fatalf("accepted overlapping subjects %q and %q", s, o)
				}
			}
			for _, reserved := range []string{"$JS.>", "_INBOX.>", "$SYS.>"} {
				if server.SubjectsCollide(s, reserved) {
					t.Fatalf("accepted subject %q, which overlaps %s", s, reserved)
				}
			}
		}
		raw, err := json.Marshal(cfg)
		if err != nil {
			t.Fatalf("accepted a configuration that does not encode: %v", err)
		}
		var stored server.StreamConfig
		if err := json.Unmarshal(raw, &stored); err != nil {
			t.Fatalf("stored configuration %s does not decode: %v", raw, err)
		}
		again, e := CheckStreamConfig(stored, fuzzMaxPayload)
		if e != nil || !SameStreamConfig(again, cfg) {
			t.Fatalf("checking the accepted configuration again: %+v, %v\nfirst %+v", again, e, cfg)
		}
	})
}

// FuzzConsumerConfig feeds CONSUMER.CREATE bodies to DecodeRequest and CheckConsumerConfig,
// against a limits stream and a work queue stream with consumer limits. What is accepted
// must be a pull or push consumer the state machine can run, with the options of its kind
// only, storable, and a fixed point.
func FuzzConsumerConfig(f *testing.F) {
	for _, seed := range []string{
		`{"stream_name":"S","config":{"durable_name":"C","ack_policy":"explicit"}}`,
		`{"stream_name":"S","config":{}}`,
		`{"stream_name":"S","config":{"name":"C","deliver_policy":"by_start_sequence","opt_start_seq":18446744073709551615}}`,
		`{"stream_name":"S","config":{"durable_name":"C","ack_policy":"all","backoff":[1000000000,5000000000],"max_deliver":3}}`,
		`{"stream_name":"S","config":{"filter_subjects":["s.a","s.*"]}}`,
		`{"stream_name":"S","config":{"deliver_policy":"last_per_subject","filter_subject":"s.>"}}`,
		`{"stream_name":"S","config":{"deliver_policy":"by_start_time","opt_start_time":"2024-01-01T00:00:00Z"}}`,
		`{"stream_name":"S","config":{"deliver_subject":"push"}}`,
		`{"stream_name":"S","config":{"deliver_subject":"push.d","deliver_group":"g","ack_policy":"explicit","flow_control":true,"idle_heartbeat":5000000000,"rate_limit_bps":1024,"headers_only":true}}`,
		`{"stream_name":"S","config":{"deliver_subject":"_INBOX.o","ack_policy":"none","max_deliver":1,"flow_control":true,"idle_heartbeat":5000000000,"mem_storage":true,"num_replicas":1,"inactive_threshold":300000000000,"deliver_policy":"by_start_sequence","opt_start_seq":3}}`,
		`{"stream_name":"S","config":{"deliver_subject":"s.x"}}`,
		`{"stream_name":"S","config":{"deliver_subject":"$JS.FC.a"}}`,
		`{"stream_name":"S","config":{"deliver_subject":"push","max_waiting":1}}`,
		`{"stream_name":"S","config":{"deliver_subject":"push","ack_policy":"flow_control","max_ack_pending":10}}`,
		`{"stream_name":"S","config":{"flow_control":true,"idle_heartbeat":1000000000}}`,
		`{"stream_name":"S","config":{"deliver_group":"g","rate_limit_bps":1}}`,
		`{"stream_name":"S","config":{"max_ack_pending":-5,"max_waiting":-1,"ack_wait":-1}}`,
		`{"stream_name":"S","config":{"metadata":{"_nats.req.level":"1","k":"\u0000"}}}`,
		`{"stream_name":"S","action":"update","config":{"durable_name":"C","max_expires":1}}`,
	} {
		f.Add([]byte(seed), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, workQueue bool) {
		var req server.CreateConsumerRequest
		if e := DecodeRequest(body, &req); e != nil {
			return
		}
		scfg := server.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 1}
		if workQueue {
			scfg.Retention = server.WorkQueuePolicy
			scfg.ConsumerLimits = server.StreamConsumerLimits{MaxAckPending: 100, InactiveThreshold: time.Hour}
		}
		cfg, e := CheckConsumerConfig(req.Config, &scfg)
		if e != nil {
			return
		}
		push := cfg.DeliverSubject != ""
		switch {
		case push && (!server.IsValidPublishSubject(cfg.DeliverSubject) || server.SubjectsCollide(cfg.DeliverSubject, "s.>") ||
			strings.HasPrefix(cfg.DeliverSubject, "$JS.API.") || strings.HasPrefix(cfg.DeliverSubject, "$JS.ACK.") || strings.HasPrefix(cfg.DeliverSubject, "$JS.FC.")):
			t.Fatalf("accepted deliver subject %q", cfg.DeliverSubject)
		case push && (cfg.MaxWaiting != 0 || cfg.Heartbeat != 0 && cfg.Heartbeat < 100*time.Millisecond ||
			cfg.AckPolicy == server.AckNone && cfg.MaxAckPending > 0):
			t.Fatalf("accepted a push consumer with %+v", cfg)
		case !push && (cfg.MaxWaiting < 1 || cfg.Heartbeat != 0 || cfg.FlowControl || cfg.RateLimit != 0):
			t.Fatalf("accepted a pull consumer with push options: %+v", cfg)
		case cfg.FlowControl && cfg.Heartbeat == 0:
			t.Fatalf("accepted flow control without heartbeats: %+v", cfg)
		case cfg.AckPolicy < server.AckNone || cfg.AckPolicy > server.AckFlowControl:
			t.Fatalf("accepted ack policy %v", cfg.AckPolicy)
		case cfg.AckPolicy == server.AckFlowControl && (!push || !cfg.FlowControl || cfg.Heartbeat != time.Second ||
			cfg.MaxAckPending <= 0 || cfg.AckWait != 0 || len(cfg.BackOff) > 0 || cfg.MaxDeliver != -1):
			t.Fatalf("accepted the flow_control ack policy with %+v", cfg)
		case cfg.MaxDeliver != -1 && cfg.MaxDeliver < 1:
			t.Fatalf("accepted max_deliver %d", cfg.MaxDeliver)
		case cfg.MaxWaiting < 0 || cfg.Heartbeat < 0 || cfg.AckWait < 0 || cfg.MaxAckPending < -1 || cfg.InactiveThreshold < 0:
			t.Fatalf("accepted limits %+v", cfg)
		case cfg.AckPolicy != server.AckNone && cfg.AckPolicy != server.AckFlowControl && cfg.AckWait == 0 && (len(cfg.BackOff) == 0 || cfg.BackOff[0] != 0):
			// nats-server takes the ack wait from the first backoff, a zero one included.
			t.Fatalf("accepted an acked consumer without an ack wait: %+v", cfg)
		case cfg.MaxRequestBatch < 0 || cfg.MaxRequestMaxBytes < 0 || cfg.MaxRequestExpires < 0:
			t.Fatalf("accepted request limits %+v", cfg)
		case workQueue && (cfg.AckPolicy != server.AckExplicit && cfg.AckPolicy != server.AckFlowControl || cfg.MaxAckPending > 100 || cfg.InactiveThreshold > time.Hour):
			t.Fatalf("accepted %+v on a work queue with consumer limits", cfg)
		case cfg.Name != "" && !ValidName(cfg.Name), cfg.Durable != "" && !ValidName(cfg.Durable):
			t.Fatalf("accepted names %q, %q", cfg.Name, cfg.Durable)
		}
		for _, d := range cfg.BackOff {
			if d < 0 {
				t.Fatalf("accepted backoff %v", cfg.BackOff)
			}
		}
		for _, fs := range ConsumerFilters(&cfg) {
			if !server.IsValidSubject(fs) {
				t.Fatalf("accepted filter %q", fs)
			}
		}
		raw, err := json.Marshal(cfg)
		if err != nil {
			t.Fatalf("accepted a configuration that does not encode: %v", err)
		}
		var stored server.ConsumerConfig
		if err := json.Unmarshal(raw, &stored); err != nil {
			t.Fatalf("stored configuration %s does not decode: %v", raw, err)
		}
		again, e := CheckConsumerConfig(stored, &scfg)
		if e != nil || !SameConsumerConfig(again, cfg) {
			t.Fatalf("checking the accepted configuration again: %+v, %v\nfirst %+v", again, e, cfg)
		}
		if err := CheckConsumerUpdate(&cfg, &again, func(string) bool { return true }); err != nil {
			t.Fatalf("the accepted configuration is not an update of itself: %v", err)
		}
	})
}

// FuzzPullRequest feeds MSG.NEXT bodies to DecodePullRequest and the consumer limits. An
// accepted request must ask for at least one message, with no negative byte budget and a
// heartbeat that fits its expiry.
func FuzzPullRequest(f *testing.F) {
	for _, seed := range []string{
		``, `10`, `-3`, `nonsense`,
		`{"batch":500,"expires":30000000000,"idle_heartbeat":15000000000}`,
		`{"batch":1,"no_wait":true}`,
		`{"batch":-1,"max_bytes":-1,"expires":-1}`,
		`{"batch":9223372036854775807,"expires":9223372036854775807,"idle_heartbeat":9223372036854775807}`,
		`{"batch":1,"idle_heartbeat":1}`,
		`{"batch":1,"priority":3,"id":"x"}`,
		`{"batch":`,
	} {
		f.Add([]byte(seed), 0, int64(0), 0)
	}
	f.Add([]byte(`{"batch":100,"expires":120000000000,"max_bytes":2048}`), 10, int64(time.Minute), 1024)
	now := time.Unix(1_700_000_000, 0)
	f.Fuzz(func(t *testing.T, body []byte, maxBatch int, maxExpires int64, maxBytes int) {
		pr, bad := DecodePullRequest(body, now)
		if bad == nil {
			cfg := server.ConsumerConfig{MaxRequestBatch: maxBatch, MaxRequestExpires: time.Duration(maxExpires), MaxRequestMaxBytes: maxBytes}
			bad = CheckPullLimits(&cfg, &pr, now)
		}
		if bad != nil {
			if bad.Code != 400 && bad.Code != 409 {
				t.Fatalf("%q: status %v", body, bad)
			}
			return
		}
		switch {
		case pr.Batch < 1 || pr.MaxBytes < 0:
			t.Fatalf("%q: accepted batch %d, max_bytes %d", body, pr.Batch, pr.MaxBytes)
		case pr.Heartbeat < 0 || pr.Heartbeat > 0 && (pr.Heartbeat < minPullHeartbeat || pr.Expires.IsZero() || pr.Expires.Sub(now) < 2*pr.Heartbeat-1):
			t.Fatalf("%q: accepted heartbeat %v with expiry %v", body, pr.Heartbeat, pr.Expires.Sub(now))
		case maxBatch > 0 && pr.Batch > maxBatch:
			t.Fatalf("%q: batch %d above the consumer's %d", body, pr.Batch, maxBatch)
		}
	})
}

// fuzzMaxPayload stands in for the server's max payload: nats-server's default.
const fuzzMaxPayload = server.MAX_PAYLOAD_SIZE
