package mirror

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nuid"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/embedded/leaf"
)

const (
	// InfoPrefix is where the replica that copies into a stream answers, for the other
	// replicas, what stream info reports of the stream's mirror or sources:
	// $JETGRES.COPY.INFO.<stream id>. $JETGRES.> never crosses a leafnode remote.
	InfoPrefix = "$JETGRES.COPY.INFO."
	// infoReplyPrefix is the inbox of such a request.
	infoReplyPrefix = "$JETGRES.COPY.R."
	// infoTimeout bounds the wait for the copying replica's answer.
	infoTimeout = 500 * time.Millisecond
)

// copyInfo is the answer of the replica that copies: the configuration it copies under
// (copyKey) and its origins' infos, in the configuration's order.
type copyInfo struct {
	Key     string                     `json:"key"`
	Origins []*server.StreamSourceInfo `json:"origins"`
}

// Info is the `mirror` and `sources` blocks of stream info for s, as nats-server reports
// them: from this replica's copy, or asked of the replica that copies. A stream nobody
// copies into now reports its origins as never heard from.
func (e *Engine) Info(s *stream.Stream) (*server.StreamSourceInfo, []*server.StreamSourceInfo) {
	cfg := s.ConfigView()
	if cfg.Mirror == nil && len(cfg.Sources) == 0 {
		return nil, nil
	}
	key := copyKey(cfg)
	e.mu.Lock()
	c := e.copies[s.ID()]
	e.mu.Unlock()
	var infos []*server.StreamSourceInfo
	if c != nil && c.key == key {
		infos = c.infos(e.clk.Now())
	} else if infos = e.askInfo(s.ID(), key); infos == nil {
		infos = newStreamCopy(e, s).infos(e.clk.Now())
	}
	if cfg.Mirror != nil {
		return infos[0], nil
	}
	return nil, infos
}

// infos is what stream info reports of each origin at now.
func (c *streamCopy) infos(now time.Time) []*server.StreamSourceInfo {
	out := make([]*server.StreamSourceInfo, 0, len(c.origins))
	for _, o := range c.origins {
		out = append(out, o.info(now))
	}
	return out
}

// serveInfo answers the other replicas' info requests for the stream while this replica
// copies into it.
func (c *streamCopy) serveInfo() {
	e := c.e
	sub, err := e.cfg.Link.Subscribe(InfoPrefix+strconv.FormatInt(c.s.ID(), 10), "", func(m *leaf.Msg) {
		if m.Reply == "" {
			return
		}
		b, err := json.Marshal(copyInfo{Key: c.key, Origins: c.infos(e.clk.Now())})
		if err == nil {
			_ = e.send(m.Reply, "", nil, b)
		}
	})
	if err != nil {
		e.log.Warn("answering the other replicas' stream info of a copy failed", "stream", c.s.Name(), "err", err)
		return
	}
	c.infoSub = sub
}

// askInfo asks the replica that copies into the stream with that id for its origins'
// infos under the configuration key; nil when none answers so, within infoTimeout.
func (e *Engine) askInfo(id int64, key string) []*server.StreamSourceInfo {
	subject := InfoPrefix + strconv.FormatInt(id, 10)
	if !e.cfg.Link.HasInterest(subject) {
		return nil
	}
	reply := infoReplyPrefix + nuid.Next()
	got := make(chan []byte, 1)
	sub, err := e.cfg.Link.Subscribe(reply, "", func(m *leaf.Msg) {
		select {
		case got <- m.Data:
		default:
		}
	})
	if err != nil {
		return nil
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := e.send(subject, reply, nil, nil); err != nil {
		return nil
	}
	t := e.clk.NewTimer(infoTimeout)
	defer t.Stop()
	select {
	case <-t.C():
		return nil
	case data := <-got:
		var ci copyInfo
		if json.Unmarshal(data, &ci) != nil || ci.Key != key {
			return nil
		}
		return ci.Origins
	}
}
