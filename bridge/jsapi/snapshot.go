package jsapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/jserr"
	"github.com/jetgres/jetgres/bridge/snapshot"
	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jsarchive"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg"
)

// apiSnapshot serves STREAM.SNAPSHOT.<stream>: it answers with the stream's configuration
// and state, as nats-server does, then sends the archive (bridge/snapshot) from a goroutine
// of the API's own, reading the stream in batches while the window allows.
func (a *API) apiSnapshot(ctx context.Context, name string, m *leaf.Msg) {
	resp := &server.JSApiStreamSnapshotResponse{ApiResponse: jswire.APIResponse(server.JSApiStreamSnapshotResponseType)}
	fail := func(err error) { a.respond(m.Reply, resp, &resp.ApiResponse, server.NewJSStreamSnapshotError, err) }
	if jswire.IsEmptyRequest(m.Data) {
		fail(server.NewJSBadRequestError())
		return
	}
	s, err := a.findStream(ctx, name)
	if err != nil {
		fail(err)
		return
	}
	var req server.JSApiStreamSnapshotRequest
	if e := jswire.DecodeRequest(m.Data, &req); e != nil {
		fail(e)
		return
	}
	if !jswire.SnapshotDeliverSubject(req.DeliverSubject) {
		fail(server.NewJSSnapshotDeliverSubjectInvalidError())
		return
	}
	info, err := a.streamInfo(ctx, s)
	if err != nil {
		fail(err)
		return
	}
	var consumers []jsarchive.ArchivedConsumer
	if !req.NoConsumers {
		if consumers, err = a.snapshotConsumers(ctx, s); err != nil {
			fail(err)
			return
		}
	}
	info.State.Consumers = len(consumers)
	resp.Config, resp.State = &info.Config, &info.State
	a.respond(m.Reply, resp, &resp.ApiResponse, server.NewJSStreamSnapshotError, nil)

	state, now := info.State, a.clock.Now()
	if !a.bg.Go(func() {
		pr, pw := io.Pipe()
		written := make(chan struct{})
		go func() {
			defer close(written)
			pw.CloseWithError(snapshot.WriteArchive(a.ctx, pw, a.db, s.ID(), state, consumers, now))
		}()
		err := snapshot.Send(a.ctx, snapshot.SendParams{Link: a.link, Clock: a.clock, Stream: name, Deliver: req.DeliverSubject,
			ChunkSize: req.ChunkSize, WindowSize: req.WindowSize}, pr)
		// A transfer that ended early leaves the writer waiting on the pipe.
		pr.CloseWithError(io.ErrClosedPipe)
		<-written
		if err != nil {
			a.log.Warn("stream snapshot failed", "stream", name, "err", err)
			return
		}
		a.log.Info("stream snapshot sent", "stream", name, "msgs", state.Msgs, "bytes", state.Bytes, "took", a.clock.Now().Sub(now))
	}) {
		a.log.Warn("stream snapshot not sent: the API is stopping", "stream", name)
	}
}

// snapshotConsumers reports the stream's consumers as a backup holds them. Only the ack
// floor is stored (jetgres keeps what was delivered past it in the memory of the replica
// that serves the consumer), so a consumer with acks pending is backed up delivered
// through its ack floor, as nats-server backs up a clustered one: what was pending is
// delivered again after a restore, never lost.
func (a *API) snapshotConsumers(ctx context.Context, s *stream.Stream) ([]jsarchive.ArchivedConsumer, error) {
	rows, err := a.db.Consumers(ctx, s.ID())
	if err != nil {
		return nil, fmt.Errorf("listing consumers of stream %q: %w", s.Name(), err)
	}
	infos, err := a.cons.List(ctx, s, rows, len(rows))
	if err != nil {
		return nil, err
	}
	out := make([]jsarchive.ArchivedConsumer, 0, len(infos))
	for _, ci := range infos {
		if ci == nil || ci.Config == nil {
			continue
		}
		cfg := *ci.Config
		cfg.Name = ci.Name
		st := &server.ConsumerState{
			Delivered: server.SequencePair{Consumer: ci.Delivered.Consumer, Stream: ci.Delivered.Stream},
			AckFloor:  server.SequencePair{Consumer: ci.AckFloor.Consumer, Stream: ci.AckFloor.Stream},
		}
		if ci.NumAckPending > 0 {
			st.Delivered = st.AckFloor
		}
		out = append(out, jsarchive.ArchivedConsumer{ConsumerConfig: &cfg, ConsumerState: st})
	}
	return out, nil
}

