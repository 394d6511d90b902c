package leaf

import "strings"

// trie indexes subject patterns token by token, with `*` and `>` wildcards,
// and finds the patterns a literal subject matches. Every node can carry a
// value of type T for the pattern that ends there. Lookups allocate nothing.
// A trie is not safe for concurrent use.
//
// nats-server's exported generic sublist (server/gsl) does the same job but does not
// fit the link's read path: it keeps each node's values in a map, so a match walks a
// map where this walks a slice, comes back in no fixed order (queue members would be
// picked at random instead of in rotation), and takes a lock of its own beside the
// link's. Swapped in, BenchmarkDeliver took about twice as long and
// BenchmarkHasInterest about a third longer.
type trie[T any] struct {
	root tnode[T]
}

type tnode[T any] struct {
	lits map[string]*tnode[T]
	pwc  *tnode[T] // `*`: exactly one token
	fwc  *tnode[T] // `>`: one or more trailing tokens
	val  T
	set  bool // a pattern ends here
}

func (n *tnode[T]) empty() bool {
	return !n.set && len(n.lits) == 0 && n.pwc == nil && n.fwc == nil
}

// nextToken splits subject at its first dot.
func nextToken(subject string) (tok, rest string, last bool) {
	if i := strings.IndexByte(subject, '.'); i >= 0 {
		return subject[:i], subject[i+1:], false
	}
	return subject, "", true
}

// put returns the value slot for pattern, creating it if needed. `>` is a
// wildcard only as the last token; elsewhere it is an ordinary token, like
// any token that merely contains `*` or `>`.
func (t *trie[T]) put(pattern string) *T {
	n := &t.root
	for {
		tok, rest, last := nextToken(pattern)
		var next **tnode[T]
		switch {
		case tok == "*":
			next = &n.pwc
		case tok == ">" && last:
			next = &n.fwc
		}
		if next != nil {
			if *next == nil {
				*next = &tnode[T]{}
			}
			n = *next
		} else {
			c := n.lits[tok]
			if c == nil {
				if n.lits == nil {
					n.lits = make(map[string]*tnode[T])
				}
				c = &tnode[T]{}
				n.lits[tok] = c
			}
			n = c
		}
		if last {
			n.set = true
			return &n.val
		}
		pattern = rest
	}
}

// get returns the value slot for pattern, nil if no pattern ends there.
func (t *trie[T]) get(pattern string) *T {
	n := &t.root
	for {
		tok, rest, last := nextToken(pattern)
		switch {
		case tok == "*":
			n = n.pwc
		case tok == ">" && last:
			n = n.fwc
		default:
			n = n.lits[tok]
		}
		if n == nil {
			return nil
		}
		if last {
			if !n.set {
				return nil
			}
			return &n.val
		}
		pattern = rest
	}
}

// delete removes pattern and prunes the nodes it leaves empty.
func (t *trie[T]) delete(pattern string) {
	t.root.remove(pattern)
}

// remove reports whether n became empty.
func (n *tnode[T]) remove(pattern string) bool {
	tok, rest, last := nextToken(pattern)
	var c *tnode[T]
	switch {
	case tok == "*":
		c = n.pwc
	case tok == ">" && last:
		c = n.fwc
	default:
		c = n.lits[tok]
	}
	if c == nil {
		return false
	}
	if last {
		var zero T
		c.val, c.set = zero, false
	} else if !c.remove(rest) {
		return false
	}
	if !c.empty() {
		return false
	}
	switch {
	case tok == "*":
		n.pwc = nil
	case tok == ">" && last:
		n.fwc = nil
	default:
		delete(n.lits, tok)
	}
	return n.empty()
}

// match calls fn with the value of every pattern that matches the literal
// subject, until fn returns false. It reports whether fn never stopped it.
func (t *trie[T]) match(subject string, fn func(*T) bool) bool {
	return t.root.match(subject, fn)
}

func (n *tnode[T]) match(subject string, fn func(*T) bool) bool {
	tok, rest, last := nextToken(subject)
	// `>` needs at least one token, and there is one: tok.
	if c := n.fwc; c != nil && c.set && !fn(&c.val) {
		return false
	}
	if c := n.pwc; c != nil && !c.visit(rest, last, fn) {
		return false
	}
	if c := n.lits[tok]; c != nil && !c.visit(rest, last, fn) {
		return false
	}
	return true
}

func (n *tnode[T]) visit(rest string, last bool, fn func(*T) bool) bool {
	if last {
		return !n.set || fn(&n.val)
	}
	return n.match(rest, fn)
}
