package leaf

import (
	"bytes"
	"errors"
	"fmt"
)

// ErrProtocol reports bytes from the server that do not follow the leafnode
// protocol. A Parser that returned it stays failed.
var ErrProtocol = errors.New("leaf: protocol error")

const (
	// MaxControlLine bounds one protocol line. The server's own limit for
	// what it accepts is 4 KiB, but its INFO lines (permissions, URLs) can
	// be longer, so this is generous.
	MaxControlLine = 64 * 1024
	// MaxPayload bounds the size field of LMSG/HMSG: the largest
	// max_payload a server can be configured with.
	MaxPayload = 64 * 1024 * 1024
)

// OpKind identifies a protocol operation sent by the server.
type OpKind uint8

// Operations a server sends on a leafnode connection.
const (
	OpInfo  OpKind = iota + 1 // INFO {json}: Arg holds the JSON
	OpPing                    // PING
	OpPong                    // PONG
	OpOK                      // +OK
	OpErr                     // -ERR 'text': Arg holds the text, quotes removed
	OpSub                     // LS+ subject [queue weight]
	OpUnsub                   // LS- subject [queue]
	OpMsg                     // LMSG or HMSG
)

var opNames = [...]string{
	OpInfo:  "INFO",
	OpPing:  "PING",
	OpPong:  "PONG",
	OpOK:    "+OK",
	OpErr:   "-ERR",
	OpSub:   "LS+",
	OpUnsub: "LS-",
	OpMsg:   "LMSG",
}

func (k OpKind) String() string {
	if int(k) < len(opNames) && opNames[k] != "" {
		return opNames[k]
	}
	return fmt.Sprintf("OpKind(%d)", uint8(k))
}

// Op is one parsed operation. Its slices alias the parser's or the caller's
// buffers and are valid only during the emit callback.
type Op struct {
	Kind OpKind

	// Arg is the argument of INFO and -ERR.
	Arg []byte

	// Subject is set for OpSub, OpUnsub and OpMsg.
	Subject []byte
	// Queue is the queue group of OpSub and OpUnsub, nil for a plain
	// subscription.
	Queue []byte
	// Weight is the queue group's total weight in OpSub (the server sends
	// the absolute value, not a delta); 1 for a plain subscription.
	Weight int

	// Reply is the reply subject of OpMsg, nil if there is none.
	Reply []byte
	// Queues lists the queue groups the server picked this connection for;
	// empty means the message is for plain subscriptions only.
	Queues [][]byte
	// Header is the raw header block of an HMSG, nil for LMSG.
	Header []byte
	// Data is the message payload.
	Data []byte
}

type parserState uint8

const (
	stateLine parserState = iota
	statePayload
	stateFailed
)

// Parser turns the byte stream a server writes on a leafnode connection
// into operations. It is incremental: feed it bytes as they arrive, split
// anywhere. It never panics and never allocates in proportion to a size it
// was merely told about; buffers grow only with bytes actually received.
// The zero value is ready to use. A Parser is not safe for concurrent use.
type Parser struct {
	state parserState
	err   error

	// line carries a control line split across Parse calls, and the line of
	// a message whose payload is still arriving.
	line []byte
	// payload carries a message payload (plus CRLF) split across calls.
	payload []byte
	// need is the payload length of the pending message, excluding CRLF.
	need int
	// hdr is the header length of the pending HMSG, -1 for LMSG.
	hdr int

	op   Op
	args [][]byte
}

