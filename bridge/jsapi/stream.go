package jsapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/jserr"
	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg"
)

// streamAPI serves $JS.API.STREAM.*; tok follows "STREAM".
func (a *API) streamAPI(ctx context.Context, tok []string, m *leaf.Msg) {
	if len(tok) == 0 {
		a.badRequest(m, server.JSApiSystemResponseType)
		return
	}
	op, body := tok[0], m.Data
	switch {
	case op == "NAMES":
		r, err := a.apiStreamNames(body)
		a.respond(m.Reply, r, &r.ApiResponse, server.NewJSStreamGeneralError, err)
	case op == "LIST":
		r, err := a.apiStreamList(ctx, body)
		a.respond(m.Reply, r, &r.ApiResponse, server.NewJSStreamGeneralError, err)
	case op == "MSG" && len(tok) == 3 && tok[1] == "GET":
		r, err := a.apiMsgGet(ctx, tok[2], body)
		a.respond(m.Reply, r, &r.ApiResponse, server.NewJSStreamStoreFailedError, err)
	case op == "MSG" && len(tok) == 3 && tok[1] == "DELETE":
		r, err := a.apiMsgDelete(ctx, tok[2], body)
		a.respond(m.Reply, r, &r.ApiResponse, server.NewJSStreamMsgDeleteFailedError, err)
	case len(tok) != 2:
		a.badRequest(m, server.JSApiSystemResponseType)
	case op == "CREATE":
		r, err := a.apiStreamCreate(ctx, tok[1], body)
		a.respond(m.Reply, r, &r.ApiResponse, server.NewJSStreamCreateError, err)
	case op == "UPDATE":
		r, err := a.apiStreamUpdate(ctx, tok[1], body)
		a.respond(m.Reply, r, &r.ApiResponse, server.NewJSStreamUpdateError, err)
	case op == "INFO":
		r, err := a.apiStreamInfo(ctx, tok[1], body)
		a.respond(m.Reply, r, &r.ApiResponse, server.NewJSStreamStoreFailedError, err)
	case op == "DELETE":
		r, err := a.apiStreamDelete(ctx, tok[1], body)
		a.respond(m.Reply, r, &r.ApiResponse, server.NewJSStreamDeleteError, err)
	case op == "PURGE":
		r, err := a.apiStreamPurge(ctx, tok[1], body)
		a.respond(m.Reply, r, &r.ApiResponse, server.NewJSStreamPurgeFailedError, err)
	case op == "SNAPSHOT":
		a.apiSnapshot(ctx, tok[1], m)
	case op == "RESTORE":
		a.apiRestore(ctx, tok[1], m)
	default:
		a.badRequest(m, server.JSApiSystemResponseType)
	}
}

func (a *API) apiStreamCreate(ctx context.Context, name string, body []byte) (*server.JSApiStreamCreateResponse, error) {
	resp := &server.JSApiStreamCreateResponse{ApiResponse: jswire.APIResponse(server.JSApiStreamCreateResponseType)}
	var req server.StreamConfig
	if e := jswire.DecodeRequest(body, &req); e != nil {
		return resp, e
	}
	if req.Name == "" {
		req.Name = name
	}
	if req.Name != name {
		return resp, server.NewJSStreamMismatchError()
	}
	cfg, e := jswire.CheckStreamConfig(req, a.cfg.MaxPayload)
	if e != nil {
		return resp, e
	}
	jswire.SetStaticStreamMetadata(&cfg)
	if cfg.Sealed {
		return resp, server.NewJSStreamInvalidConfigError(errors.New("stream configuration for create can not be sealed"))
	}
	a.streams.LockAdmin()
	defer a.streams.UnlockAdmin()
	if e := a.checkCopies(&cfg); e != nil {
		return resp, e
	}
	if e := a.streams.CheckReservation(name, &cfg); e != nil {
		return resp, e
	}
	if cur := a.streams.Lookup(name); cur != nil {
		// Creating an existing stream with the same configuration succeeds, as in JetStream.
		if jswire.SameStreamConfig(cur.Config(), cfg) {
			return a.streamCreated(ctx, resp, cur, false)
		}
		return resp, server.NewJSStreamNameExistError()
	}
	if o := a.streams.Overlapping(name, cfg.Subjects); o != nil {
		return resp, server.NewJSStreamSubjectOverlapError()
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return resp, server.NewJSStreamCreateError(err)
	}
	st, err := a.db.CreateStreamChecked(ctx, name, raw, cfg.FirstSeq, stream.OverlapCheck(cfg.Subjects))
	if errors.Is(err, stream.ErrOverlap) {
		return resp, server.NewJSStreamSubjectOverlapError()
	}
	if err != nil {
		return resp, fmt.Errorf("create stream %q: %w", name, jserr.StreamCreate(err))
	}
	s, err := a.streams.Add(st, cfg)
	if err != nil {
		return resp, server.NewJSStreamCreateError(err)
	}
	a.log.Info("stream created", "stream", name, "subjects", cfg.Subjects)
	a.copiesChanged(&cfg)
	return a.streamCreated(ctx, resp, s, true)
}

