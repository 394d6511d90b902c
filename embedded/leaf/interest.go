package leaf

import (
	"slices"
	"sync"
	"sync/atomic"
)

// interest mirrors the subscriptions the server announced with LS+ and
// LS-. The server keeps its own per-key counts and sends LS+ for a plain
// subject only when its count leaves zero and LS- when it returns there;
// for a queue group it sends LS+ with the group's new total weight on every
// change. So, exactly like the server's own processLeafSub, a repeated LS+
// for a key is an update, not a second reference, and LS- removes the key.
// Counting LS+ as references would leave stale interest behind whenever the
// server re-announces its subscriptions.
type interest struct {
	mu sync.RWMutex
	// keys holds "subject" or "subject queue" per announced subscription.
	keys map[string]struct{}
	// patterns counts the keys per subject pattern: a plain subscription
	// and several queue groups can share one.
	patterns trie[int]
	// groups is the queue groups announced per subject pattern, for
	// QueueGroups.
	groups trie[map[string]struct{}]
	// version counts the changes to keys, so that a caller that found
	// interest may skip asking again until it moves.
	version atomic.Uint64
}

// appendKey appends the key of subject in queue group queue ("subject" or "subject queue")
// to dst.
func appendKey[T string | []byte](dst []byte, subject, queue T) []byte {
	dst = append(dst, subject...)
	if len(queue) > 0 {
		dst = append(dst, ' ')
		dst = append(dst, queue...)
	}
	return dst
}

func interestKey(subject, queue []byte) string {
	if len(queue) == 0 {
		return string(subject)
	}
	return string(appendKey(make([]byte, 0, len(subject)+1+len(queue)), subject, queue))
}

// add records a subscription and reports whether it was new.
func (in *interest) add(subject, queue []byte) bool {
	key := interestKey(subject, queue)
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.keys == nil {
		in.keys = make(map[string]struct{})
	}
	if _, known := in.keys[key]; known {
		return false
	}
	in.keys[key] = struct{}{}
	*in.patterns.put(string(subject))++
	if len(queue) > 0 {
		g := in.groups.put(string(subject))
		if *g == nil {
			*g = make(map[string]struct{})
		}
		(*g)[string(queue)] = struct{}{}
	}
	in.version.Add(1)
	return true
}

// remove forgets a subscription and reports whether it was known.
func (in *interest) remove(subject, queue []byte) bool {
	key := interestKey(subject, queue)
	in.mu.Lock()
	defer in.mu.Unlock()
	if _, ok := in.keys[key]; !ok {
		return false
	}
	delete(in.keys, key)
	in.version.Add(1)
	s := bytesToString(subject)
	if n := in.patterns.get(s); n != nil {
		if *n--; *n <= 0 {
			in.patterns.delete(s)
		}
	}
	if len(queue) > 0 {
		if g := in.groups.get(s); g != nil {
			if delete(*g, bytesToString(queue)); len(*g) == 0 {
				in.groups.delete(s)
			}
		}
	}
	return true
}

// queueGroups appends to dst the queue groups of the announced
// subscriptions that match the literal subject, each once.
func (in *interest) queueGroups(subject string, dst []string) []string {
	in.mu.RLock()
	defer in.mu.RUnlock()
	in.groups.match(subject, func(g *map[string]struct{}) bool {
		for q := range *g {
			if !slices.Contains(dst, q) {
				dst = append(dst, q)
			}
		}
		return true
	})
	return dst
}

// has reports whether any announced subscription matches the literal
// subject.
func (in *interest) has(subject string) bool {
	in.mu.RLock()
	defer in.mu.RUnlock()
	return !in.patterns.match(subject, stopAtFirst)
}

// hasExact reports whether a subscription was announced for exactly
// subject in queue group queue, a plain one when queue is empty. Wildcards
// play no part: subject is compared as announced. Keys that fit in
// exactKeyBuf are looked up without allocating.
func (in *interest) hasExact(subject, queue string) bool {
	var buf [exactKeyBuf]byte
	key := appendKey(buf[:0], subject, queue)
	in.mu.RLock()
	defer in.mu.RUnlock()
	_, ok := in.keys[string(key)]
	return ok
}

// exactKeyBuf covers an inbox-style deliver subject with a long group name.
const exactKeyBuf = 128

// stopAtFirst ends a match at the first pattern found: every pattern in the
// trie stands for at least one key.
func stopAtFirst(*int) bool { return false }

// size reports the number of announced keys.
func (in *interest) size() int {
	in.mu.RLock()
	defer in.mu.RUnlock()
	return len(in.keys)
}

// HasInterest reports whether the server has announced a subscription,
// plain or queue, matching the literal subject: wildcards in the announced
// subscriptions apply, wildcards in subject do not. It is cheap enough to
// call per message and allocates nothing. After the link ends it reports
// the last state the server announced.
func (c *Conn) HasInterest(subject string) bool {
	return c.interest.has(subject)
}

// HasQueueInterest reports whether the server has announced a subscription
// to exactly subject in queue group group, or a plain subscription when
// group is empty. It is nats-server's test for a push consumer being bound
// to its deliver subject: only a subscription to that literal subject
// counts, not a wildcard one that covers it, and with a deliver group only a
// queue subscription of that group (a plain subscriber does not bind a
// grouped consumer, nor a queue subscriber an ungrouped one). After the link
// ends it reports the last state the server announced.
func (c *Conn) HasQueueInterest(subject, group string) bool {
	return c.interest.hasExact(subject, group)
}

// QueueGroups appends to dst the queue groups of the subscriptions the
// server announced that match the literal subject, each once: the groups a
// message published with PublishQueues must name to reach them, as the
// server hands a leafnode's message only to the queue groups it names.
func (c *Conn) QueueGroups(subject string, dst []string) []string {
	return c.interest.queueGroups(subject, dst)
}

// InterestVersion changes whenever the server announces or withdraws a
// subscription. A caller that read it before HasInterest reported a match
// knows the match still holds while it has not changed.
func (c *Conn) InterestVersion() uint64 {
	return c.interest.version.Load()
}

// InterestChanged returns a channel that receives after the server announced
// or withdrew a subscription. Changes coalesce (one receive may stand for
// many, made before or while it is handled), so a receiver asks HasInterest
// again rather than count them. The channel is the link's only one: it suits
// a single receiver that tells whoever else cares.
func (c *Conn) InterestChanged() <-chan struct{} { return c.interestCh }

// interestMoved tells InterestChanged's receiver, never waiting for it: it
// runs on the read loop.
func (c *Conn) interestMoved() {
	select {
	case c.interestCh <- struct{}{}:
	default:
	}
}
