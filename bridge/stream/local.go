package stream

import (
	"slices"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/embedded/leaf"
)

// PublishLocal takes a message this process published on the link, with no reply, as a
// publish to the stream whose subjects cover subject, if one does: the server never hands
// a leafnode's own message back to it, so a stream of this process would not hear it
// otherwise. It never blocks, as the read loop's publishes do not; hdr and data are kept.
// It reports whether a stream took it in.
func (r *Registry) PublishLocal(subject string, hdr, data []byte) bool {
	for _, s := range r.List() {
		if slices.ContainsFunc(s.ConfigView().Subjects, func(f string) bool { return server.SubjectMatchesFilter(subject, f) }) {
			r.onPublish(s, &leaf.Msg{Subject: subject, Header: hdr, Data: data})
			return true
		}
	}
	return false
}
