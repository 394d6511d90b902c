package jswire

import (
	"cmp"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// checkCopies applies nats-server's checks of a stream's mirror and sources that need no
// other stream, in its order. Sourcing through a durable consumer of the origin
// (`consumer` in a mirror or source) is refused: jetgres creates the origin's consumer
// itself, as JetStream does without it.
func checkCopies(cfg *server.StreamConfig) *server.ApiError {
	var apiPrefixes, deliverPrefixes []string
	if m := cfg.Mirror; m != nil {
		switch {
		case cfg.FirstSeq > 0:
			return server.NewJSMirrorWithFirstSeqError()
		case len(cfg.Subjects) > 0:
			return server.NewJSMirrorWithSubjectsError()
		case len(cfg.Sources) > 0:
			return server.NewJSMirrorWithSourcesError()
		case cfg.AllowMsgCounter:
			return server.NewJSMirrorWithCountersError()
		case cfg.AllowAtomicPublish:
			return server.NewJSMirrorWithAtomicPublishError()
		case cfg.AllowBatchPublish:
			return server.NewJSMirrorWithBatchPublishError()
		case m.Consumer != nil:
			return server.NewJSStreamInvalidConfigError(errors.New("mirroring through a durable consumer is not supported by jetgres"))
		case m.FilterSubject != "" && len(m.SubjectTransforms) != 0:
			return server.NewJSMirrorMultipleFiltersNotAllowedError()
		case cfg.SubjectDeleteMarkerTTL > 0:
			return server.NewJSStreamInvalidConfigError(errors.New("subject delete markers forbidden on mirrors"))
		}
		for outer, tr := range m.SubjectTransforms {
			if tr.Source != "" && !server.IsValidSubject(tr.Source) {
				return server.NewJSMirrorInvalidSubjectFilterError(fmt.Errorf("%w %s", server.ErrBadSubject, tr.Source))
			}
			if err := server.ValidateMapping(tr.Source, tr.Destination); err != nil {
				return server.NewJSMirrorInvalidTransformDestinationError(err)
			}
			for inner, other := range m.SubjectTransforms {
				if inner != outer && server.SubjectsCollide(tr.Source, other.Source) {
					return server.NewJSMirrorOverlappingSubjectFiltersError()
				}
			}
		}
		if m.External == nil {
			if !ValidName(m.Name) {
				return server.NewJSMirrorInvalidStreamNameError()
			}
		} else {
			deliverPrefixes = appendNonEmpty(deliverPrefixes, m.External.DeliverPrefix)
			apiPrefixes = appendNonEmpty(apiPrefixes, m.External.ApiPrefix)
		}
	}
	seen := make(map[string]bool, len(cfg.Sources))
	for _, src := range cfg.Sources {
		if src == nil || !ValidName(src.Name) {
			return server.NewJSSourceInvalidStreamNameError()
		}
		if iname := SourceKey(src); seen[iname] {
			return server.NewJSSourceDuplicateDetectedError()
		} else {
			seen[iname] = true
		}
		if src.FilterSubject != "" && len(src.SubjectTransforms) != 0 {
			return server.NewJSSourceMultipleFiltersNotAllowedError()
		}
		for _, tr := range src.SubjectTransforms {
			if tr.Source != "" && !server.IsValidSubject(tr.Source) {
				return server.NewJSSourceInvalidSubjectFilterError(fmt.Errorf("%w %s", server.ErrBadSubject, tr.Source))
			}
			if err := server.ValidateMapping(tr.Source, tr.Destination); err != nil {
				return server.NewJSSourceInvalidTransformDestinationError(err)
			}
		}
		for outer, tr := range src.SubjectTransforms {
			for inner, other := range src.SubjectTransforms {
				if inner != outer && subsetMatch(tr.Source, other.Source) {
					return server.NewJSSourceOverlappingSubjectFiltersError()
				}
			}
		}
		if src.Consumer != nil {
			return server.NewJSStreamInvalidConfigError(errors.New("sourcing through a durable consumer is not supported by jetgres"))
		}
		if src.External != nil {
			deliverPrefixes = appendNonEmpty(deliverPrefixes, src.External.DeliverPrefix)
			apiPrefixes = appendNonEmpty(apiPrefixes, src.External.ApiPrefix)
		}
	}
	for _, pfx := range deliverPrefixes {
		if !server.IsValidPublishSubject(pfx) {
			return server.NewJSStreamInvalidExternalDeliverySubjError(pfx)
		}
	}
	for _, pfx := range apiPrefixes {
		if !server.IsValidPublishSubject(pfx) {
			return server.NewJSStreamInvalidConfigError(fmt.Errorf("stream external api prefix %q must be a valid subject without wildcards", pfx))
		}
		if server.SubjectsCollide(pfx, server.JSApiPrefix) {
			return server.NewJSStreamExternalApiOverlapError(pfx, server.JSApiPrefix)
		}
	}
	return nil
}

// subsetMatch reports whether every subject that subject matches, test matches too.
func subsetMatch(subject, test string) bool {
	return server.SubjectMatchesFilter(subject, test)
}

func appendNonEmpty(list []string, s string) []string {
	if s == "" {
		return list
	}
	return append(list, s)
}

// SourceKey is what tells two sources of one stream apart, as nats-server composes it
// (StreamSource.composeIName): the origin's name, with a hash of its API prefix when
// external, then its filters and its transforms' destinations, each list joined by form
// feeds, ">" standing for none. The Nats-Stream-Source header of a sourced message is
// made from it.
func SourceKey(src *server.StreamSource) string {
	iname := src.Name
	if src.External != nil {
		iname += ":" + ShortHash(src.External.ApiPrefix)
	}
	filter, dest := src.FilterSubject, ">"
	if filter == "" {
		filter = ">"
	}
	if len(src.SubjectTransforms) > 0 {
		filters := make([]string, 0, len(src.SubjectTransforms))
		dests := make([]string, 0, len(src.SubjectTransforms))
		for _, tr := range src.SubjectTransforms {
			filters, dests = append(filters, cmp.Or(tr.Source, ">")), append(dests, cmp.Or(tr.Destination, ">"))
		}
		filter, dest = strings.Join(filters, "\f"), strings.Join(dests, "\f")
	}
	return iname + " " + filter + " " + dest
}

// StreamIdentity is a stream's identity, as nats-server derives it from its creation time:
// a stream deleted and created again under its name has another.
func StreamIdentity(created time.Time) string {
	return ShortHash(created.UTC().Format(time.RFC3339Nano))
}

// ShortHash is nats-server's short hash of a name (getHash): the first eight bytes of its
// SHA-256, each as a digit of base 62.
func ShortHash(name string) string {
	const digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	sum := sha256.Sum256([]byte(name))
	var b [8]byte
	for i := range b {
		b[i] = digits[int(sum[i]%62)]
	}
	return string(b[:])
}

// CheckCopiesUpdate refuses a change of a mirror, or adding one, as nats-server does;
// removing it promotes the mirror to an ordinary stream. The two are compared as JSON, the
// form the stored one made its way back from.
func CheckCopiesUpdate(old, cfg *server.StreamConfig) *server.ApiError {
	if cfg.Mirror == nil {
		return nil
	}
	a, _ := json.Marshal(cfg.Mirror)
	b, _ := json.Marshal(old.Mirror)
	if string(a) != string(b) {
		return server.NewJSStreamMirrorNotUpdatableError()
	}
	return nil
}
