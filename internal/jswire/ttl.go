package jswire

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// checkMarkerTTL checks subject_delete_marker_ttl as nats-server checks a request that is
// not pedantic: markers need message TTLs and roll-ups, which it turns on (and purges
// back on) rather than refuse.
func checkMarkerTTL(cfg *server.StreamConfig) *server.ApiError {
	switch {
	case cfg.SubjectDeleteMarkerTTL < 0:
		return server.NewJSStreamInvalidConfigError(errors.New("subject delete marker TTL must not be negative"))
	case cfg.SubjectDeleteMarkerTTL == 0:
		return nil
	case cfg.SubjectDeleteMarkerTTL < time.Second:
		return server.NewJSStreamInvalidConfigError(errors.New("subject delete marker TTL must be at least 1 second"))
	}
	cfg.AllowMsgTTL = true
	if !cfg.AllowRollup {
		cfg.AllowRollup, cfg.DenyPurge = true, false
	}
	return nil
}

// CheckTTLUpdate refuses an update that turns message TTLs off, as nats-server does:
// messages stored with a TTL would then never expire.
func CheckTTLUpdate(old, cfg *server.StreamConfig) *server.ApiError {
	if old.AllowMsgTTL && !cfg.AllowMsgTTL {
		return server.NewJSStreamInvalidConfigError(errors.New("message TTL status can not be disabled"))
	}
	return nil
}

// DeleteMarkerHeader is the header of the subject delete marker nats-server stores in
// place of a subject's last message that max_age or its TTL removes: the reason, the
// marker's own TTL (as a Go duration, "1m0s") and a subject roll-up, in that order.
func DeleteMarkerHeader(ttl time.Duration) []byte {
	return fmt.Appendf(nil, "NATS/1.0\r\n%s: %s\r\n%s: %s\r\n%s: %s\r\n\r\n",
		server.JSMarkerReason, server.JSMarkerReasonMaxAge,
		server.JSMessageTTL, ttl,
		server.JSMsgRollup, server.JSMsgRollupSubject)
}

// IsDeleteMarker reports whether a stored message's header makes it a delete marker, as
// nats-server tells: a marker reason, or a key-value purge. Such a message leaves no marker
// behind when it expires.
func IsDeleteMarker(hdr []byte) bool {
	return HeaderValue(hdr, server.JSMarkerReason) != "" || HeaderValue(hdr, server.KVOperation) == string(server.KVOperationValuePurge)
}