func (a *API) streamCreated(ctx context.Context, resp *server.JSApiStreamCreateResponse, s *stream.Stream, created bool) (*server.JSApiStreamCreateResponse, error) {
	info, err := a.streamInfo(ctx, s)
	if err != nil {
		return resp, err
	}
	// nats-server's create answer, unlike its info and update answers, names no domain.
	info.Domain = ""
	resp.StreamInfo, resp.DidCreate = info, created
	return resp, nil
}

// streamInfo answers what a stream info reports of the stream's state. The state, the
// number of subjects and of consumers come from one snapshot; the subjects are counted
// anew only when the stream changed since the last info (pg/subject_count.go).
func (a *API) streamInfo(ctx context.Context, s *stream.Stream) (*server.StreamInfo, error) {
	// JetStream removes an acknowledged message before it answers the ack; a pass now makes
	// every ack the consumers applied show, whether or not the maintainer got to it yet.
	if err := a.retention.Settle(ctx, s); err != nil {
		a.log.Warn("retention pass before stream info failed", "stream", s.Name(), "err", err)
	}
	st, err := a.db.StreamInfo(ctx, s.ID())
	if err != nil {
		return nil, fmt.Errorf("stream %q state: %w", s.Name(), jserr.StreamLookup(err))
	}
	state := server.StreamState{
		NumSubjects: st.NumSubjects,
		Msgs:        st.Msgs,
		Bytes:       st.Bytes,
		FirstSeq:    st.FirstSeq,
		LastSeq:     st.LastSeq,
		NumDeleted:  int(st.Deleted),
		Consumers:   st.Consumers,
	}
	if st.FirstTS > 0 {
		state.FirstTime = time.Unix(0, st.FirstTS).UTC()
	}
	if st.LastTS > 0 {
		state.LastTime = time.Unix(0, st.LastTS).UTC()
	}
	if st.Msgs == 0 {
		state.FirstSeq = st.LastSeq + 1
		if st.LastSeq == 0 && !st.Purged {
			// As JetStream reports a stream that never held a message nor was purged.
			state.FirstSeq = 0
		}
	}
	info := &server.StreamInfo{Config: jswire.StreamConfigForResponse(s.Config()), Created: s.Created().UTC(), State: state, TimeStamp: a.clock.Now().UTC(),
		Domain: a.cfg.Domain, Cluster: a.streamClusterInfo()}
	if a.cfg.Copies != nil {
		info.Mirror, info.Sources = a.cfg.Copies.Info(s)
	}
	return info, nil
}