// apiRestore serves STREAM.RESTORE.<stream>: it checks the request as nats-server does,
// answers with the subject the chunks go to, and restores from a goroutine of the API's
// own, which answers the client's last message with a stream create response.
func (a *API) apiRestore(ctx context.Context, name string, m *leaf.Msg) {
	resp := &server.JSApiStreamRestoreResponse{ApiResponse: jswire.APIResponse(server.JSApiStreamRestoreResponseType)}
	fail := func(err error) { a.respond(m.Reply, resp, &resp.ApiResponse, server.NewJSStreamRestoreError, err) }
	if jswire.IsEmptyRequest(m.Data) {
		fail(server.NewJSBadRequestError())
		return
	}
	var req server.JSApiStreamRestoreRequest
	if e := jswire.DecodeRequest(m.Data, &req); e != nil {
		fail(e)
		return
	}
	if req.Config.Name == "" {
		req.Config.Name = name
	}
	if req.Config.Name != name {
		fail(server.NewJSStreamMismatchError())
		return
	}
	if strings.ContainsAny(name, `\/`) {
		fail(server.NewJSStreamNameContainsPathSeparatorsError())
		return
	}
	cfg, e := jswire.CheckStreamConfig(req.Config, a.cfg.MaxPayload)
	if e != nil {
		fail(e)
		return
	}
	jswire.SetStaticStreamMetadata(&cfg)
	if err := a.restorable(ctx, name, &cfg, false); err != nil {
		fail(err)
		return
	}
	rcv, err := snapshot.NewReceiver(ctx, a.link, a.clock, name)
	if err != nil {
		fail(server.NewJSRestoreSubscribeFailedError(err, name))
		return
	}
	resp.DeliverSubject = rcv.Subject()
	if !a.bg.Go(func() { a.restore(a.ctx, cfg, rcv) }) {
		rcv.Done(nil, errors.New("the API is stopping"))
		fail(server.NewJSStreamRestoreError(errors.New("jetgres is stopping")))
		return
	}
	a.respond(m.Reply, resp, &resp.ApiResponse, server.NewJSStreamRestoreError, nil)
}

// restorable refuses a restore into a name that is taken or subjects another stream has;
// locked says the caller holds the registry's admin lock.
func (a *API) restorable(ctx context.Context, name string, cfg *server.StreamConfig, locked bool) error {
	if e := a.streams.CheckReservation(name, cfg); e != nil {
		return e
	}
	find := a.streams.Find
	if locked {
		find = a.streams.FindLocked
	}
	switch _, err := find(ctx, name); {
	case err == nil:
		return server.NewJSStreamNameExistRestoreFailedError()
	case !errors.Is(err, pg.ErrNotFound):
		return jserr.StreamLookup(err)
	}
	if a.streams.Overlapping(name, cfg.Subjects) != nil {
		return server.NewJSStreamSubjectOverlapError()
	}
	return nil
}

// restore takes the archive from rcv into a new stream, and answers the client's last
// message with the stream's info or with what failed. A failed restore deletes what it
// stored.
func (a *API) restore(ctx context.Context, cfg server.StreamConfig, rcv *snapshot.Receiver) {
	final := &server.JSApiStreamCreateResponse{ApiResponse: jswire.APIResponse(server.JSApiStreamCreateResponseType)}
	start := a.clock.Now()
	s, stored, err := a.restoreStream(ctx, cfg, rcv)
	if err == nil {
		var info *server.StreamInfo
		if info, err = a.streamInfo(ctx, s); err == nil {
			info.Domain = ""
			final.StreamInfo = info
		}
	}
	if err != nil {
		if s != nil {
			a.dropRestored(ctx, s)
		}
		final.Error = server.NewJSStreamRestoreError(err, server.Unless(err))
		a.log.Warn("stream restore failed", "stream", cfg.Name, "msgs_stored", stored, "err", err)
	} else {
		a.log.Info("stream restored", "stream", cfg.Name, "msgs", stored, "took", a.clock.Now().Sub(start))
	}
	data, merr := json.Marshal(final)
	if merr != nil {
		a.log.Error("encoding restore response", "err", merr)
	}
	rcv.Done(data, err)
}

