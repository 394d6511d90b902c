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

// Size is the message's size as JetStream's file store counts it: what bounds the memory
// and the reads it takes (the tail cache, a pull request's max_bytes). The bytes a stream
// holds count as its state row says (MessageSize).
func (m *Message) Size() uint64 { return MessageSize(false, m.Subject, m.Header, m.Data) }

// MessageSize is the stored size of a message with these parts as nats-server accounts it,
// so that bytes and max_bytes mean the same here as there: for a memory stream its subject,
// headers and payload and 16 bytes (memory store), for any other the size of its record in
// the file store. A stream's state row says which it counts (memory; streams created before
// it was kept count as the file store). sqlSize is the same in SQL.
func MessageSize(memory bool, subject string, hdr, data []byte) uint64 {
	switch {
	case memory:
		return uint64(16 + len(subject) + len(hdr) + len(data))
	case len(hdr) == 0:
		return uint64(30 + len(subject) + len(data))
	}
	return uint64(34 + len(subject) + len(hdr) + len(data))
}

// sqlSize is MessageSize in SQL for a chunk row m. The function it calls (migrations 005 and
// 013) is the one definition in SQL, which stream_head and subject_live use too.
func sqlSize(memory bool) string {
	if memory {
		return `jetgres.message_size(m.subject, m.hdr, m.data, true)`
	}
	return `jetgres.message_size(m.subject, m.hdr, m.data, false)`
}

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
