package stream

import (
	"strconv"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/pg"
)

// setTTL gives m the TTL its Nats-TTL header asked for (checkHeaders refused one on a
// stream without allow_msg_ttl). On a stream with subject delete markers a TTL is at least
// the markers' own, header included, as nats-server raises it: a shorter one could expire a
// subject's message while a marker for it still stands, and one marker would hide the next.
// A stream that keeps one message per subject is exempt, as there.
func setTTL(cfg *server.StreamConfig, m *pg.AppendMsg, ttl int64) {
	if ttl == 0 || !cfg.AllowMsgTTL {
		return
	}
	if least := int64(cfg.SubjectDeleteMarkerTTL.Seconds()); ttl > 0 && least > ttl && cfg.MaxMsgsPer != 1 {
		ttl = least
		m.Header = appendHeader(removeHeader(m.Header, server.JSMessageTTL), server.JSMessageTTL, strconv.FormatInt(ttl, 10))
	}
	m.TTL = ttl
}