// Parse consumes b and calls emit for every complete operation, in order.
// It keeps what it needs of an incomplete trailing operation, so b may be
// reused by the caller once Parse returns. If emit returns an error, Parse
// stops and returns it; the operation that emit saw counts as consumed and
// the parser stays usable. Protocol errors wrap ErrProtocol and are sticky.
func (p *Parser) Parse(b []byte, emit func(*Op) error) error {
	if p.state == stateFailed {
		return p.err
	}
	for len(b) > 0 {
		switch p.state {
		case stateLine:
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				if len(p.line)+len(b) > MaxControlLine {
					return p.fail("control line exceeds %d bytes", MaxControlLine)
				}
				p.line = append(p.line, b...)
				return nil
			}
			var line []byte
			carried := len(p.line) > 0
			if carried {
				if len(p.line)+i > MaxControlLine {
					return p.fail("control line exceeds %d bytes", MaxControlLine)
				}
				p.line = append(p.line, b[:i]...)
				line = p.line
			} else {
				if i > MaxControlLine {
					return p.fail("control line exceeds %d bytes", MaxControlLine)
				}
				line = b[:i]
			}
			b = b[i+1:]
			line = trimCR(line)

			isMsg, err := p.parseLine(line)
			if err != nil {
				return err
			}
			if !isMsg {
				p.line = p.line[:0]
				if err := emit(&p.op); err != nil {
					return err
				}
				continue
			}
			total := p.need + 2
			if len(b) >= total {
				// The whole payload is here: hand it out without copying.
				if err := p.finishMsg(b[:total]); err != nil {
					return err
				}
				b = b[total:]
				p.line = p.line[:0]
				if err := emit(&p.op); err != nil {
					return err
				}
				continue
			}
			// The payload is split: keep the line so the Op's slices stay
			// valid, then collect the payload.
			if !carried {
				p.line = append(p.line[:0], line...)
				if _, err := p.parseLine(p.line); err != nil {
					return err
				}
			}
			p.payload = append(p.payload[:0], b...)
			p.state = statePayload
			return nil

		case statePayload:
			want := p.need + 2 - len(p.payload)
			take := min(want, len(b))
			p.payload = append(p.payload, b[:take]...)
			b = b[take:]
			if len(p.payload) < p.need+2 {
				return nil
			}
			if err := p.finishMsg(p.payload); err != nil {
				return err
			}
			p.state = stateLine
			p.line = p.line[:0]
			err := emit(&p.op)
			p.releaseLarge()
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// maxRetained bounds the scratch buffers a parser keeps between messages,
// so that one large message does not pin its size in memory for good.
const maxRetained = 1 << 20

func (p *Parser) releaseLarge() {
	if cap(p.payload) > maxRetained {
		p.payload = nil
	}
	if cap(p.line) > maxRetained {
		p.line = nil
	}
}

func (p *Parser) fail(format string, args ...any) error {
	p.state = stateFailed
	p.err = fmt.Errorf("%w: "+format, append([]any{ErrProtocol}, args...)...)
	p.line, p.payload = nil, nil
	return p.err
}

// finishMsg checks the CRLF after a payload and sets Header and Data.
func (p *Parser) finishMsg(buf []byte) error {
	if buf[p.need] != '\r' || buf[p.need+1] != '\n' {
		return p.fail("message payload not followed by CRLF")
	}
	body := buf[:p.need:p.need]
	if p.hdr >= 0 {
		p.op.Header = body[:p.hdr:p.hdr]
		p.op.Data = body[p.hdr:]
	} else {
		p.op.Header = nil
		p.op.Data = body
	}
	return nil
}

// parseLine fills p.op from a control line without its line ending. It
// reports whether the op is a message whose payload follows.
func (p *Parser) parseLine(line []byte) (bool, error) {
	p.op = Op{Queues: p.op.Queues[:0]}
	name, rest := cutToken(line)
	switch {
	case len(name) == 0:
		return false, p.fail("empty control line")
	case bytes.EqualFold(name, []byte("PING")):
		p.op.Kind = OpPing
	case bytes.EqualFold(name, []byte("PONG")):
		p.op.Kind = OpPong
	case bytes.EqualFold(name, []byte("+OK")):
		p.op.Kind = OpOK
	case bytes.EqualFold(name, []byte("-ERR")):
		p.op.Kind = OpErr
		p.op.Arg = unquote(trimSpace(rest))
	case bytes.EqualFold(name, []byte("INFO")):
		p.op.Kind = OpInfo
		p.op.Arg = trimSpace(rest)
	case bytes.EqualFold(name, []byte("LS+")):
		return false, p.parseSub(rest)
	case bytes.EqualFold(name, []byte("LS-")):
		return false, p.parseUnsub(rest)
	case bytes.EqualFold(name, []byte("LMSG")):
		return true, p.parseMsg(rest, false)
	case bytes.EqualFold(name, []byte("HMSG")):
		return true, p.parseMsg(rest, true)
	default:
		return false, p.fail("unknown operation %q", clip(name))
	}
	return false, nil
}

func (p *Parser) parseSub(rest []byte) error {
	p.args = splitArgs(p.args[:0], rest)
	p.op.Kind = OpSub
	p.op.Weight = 1
	switch len(p.args) {
	case 1:
		p.op.Subject = p.args[0]
	case 3:
		p.op.Subject, p.op.Queue = p.args[0], p.args[1]
		// Like the server, a missing or malformed weight counts as one.
		if w := parseSize(p.args[2]); w > 1 {
			p.op.Weight = w
		}
	default:
		return p.fail("LS+ wants 1 or 3 arguments, got %d", len(p.args))
	}
	return nil
}

func (p *Parser) parseUnsub(rest []byte) error {
	p.args = splitArgs(p.args[:0], rest)
	p.op.Kind = OpUnsub
	switch len(p.args) {
	case 1:
		p.op.Subject = p.args[0]
	case 2:
		p.op.Subject, p.op.Queue = p.args[0], p.args[1]
	default:
		return p.fail("LS- wants 1 or 2 arguments, got %d", len(p.args))
	}
	return nil
}

// parseMsg reads the arguments of
//
//	LMSG <subject> [reply] <size>
//	LMSG <subject> + <reply> <queue>... <size>
//	LMSG <subject> | <queue>... <size>
//
// and the same for HMSG with <header size> before <size>.
func (p *Parser) parseMsg(rest []byte, withHeader bool) error {
	p.args = splitArgs(p.args[:0], rest)
	p.op.Kind = OpMsg
	args := p.args
	sizes := 1
	if withHeader {
		sizes = 2
	}
	if len(args) < 1+sizes {
		return p.fail("message wants at least %d arguments, got %d", 1+sizes, len(args))
	}
	p.op.Subject = args[0]
	middle := args[1 : len(args)-sizes]
	switch len(middle) {
	case 0:
	case 1:
		p.op.Reply = middle[0]
	default:
		switch {
		case len(middle[0]) == 1 && middle[0][0] == '+':
			p.op.Reply = middle[1]
			p.op.Queues = append(p.op.Queues, middle[2:]...)
		case len(middle[0]) == 1 && middle[0][0] == '|':
			p.op.Queues = append(p.op.Queues, middle[1:]...)
		default:
			return p.fail("bad reply indicator %q", clip(middle[0]))
		}
	}

	size := parseSize(args[len(args)-1])
	if size < 0 || size > MaxPayload {
		return p.fail("bad message size %q", clip(args[len(args)-1]))
	}
	hdr := -1
	if withHeader {
		hdr = parseSize(args[len(args)-2])
		if hdr < 0 || hdr > size {
			return p.fail("bad header size %q", clip(args[len(args)-2]))
		}
	}
	p.need, p.hdr = size, hdr
	return nil
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' }

// cutToken splits off the first whitespace-separated token.
func cutToken(b []byte) (tok, rest []byte) {
	b = trimSpace(b)
	for i, c := range b {
		if isSpace(c) {
			return b[:i], b[i:]
		}
	}
	return b, nil
}

// splitArgs appends the whitespace-separated tokens of b to dst. Servers
// separate them with spaces, which bytes.IndexByte finds many bytes at a
// time; only a line with a tab takes the byte-by-byte loop.
func splitArgs(dst [][]byte, b []byte) [][]byte {
	if bytes.IndexByte(b, '\t') < 0 {
		for len(b) > 0 {
			i := bytes.IndexByte(b, ' ')
			if i < 0 {
				return append(dst, b)
			}
			if i > 0 {
				dst = append(dst, b[:i])
			}
			b = b[i+1:]
		}
		return dst
	}
	start := -1
	for i, c := range b {
		if isSpace(c) {
			if start >= 0 {
				dst = append(dst, b[start:i])
				start = -1
			}
		} else if start < 0 {
			start = i
		}
	}
	if start >= 0 {
		dst = append(dst, b[start:])
	}
	return dst
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

func trimCR(b []byte) []byte {
	if len(b) > 0 && b[len(b)-1] == '\r' {
		return b[:len(b)-1]
	}
	return b
}

func unquote(b []byte) []byte {
	if len(b) >= 2 && b[0] == '\'' && b[len(b)-1] == '\'' {
		return b[1 : len(b)-1]
	}
	return b
}

// parseSize parses a non-negative decimal of at most 9 digits, -1 if b is
// anything else. Nine digits cannot overflow an int and cover MaxPayload.
func parseSize(b []byte) int {
	if len(b) == 0 || len(b) > 9 {
		return -1
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// clip keeps error messages short whatever the input.
func clip(b []byte) []byte {
	if len(b) > 32 {
		return b[:32]
	}
	return b
}