// restoreStream reads the archive's state and consumers, creates the stream sealed (so that
// nothing but the restore stores into it, and nothing expires from it, meanwhile) with
// its consumers at their ack floors, stores the messages, and then gives the stream its own
// configuration.
func (a *API) restoreStream(ctx context.Context, cfg server.StreamConfig, rcv *snapshot.Receiver) (*stream.Stream, uint64, error) {
	ar := jsarchive.NewReader(rcv.Reader())
	ar.MaxPayload = int64(a.cfg.MaxPayload)
	state, err := ar.State()
	if errors.Is(err, jsarchive.ErrFormat) {
		return nil, 0, fmt.Errorf("%w (jetgres restores the archives of nats-server 2.15 and later, stream.arc.s2; not the tar archives of older servers)", err)
	}
	if err != nil {
		return nil, 0, err
	}
	consumers, err := ar.Consumers()
	if err != nil {
		return nil, 0, err
	}
	rows := make([]pg.Consumer, 0, len(consumers))
	for _, c := range consumers {
		ccfg, e := jswire.CheckConsumerConfig(*c.ConsumerConfig, &cfg)
		if e != nil {
			return nil, 0, fmt.Errorf("consumer %q: %w", c.Name, e)
		}
		jswire.SetStaticConsumerMetadata(&ccfg)
		raw, err := json.Marshal(ccfg)
		if err != nil {
			return nil, 0, err
		}
		rows = append(rows, pg.Consumer{Name: c.Name, Config: raw, AckStreamSeq: c.AckFloor.Stream, AckConsumerSeq: c.AckFloor.Consumer})
	}

	sealed := cfg
	sealed.Sealed, sealed.MaxAge, sealed.DenyDelete, sealed.DenyPurge = true, 0, true, true
	s, err := a.createRestored(ctx, cfg, sealed, state.FirstSeq)
	if err != nil {
		return nil, 0, err
	}
	for _, r := range rows {
		r.StreamID = s.ID()
		if _, err := a.db.CreateConsumer(ctx, r, 0); err != nil {
			return s, 0, fmt.Errorf("consumer %q: %w", r.Name, err)
		}
	}
	stored, err := snapshot.Load(ctx, ar, a.db, snapshot.LoadParams{StreamID: s.ID(), Through: state.LastSeq, ChunkRows: s.ChunkRows()})
	if err != nil {
		return s, stored, err
	}
	if !rcv.WaitEnd() {
		return s, stored, errors.New("the upload did not end after the archive's end marker")
	}

	if err := a.unseal(ctx, s, cfg); err != nil {
		return s, stored, err
	}
	st, err := a.db.State(ctx, s.ID())
	if err != nil {
		return s, stored, err
	}
	// Outside the admin lock, as a purge announces itself: its subscribers may read.
	a.streams.Restored(ctx, s, st.FirstSeq, st.LastSeq)
	if err := a.retention.ApplyLimits(ctx, s, stream.Limits(&cfg), cfg.MaxAge); err != nil {
		return s, stored, fmt.Errorf("applying the limits of the restored stream: %w", err)
	}
	return s, stored, nil
}

// unseal gives a restored stream its own configuration.
func (a *API) unseal(ctx context.Context, s *stream.Stream, cfg server.StreamConfig) error {
	a.streams.LockAdmin()
	defer a.streams.UnlockAdmin()
	raw, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	if err := a.db.UpdateStreamChecked(ctx, s.ID(), cfg.Name, raw, nil); err != nil {
		return fmt.Errorf("unsealing the restored stream: %w", err)
	}
	s.SetConfig(cfg)
	return a.streams.Resubscribe(s)
}

// createRestored stores and serves a new stream with the sealed configuration, its first
// sequence where the backup's was.
func (a *API) createRestored(ctx context.Context, cfg, sealed server.StreamConfig, firstSeq uint64) (*stream.Stream, error) {
	a.streams.LockAdmin()
	defer a.streams.UnlockAdmin()
	if err := a.restorable(ctx, cfg.Name, &cfg, true); err != nil {
		return nil, err
	}
	raw, err := json.Marshal(sealed)
	if err != nil {
		return nil, err
	}
	row, err := a.db.CreateStreamChecked(ctx, cfg.Name, raw, firstSeq, stream.OverlapCheck(cfg.Subjects))
	if errors.Is(err, stream.ErrOverlap) {
		return nil, server.NewJSStreamSubjectOverlapError()
	}
	if err != nil {
		return nil, fmt.Errorf("create stream %q: %w", cfg.Name, err)
	}
	s, err := a.streams.Add(row, sealed)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// dropRestored deletes what a failed restore stored.
func (a *API) dropRestored(ctx context.Context, s *stream.Stream) {
	a.streams.LockAdmin()
	defer a.streams.UnlockAdmin()
	if err := a.db.DeleteStream(ctx, s.ID()); err != nil && !errors.Is(err, pg.ErrNotFound) {
		a.log.Error("deleting a stream whose restore failed", "stream", s.Name(), "err", err)
		return
	}
	a.streams.Remove(s)
}
