package pg

// Message is one stored message.
type Message struct {
	Seq     uint64
	TS      int64 // unix ns
	Subject string
	Header  []byte
	Data    []byte

	cumBefore uint64
}

// Size is the message's stored size as JetStream accounts it: subject, headers, payload
// and a fixed per-message overhead.
func (m *Message) Size() uint64 { return MessageSize(m.Subject, m.Header, m.Data) }

// MessageSize is the stored size of a message with these parts: the size of its record in
// JetStream's file store (the default storage, and the one streams report), so that bytes
// and max_bytes mean the same here as there. sqlSize is the same in SQL.
func MessageSize(subject string, hdr, data []byte) uint64 {
	if len(hdr) == 0 {
		return uint64(30 + len(subject) + len(data))
	}
	return uint64(34 + len(subject) + len(hdr) + len(data))
}

// sqlSize is MessageSize in SQL for a chunk row m. The function it calls (migration 005) is
// the one definition in SQL, which stream_head and subject_live use too.
const sqlSize = `jetgres.message_size(m.subject, m.hdr, m.data)`

// columns is m as a row of a chunk table: seq, ts, subject, hdr, data, cum_before.
func (m *Message) columns() []any {
	return []any{int64(m.Seq), m.TS, m.Subject, m.Header, storedData(m.Data), int64(m.cumBefore)}
}

// storedData is a payload as its NOT NULL column takes it: no payload is an empty one.
func storedData(data []byte) []byte {
	if data == nil {
		return []byte{}
	}
	return data
}
