package jsapi

import (
	"errors"

	"github.com/nats-io/nats-server/v2/server"
)

// checkCopies applies nats-server's checks of a mirror and sources that need the other
// streams of the account: a mirror inherits its origin's direct gets, a copy may not take
// messages larger than the copying stream takes, and no stream may end up copying from
// itself through a chain of sources and mirrors. An origin not found here may be created
// later, as in JetStream. The admin lock is held.
func (a *API) checkCopies(cfg *server.StreamConfig) *server.ApiError {
	if cfg.Mirror == nil && len(cfg.Sources) == 0 {
		return nil
	}
	if a.cfg.Copies == nil {
		return server.NewJSStreamInvalidConfigError(errors.New("mirrors and sources are not served by this bridge"))
	}
	origin := func(name string) (*server.StreamConfig, bool) {
		s := a.streams.Lookup(name)
		if s == nil {
			return nil, false
		}
		return s.ConfigView(), true
	}
	if m := cfg.Mirror; m != nil && m.External == nil {
		if o, ok := origin(m.Name); ok {
			if cfg.MaxMsgSize > 0 && o.MaxMsgSize > 0 && cfg.MaxMsgSize < o.MaxMsgSize {
				return server.NewJSMirrorMaxMessageSizeTooBigError()
			}
			cfg.MirrorDirect = o.AllowDirect
		}
	}
	for _, src := range cfg.Sources {
		if src.External != nil {
			continue
		}
		if o, ok := origin(src.Name); ok && cfg.MaxMsgSize > 0 && o.MaxMsgSize > 0 && cfg.MaxMsgSize < o.MaxMsgSize {
			return server.NewJSSourceMaxMessageSizeTooBigError()
		}
	}
	if formsCycle(cfg, origin) {
		return server.NewJSStreamInvalidConfigError(errors.New("detected cycle"))
	}
	return nil
}

// formsCycle follows the sources and mirrors of cfg through the streams it finds, as
// nats-server's check does: a source seen again whose filter overlaps the subjects of the
// stream that sources it, or a mirror seen again, is a cycle.
func formsCycle(cfg *server.StreamConfig, origin func(string) (*server.StreamConfig, bool)) bool {
	overlaps := func(subjects []string, filter string) bool {
		if filter == "" {
			return true
		}
		for _, subj := range subjects {
			if server.SubjectsCollide(subj, filter) {
				return true
			}
		}
		return false
	}
	toVisit := []*server.StreamConfig{cfg}
	visited := make(map[string]bool)
	for len(toVisit) > 0 {
		c := toVisit[0]
		toVisit = toVisit[1:]
		visited[c.Name] = true
		for _, src := range c.Sources {
			if src.External != nil {
				continue
			}
			if visited[src.Name] {
				if overlaps(c.Subjects, src.FilterSubject) {
					return true
				}
			} else if o, ok := origin(src.Name); ok {
				toVisit = append(toVisit, o)
			}
		}
		if m := c.Mirror; m != nil && m.External == nil {
			if visited[m.Name] {
				return true
			}
			if o, ok := origin(m.Name); ok {
				toVisit = append(toVisit, o)
			}
		}
	}
	return false
}

// copiesChanged wakes the copying engine for a stream with a mirror or sources.
func (a *API) copiesChanged(cfg *server.StreamConfig) {
	if a.cfg.Copies != nil && (cfg.Mirror != nil || len(cfg.Sources) > 0) {
		a.cfg.Copies.Kick()
	}
}
