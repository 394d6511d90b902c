package jswire

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// checkTransforms checks a stream's subject_transform and republish as nats-server's
// checkStreamCfg does, in its order and with its errors, once the subjects are known good.
// An empty republish source becomes ">", and a republish of ">" to ">" beside a transform of
// the stream's only subject republishes what the transform stores, as there. cfg.RePublish
// is copied before it changes: the request's is not touched.
func checkTransforms(cfg *server.StreamConfig) *server.ApiError {
	if tr := cfg.SubjectTransform; tr != nil {
		if tr.Source != "" && !server.IsValidSubject(tr.Source) {
			return server.NewJSStreamTransformInvalidSourceError(fmt.Errorf("%w %s", server.ErrBadSubject, tr.Source))
		}
		if err := server.ValidateMapping(tr.Source, tr.Destination); err != nil {
			return server.NewJSStreamTransformInvalidDestinationError(err)
		}
	}
	if cfg.RePublish == nil {
		return nil
	}
	rp := *cfg.RePublish
	cfg.RePublish = &rp
	if rp.Source == "" {
		rp.Source = ">"
	}
	if rp.Destination == ">" && rp.Source == ">" && cfg.SubjectTransform != nil &&
		len(cfg.Subjects) == 1 && cfg.SubjectTransform.Source == cfg.Subjects[0] {
		rp.Source, rp.Destination = cfg.SubjectTransform.Destination, cfg.SubjectTransform.Destination
	}
	for _, subj := range cfg.Subjects {
		if server.SubjectsCollide(rp.Destination, subj) {
			return server.NewJSStreamInvalidConfigError(errors.New("stream configuration for republish destination forms a cycle"))
		}
	}
	if _, err := server.NewSubjectTransform(rp.Source, rp.Destination); err != nil {
		return server.NewJSStreamInvalidConfigError(fmt.Errorf("stream configuration for republish with transform from '%s' to '%s' not valid", rp.Source, rp.Destination))
	}
	return nil
}

// ReservedDestination reports whether nats-server refuses to republish to subj: a subject
// that is not a valid literal one, a service or gateway reply, or a JetStream subject with
// a side effect (an API request, an ack, flow control, a snapshot, an advisory).
func ReservedDestination(subj string) bool {
	if !server.IsValidPublishSubject(subj) {
		return true
	}
	for _, pfx := range []string{"_R_.", "_GR_.", "$GR."} {
		if len(subj) > len(pfx) && strings.HasPrefix(subj, pfx) {
			return true
		}
	}
	rest, ok := strings.CutPrefix(subj, "$JS.")
	if !ok {
		return false
	}
	tok, rest, _ := strings.Cut(rest, ".")
	switch tok {
	case "API", "ACK", "FC", "SNAPSHOT", "EVENT":
		return true
	}
	// An API request of a domain: $JS.<domain>.API.
	tok, _, _ = strings.Cut(rest, ".")
	return tok == "API"
}
