package stream

import (
	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/embedded/leaf"
)

// Transforms are a stream's subject_transform and republish, compiled with nats-server's
// own subject transforms once per configuration rather than once per message.
type Transforms struct {
	// in maps the subject a message was published to onto the subject it is stored
	// under; nil with no subject_transform.
	in server.SubjectTransformer
	// out maps a stored subject onto the subject its message is republished to; nil with
	// no republish.
	out         server.SubjectTransformer
	headersOnly bool
}

// CompileTransforms compiles what cfg asks for, nil when it asks for neither. The
// configuration was checked (package jswire), so a transform that does not compile is one
// nats-server would not make either: it is left out, as nats-server leaves out a transform
// or a republish with no destination (an empty source is ">" to both).
func CompileTransforms(cfg *server.StreamConfig) *Transforms {
	var x Transforms
	if st := cfg.SubjectTransform; st != nil {
		if tr, err := server.NewSubjectTransform(st.Source, st.Destination); err == nil && tr != nil {
			x.in = tr
		}
	}
	if rp := cfg.RePublish; rp != nil {
		if tr, err := server.NewSubjectTransform(rp.Source, rp.Destination); err == nil && tr != nil {
			x.out, x.headersOnly = tr, rp.HeadersOnly
		}
	}
	if x.in == nil && x.out == nil {
		return nil
	}
	return &x
}

// Republishes reports whether the stream republishes what it stores.
func (x *Transforms) Republishes() bool { return x != nil && x.out != nil }

// RepublishTo is the subject a message stored under subject is republished to, and false
// when the republish source does not match it.
func (x *Transforms) RepublishTo(subject string) (string, bool) {
	if x == nil || x.out == nil {
		return "", false
	}
	dest, err := x.out.Match(subject)
	return dest, err == nil && dest != ""
}

// HeadersOnly reports whether the republished messages carry no payload.
func (x *Transforms) HeadersOnly() bool { return x != nil && x.headersOnly }

// Transforms is what the stream's configuration compiles to, nil when it has neither
// subject_transform nor republish.
func (s *Stream) Transforms() *Transforms { return s.xf.Load() }

// StoredSubject is the subject a message published to subject is stored under: the one
// the stream's subject_transform maps it to, or subject itself.
func (s *Stream) StoredSubject(subject string) string {
	if x := s.xf.Load(); x != nil && x.in != nil {
		if subj, err := x.in.Match(subject); err == nil {
			return subj
		}
	}
	return subject
}

// stored is m as the stream stores it: under StoredSubject. m itself is left alone: the
// link may lend it.
func (s *Stream) stored(m *leaf.Msg) *leaf.Msg {
	subj := s.StoredSubject(m.Subject)
	if subj == m.Subject {
		return m
	}
	out := *m
	out.Subject = subj
	return &out
}