func (a *API) apiStreamUpdate(ctx context.Context, name string, body []byte) (*server.JSApiStreamUpdateResponse, error) {
	resp := &server.JSApiStreamUpdateResponse{ApiResponse: jswire.APIResponse(server.JSApiStreamUpdateResponseType)}
	fail := func(e error) (*server.JSApiStreamUpdateResponse, error) { return resp, e }
	var req server.StreamConfig
	if e := jswire.DecodeRequest(body, &req); e != nil {
		return fail(e)
	}
	if req.Name == "" {
		req.Name = name
	}
	if req.Name != name {
		return fail(server.NewJSStreamMismatchError())
	}
	cfg, e := jswire.CheckStreamConfig(req, a.cfg.MaxPayload)
	if e != nil {
		return fail(e)
	}
	jswire.SetStaticStreamMetadata(&cfg)
	a.streams.LockAdmin()
	defer a.streams.UnlockAdmin()
	if e := a.streams.CheckReservation(name, &cfg); e != nil {
		return fail(e)
	}
	s, err := a.streams.FindLocked(ctx, name)
	if err != nil {
		return fail(jserr.StreamLookup(err))
	}
	old := s.Config()
	switch {
	case old.Storage != cfg.Storage:
		return fail(server.NewJSStreamInvalidConfigError(errors.New("stream configuration update can not change storage type")))
	case old.Retention != cfg.Retention && (old.Retention == server.WorkQueuePolicy || cfg.Retention == server.WorkQueuePolicy):
		return fail(server.NewJSStreamInvalidConfigError(errors.New("stream configuration update can not change retention policy to/from workqueue")))
	case old.DenyDelete && !cfg.DenyDelete:
		return fail(server.NewJSStreamInvalidConfigError(errors.New("stream configuration update can not cancel deny message deletes")))
	case old.DenyPurge && !cfg.DenyPurge:
		return fail(server.NewJSStreamInvalidConfigError(errors.New("stream configuration update can not cancel deny purge")))
	case old.Sealed && !cfg.Sealed:
		return fail(server.NewJSStreamInvalidConfigError(errors.New("stream configuration update can not unseal a sealed stream")))
	case old.AllowMsgCounter != cfg.AllowMsgCounter:
		return fail(server.NewJSStreamInvalidConfigError(errors.New("stream configuration update can not change message counter setting")))
	}
	if e := jswire.CheckScheduleUpdate(&old, &cfg); e != nil {
		return fail(e)
	}
	if e := jswire.CheckTTLUpdate(&old, &cfg); e != nil {
		return fail(e)
	}
	if e := jswire.CheckCopiesUpdate(&old, &cfg); e != nil {
		return fail(e)
	}
	if e := a.checkCopies(&cfg); e != nil {
		return fail(e)
	}
	if cfg.Sealed {
		// As nats-server does: nothing may leave a sealed stream, by age, purge or delete.
		cfg.MaxAge, cfg.Discard = 0, server.DiscardNew
		cfg.DenyDelete, cfg.DenyPurge, cfg.AllowRollup = true, true, false
	}
	if o := a.streams.Overlapping(name, cfg.Subjects); o != nil {
		return fail(server.NewJSStreamSubjectOverlapError())
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return fail(server.NewJSStreamUpdateError(err))
	}
	if err := a.db.UpdateStreamChecked(ctx, s.ID(), name, raw, stream.OverlapCheck(cfg.Subjects)); err != nil {
		if errors.Is(err, stream.ErrOverlap) {
			return fail(server.NewJSStreamSubjectOverlapError())
		}
		return fail(fmt.Errorf("update stream %q: %w", name, err))
	}
	s.SetConfig(cfg)
	if err := a.streams.Resubscribe(s); err != nil {
		return fail(server.NewJSStreamUpdateError(err))
	}
	if old.Retention != cfg.Retention {
		a.retention.PolicyChanged(s)
	}
	if err := a.retention.ApplyLimits(ctx, s, stream.Limits(&cfg), cfg.MaxAge); err != nil {
		return fail(fmt.Errorf("applying updated limits of stream %q: %w", name, err))
	}
	a.copiesChanged(&old)
	a.copiesChanged(&cfg)
	info, err := a.streamInfo(ctx, s)
	if err != nil {
		return fail(err)
	}
	resp.StreamInfo = info
	return resp, nil
}

func (a *API) apiStreamInfo(ctx context.Context, name string, body []byte) (*server.JSApiStreamInfoResponse, error) {
	resp := &server.JSApiStreamInfoResponse{ApiResponse: jswire.APIResponse(server.JSApiStreamInfoResponseType)}
	var req server.JSApiStreamInfoRequest
	s, err := a.requestedStream(ctx, name, body, &req)
	if err != nil {
		return resp, err
	}
	info, err := a.streamInfo(ctx, s)
	if err != nil {
		return resp, err
	}
	if req.DeletedDetails {
		deleted, err := a.db.DeletedSeqs(ctx, s.ID())
		if err != nil {
			return resp, fmt.Errorf("deleted details of stream %q: %w", name, err)
		}
		info.State.Deleted = deleted
	}
	if req.SubjectsFilter != "" {
		totals, err := a.db.SubjectTotals(ctx, s.ID(), req.SubjectsFilter)
		if err != nil {
			return resp, fmt.Errorf("subject totals of stream %q: %w", name, err)
		}
		resp.StreamInfo = info
		pageSubjects(resp, totals, max(req.Offset, 0))
	}
	resp.StreamInfo = info
	return resp, nil
}

