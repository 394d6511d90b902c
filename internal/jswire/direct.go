package jswire

import (
	"encoding/json"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// DirectRequest decodes a direct get, with the subject tokens after the stream name, and
// returns nats-server's 408 description when it is refused.
func DirectRequest(key []string, body []byte) (server.JSApiMsgGetRequest, string) {
	var req server.JSApiMsgGetRequest
	if len(key) > 0 {
		if len(body) > 0 && json.Unmarshal(body, &req) != nil {
			return req, "Malformed Request"
		}
		if req.LastFor != "" || req.NextFor != "" || len(req.MultiLastFor) > 0 || req.Seq != 0 || req.Batch != 0 ||
			req.StartTime != nil || req.UpToSeq != 0 || req.UpToTime != nil {
			return req, "Bad Request"
		}
		req.LastFor = strings.Join(key, ".")
		return req, ""
	}
	if len(body) == 0 {
		return req, "Empty Request"
	}
	if json.Unmarshal(body, &req) != nil {
		return req, "Malformed Request"
	}
	if req.Seq == 0 && req.LastFor == "" && req.NextFor == "" && len(req.MultiLastFor) == 0 && req.StartTime == nil {
		return req, "Empty Request"
	}
	if (req.Seq > 0 && req.LastFor != "") || (req.Seq > 0 && req.StartTime != nil) ||
		(req.StartTime != nil && req.LastFor != "") || (req.LastFor != "" && req.NextFor != "") ||
		(req.LastFor != "" && req.Batch > 0) || (req.LastFor != "" && len(req.MultiLastFor) > 0) ||
		(req.NextFor != "" && len(req.MultiLastFor) > 0) || (req.UpToSeq > 0 && req.UpToTime != nil) {
		return req, "Bad Request"
	}
	return req, ""
}