// pageSubjects puts subject totals into a stream info response as nats-server does: all of
// them when they fit in one page, else the page at offset of the subjects in order.
func pageSubjects(resp *server.JSApiStreamInfoResponse, totals map[string]uint64, offset int) {
	if len(totals) == 0 {
		return
	}
	resp.Offset, resp.Limit, resp.Total = offset, server.JSMaxSubjectDetails, len(totals)
	if offset == 0 && len(totals) <= server.JSMaxSubjectDetails {
		resp.State.Subjects = totals
		return
	}
	subjects := slices.Sorted(maps.Keys(totals))
	page := subjects[min(offset, len(subjects)):min(offset+server.JSMaxSubjectDetails, len(subjects))]
	if len(page) == 0 {
		return
	}
	resp.State.Subjects = make(map[string]uint64, len(page))
	for _, subj := range page {
		resp.State.Subjects[subj] = totals[subj]
	}
}

func (a *API) apiStreamDelete(ctx context.Context, name string, body []byte) (*server.JSApiStreamDeleteResponse, error) {
	resp := &server.JSApiStreamDeleteResponse{ApiResponse: jswire.APIResponse(server.JSApiStreamDeleteResponseType)}
	fail := func(e error) (*server.JSApiStreamDeleteResponse, error) { return resp, e }
	if !jswire.IsEmptyRequest(body) {
		return fail(server.NewJSNotEmptyRequestError())
	}
	a.streams.LockAdmin()
	defer a.streams.UnlockAdmin()
	s, err := a.streams.FindLocked(ctx, name)
	if err != nil {
		return fail(jserr.StreamLookup(err))
	}
	a.streams.Unsubscribe(s)
	err = a.db.DeleteStream(ctx, s.ID())
	if err != nil && !errors.Is(err, pg.ErrNotFound) {
		_ = a.streams.Resubscribe(s)
		return fail(fmt.Errorf("delete stream %q: %w", name, err))
	}
	a.streams.Remove(s)
	a.log.Info("stream deleted", "stream", name)
	resp.Success = true
	return resp, nil
}

func (a *API) apiStreamPurge(ctx context.Context, name string, body []byte) (*server.JSApiStreamPurgeResponse, error) {
	resp := &server.JSApiStreamPurgeResponse{ApiResponse: jswire.APIResponse(server.JSApiStreamPurgeResponseType)}
	fail := func(e error) (*server.JSApiStreamPurgeResponse, error) { return resp, e }
	var req server.JSApiStreamPurgeRequest
	s, err := a.requestedStream(ctx, name, body, &req)
	if err != nil {
		return fail(err)
	}
	switch cfg := s.Config(); {
	case cfg.Sealed:
		return fail(server.NewJSStreamSealedError())
	case cfg.DenyPurge:
		return fail(server.NewJSStreamPurgeFailedError(errors.New("stream does not allow purge")))
	}
	if e := jswire.CheckPurgeRequest(&req); e != nil {
		return fail(e)
	}
	purged, err := a.db.Purge(ctx, s.ID(), pg.PurgeParams{Filter: req.Subject, UpTo: req.Sequence, Keep: req.Keep})
	if err != nil {
		return fail(fmt.Errorf("purge stream %q: %w", name, err))
	}
	s.Purge(ctx, stream.Purged{Request: true, Subject: req.Subject})
	resp.Success, resp.Purged = true, purged
	return resp, nil
}

// pagedNames returns the page of names starting at offset.
func pagedNames(names []string, offset, limit int) []string {
	if offset >= len(names) {
		return []string{}
	}
	return names[offset:min(len(names), offset+limit)]
}

func (a *API) sortedStreams(subject string) []*stream.Stream {
	all := a.streams.List()
	out := all[:0]
	for _, s := range all {
		if subject == "" || a.streamCovers(s, subject) {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out
}

func (a *API) streamCovers(s *stream.Stream, subject string) bool {
	for _, subj := range s.Config().Subjects {
		if server.SubjectsCollide(subj, subject) {
			return true
		}
	}
	return false
}

func (a *API) apiStreamNames(body []byte) (*server.JSApiStreamNamesResponse, error) {
	var req server.JSApiStreamNamesRequest
	if e := jswire.DecodeRequest(body, &req); e != nil {
		return &server.JSApiStreamNamesResponse{ApiResponse: jswire.APIResponse(server.JSApiStreamNamesResponseType)}, e
	}
	streams := a.sortedStreams(req.Subject)
	names := make([]string, len(streams))
	for i, s := range streams {
		names[i] = s.Name()
	}
	offset := max(req.Offset, 0)
	return &server.JSApiStreamNamesResponse{
		ApiResponse: jswire.APIResponse(server.JSApiStreamNamesResponseType),
		ApiPaged:    server.ApiPaged{Total: len(names), Offset: offset, Limit: server.JSApiNamesLimit},
		Streams:     pagedNames(names, offset, server.JSApiNamesLimit),
	}, nil
}

func (a *API) apiStreamList(ctx context.Context, body []byte) (*server.JSApiStreamListResponse, error) {
	var req server.JSApiStreamListRequest
	if e := jswire.DecodeRequest(body, &req); e != nil {
		return &server.JSApiStreamListResponse{ApiResponse: jswire.APIResponse(server.JSApiStreamListResponseType)}, e
	}
	streams := a.sortedStreams(req.Subject)
	offset := max(req.Offset, 0)
	resp := &server.JSApiStreamListResponse{
		ApiResponse: jswire.APIResponse(server.JSApiStreamListResponseType),
		ApiPaged:    server.ApiPaged{Total: len(streams), Offset: offset, Limit: server.JSApiListLimit},
		Streams:     []*server.StreamInfo{},
	}
	if offset < len(streams) {
		for _, s := range streams[offset:min(len(streams), offset+server.JSApiListLimit)] {
			info, err := a.streamInfo(ctx, s)
			var ae *server.ApiError
			switch {
			case errors.As(err, &ae) && ae.ErrCode == server.ApiErrors[server.JSStreamNotFoundErr].ErrCode:
				// Deleted since the list was taken: not missing, gone.
				continue
			case err != nil:
				return resp, err
			}
			resp.Streams = append(resp.Streams, info)
		}
	}
	return resp, nil
}

func (a *API) apiMsgGet(ctx context.Context, name string, body []byte) (*server.JSApiMsgGetResponse, error) {
	resp := &server.JSApiMsgGetResponse{ApiResponse: jswire.APIResponse(server.JSApiMsgGetResponseType)}
	fail := func(e error) (*server.JSApiMsgGetResponse, error) { return resp, e }
	var req server.JSApiMsgGetRequest
	s, err := a.requestedStream(ctx, name, body, &req)
	if err != nil {
		return fail(err)
	}
	// A sequence, the last of a subject, or the next of a subject from a sequence.
	if (req.LastFor != "" && (req.Seq > 0 || req.NextFor != "")) || (req.LastFor == "" && req.NextFor == "" && req.Seq == 0) {
		return fail(server.NewJSBadRequestError())
	}
	m, err := s.Gets().Get(ctx, getRequest(&req))
	if err != nil {
		return fail(fmt.Errorf("get message from stream %q: %w", name, jserr.MsgLookup(err)))
	}
	sm := &server.StoredMsg{Subject: m.Subject, Sequence: m.Seq, Data: m.Data, Time: time.Unix(0, m.TS).UTC()}
	if !req.NoHeaders {
		sm.Header = m.Header
	}
	resp.Message = sm
	return resp, nil
}

func (a *API) apiMsgDelete(ctx context.Context, name string, body []byte) (*server.JSApiMsgDeleteResponse, error) {
	resp := &server.JSApiMsgDeleteResponse{ApiResponse: jswire.APIResponse(server.JSApiMsgDeleteResponseType)}
	fail := func(e error) (*server.JSApiMsgDeleteResponse, error) { return resp, e }
	var req server.JSApiMsgDeleteRequest
	s, err := a.requestedStream(ctx, name, body, &req)
	if err != nil {
		return fail(err)
	}
	switch cfg := s.Config(); {
	case cfg.Sealed:
		return fail(server.NewJSStreamSealedError())
	case cfg.DenyDelete:
		return fail(server.NewJSStreamMsgDeleteFailedError(errors.New("message delete not permitted")))
	}
	if req.Seq == 0 {
		return fail(server.NewJSBadRequestError())
	}
	if err := a.db.DeleteMessage(ctx, s.ID(), req.Seq); err != nil {
		return fail(fmt.Errorf("delete message from stream %q: %w", name, jserr.MsgDelete(err)))
	}
	s.Purge(ctx, stream.Purged{})
	resp.Success = true
	return resp, nil
}

// streamClusterInfo is the cluster block of stream info: nats-server reports it for every
// stream, outside cluster mode too (no name, itself the leader), and clients print it
// ("Cluster Information"). The leader is the replica that answers: every replica appends.
func (a *API) streamClusterInfo() *server.ClusterInfo {
	return &server.ClusterInfo{Name: a.cfg.ClusterName, Leader: a.cfg.ReplicaName}
}
