package config

import (
	"strconv"
	"strings"
)

// scanLines maps every key of a TOML document to the line it is defined on.
//
// BurntSushi/toml records key positions internally but does not export them
// (and keeps only one position per key for all [[array]] entries), so this
// is a small scanner of its own. Keys
// are dotted as by joinKey; entries of arrays (of tables, or inline) get a
// 0-based index: "watch[1]" is the second [[watch]] header and
// "watch[1].path" the path key under it. A table defined only implicitly
// (by a dotted key or a sub-table header) maps to the line of its first use.
//
// It runs before the TOML parser, so it never fails on a document the
// parser would refuse: it skips what it does not understand. A key or value
// nested deeper than MaxDepth stops it; tooDeep then gives that line (the
// parser's recursion, and marking every level, would take memory and time
// that grow with the depth's square: an 80 KB file of nested arrays took
// 4 GB).
func scanLines(src string) (lines map[string]int, tooDeep int) {
	sc := &scanner{s: src, line: 1, lines: make(map[string]int), arrays: make(map[string]int)}
	sc.document()
	return sc.lines, sc.tooDeep
}

// MaxDepth is the deepest nesting a configuration may have: the parts of a
// dotted key plus the arrays and inline tables its value is nested in. The
// schema needs 3 ("watch[1].path").
const MaxDepth = 32

type scanner struct {
	s       string
	i       int
	line    int
	lines   map[string]int
	arrays  map[string]int // array-of-tables key → entries seen so far
	depth   int            // nesting of the key or value being read
	tooDeep int            // line where nesting passed MaxDepth; 0 if none
}

// deeper enters one more level of nesting; past MaxDepth it records the
// line and ends the scan (the rest of the input is skipped).
func (sc *scanner) deeper() bool {
	sc.depth++
	if sc.depth <= MaxDepth {
		return true
	}
	if sc.tooDeep == 0 {
		sc.tooDeep = sc.line
	}
	sc.i = len(sc.s)
	return false
}

func (sc *scanner) eof() bool { return sc.i >= len(sc.s) }

func (sc *scanner) peek(off int) byte {
	if sc.i+off < len(sc.s) {
		return sc.s[sc.i+off]
	}
	return 0
}

func (sc *scanner) advance(n int) {
	for ; n > 0 && !sc.eof(); n-- {
		if sc.s[sc.i] == '\n' {
			sc.line++
		}
		sc.i++
	}
}

// maxMarkedKey bounds the keys the scanner records and builds: a longer
// one (no key of the schema is) has no line in errors, and memory stays
// linear in the input.
const maxMarkedKey = 1 << 10

// join is joinKey, except that a key past maxMarkedKey is not extended.
func (sc *scanner) join(prefix, k string) string {
	if len(prefix) > maxMarkedKey {
		return prefix
	}
	return joinKey(prefix, k)
}

func (sc *scanner) mark(key string, line int) {
	if len(key) > maxMarkedKey {
		return
	}
	if _, ok := sc.lines[key]; !ok {
		sc.lines[key] = line
	}
}

// skipSpace skips blanks and, if nl, newlines and comments too.
func (sc *scanner) skipSpace(nl bool) {
	for !sc.eof() {
		switch c := sc.peek(0); {
		case c == ' ' || c == '\t':
		case nl && (c == '\n' || c == '\r'):
		case nl && c == '#':
			for !sc.eof() && sc.peek(0) != '\n' {
				sc.advance(1)
			}
			continue
		default:
			return
		}
		sc.advance(1)
	}
}

func (sc *scanner) skipLine() {
	for !sc.eof() && sc.peek(0) != '\n' {
		sc.advance(1)
	}
}

func (sc *scanner) document() {
	table := ""
	for {
		sc.skipSpace(true)
		if sc.eof() {
			return
		}
		line := sc.line
		if sc.peek(0) != '[' {
			sc.keyval(table)
			sc.skipLine() // trailing blanks and comment
			continue
		}
		array := sc.peek(1) == '['
		if array {
			sc.advance(2)
		} else {
			sc.advance(1)
		}
		parts := sc.keyParts()
		sc.skipLine()
		// Resolve the header: a prefix naming an array of tables refers
		// to its last entry.
		table = ""
		for n, k := range parts {
			table = sc.join(table, k)
			sc.mark(table, line)
			if array && n == len(parts)-1 {
				idx := sc.arrays[table]
				sc.arrays[table] = idx + 1
				table = sc.index(table, idx)
				sc.mark(table, line)
			} else if cnt, ok := sc.arrays[table]; ok {
				table = sc.index(table, cnt-1)
			}
		}
	}
}

// index is key's n-th entry, "key[n]", except that a key past
// maxMarkedKey is not extended.
func (sc *scanner) index(key string, n int) string {
	if len(key) > maxMarkedKey {
		return key
	}
	return key + "[" + strconv.Itoa(n) + "]"
}

// keyParts reads a possibly dotted, possibly quoted key, of at most
// MaxDepth parts less the nesting it is in.
func (sc *scanner) keyParts() []string {
	var parts []string
	for {
		if len(parts)+sc.depth >= MaxDepth {
			if sc.tooDeep == 0 {
				sc.tooDeep = sc.line
			}
			sc.i = len(sc.s)
			return parts
		}
		sc.skipSpace(false)
		var k string
		switch c := sc.peek(0); {
		case c == '"':
			start := sc.i
			sc.basicString()
			raw := sc.s[start:sc.i]
			if u, err := strconv.Unquote(raw); err == nil {
				k = u
			} else {
				k = strings.Trim(raw, `"`)
			}
		case c == '\'':
			start := sc.i + 1
			sc.literalString()
			k = strings.TrimSuffix(sc.s[start:sc.i], "'")
		default:
			start := sc.i // a bare key; tolerate non-ASCII letters
			for !sc.eof() && !strings.ContainsRune(" \t=.[]{},\"'#\r\n", rune(sc.peek(0))) {
				sc.advance(1)
			}
			if sc.i == start {
				return parts
			}
			k = sc.s[start:sc.i]
		}
		parts = append(parts, k)
		sc.skipSpace(false)
		if sc.peek(0) != '.' {
			return parts
		}
		sc.advance(1)
	}
}

// keyval reads "key = value" in table prefix. The key's parts count
// towards the nesting of its value.
func (sc *scanner) keyval(prefix string) {
	line := sc.line
	key := prefix
	parts := sc.keyParts()
	for _, k := range parts {
		key = sc.join(key, k)
		sc.mark(key, line)
	}
	sc.skipSpace(false)
	if sc.peek(0) != '=' {
		sc.advance(1) // not TOML; make progress
		return
	}
	sc.advance(1)
	sc.skipSpace(false)
	sc.depth += len(parts)
	sc.value(key)
	sc.depth -= len(parts)
}

func (sc *scanner) value(key string) {
	switch sc.peek(0) {
	case '"':
		sc.basicString()
	case '\'':
		sc.literalString()
	case '[':
		if !sc.deeper() {
			return
		}
		defer func() { sc.depth-- }()
		sc.advance(1)
		for n := 0; ; n++ {
			sc.skipSpace(true)
			if sc.eof() || sc.peek(0) == ']' {
				sc.advance(1)
				return
			}
			elem := sc.index(key, n)
			sc.mark(elem, sc.line)
			start := sc.i
			sc.value(elem)
			sc.skipSpace(true)
			if sc.peek(0) == ',' || sc.i == start {
				sc.advance(1)
			}
		}
	case '{':
		if !sc.deeper() {
			return
		}
		defer func() { sc.depth-- }()
		sc.advance(1)
		for {
			sc.skipSpace(true)
			if sc.eof() || sc.peek(0) == '}' {
				sc.advance(1)
				return
			}
			start := sc.i
			sc.keyval(key)
			sc.skipSpace(true)
			if sc.peek(0) == ',' || sc.i == start {
				sc.advance(1)
			}
		}
	default: // number, boolean, date-time (which may contain a space)
		for !sc.eof() && !strings.ContainsRune(",]}#\r\n", rune(sc.peek(0))) {
			sc.advance(1)
		}
	}
}

// basicString skips a basic string, single- or multi-line.
func (sc *scanner) basicString() {
	if strings.HasPrefix(sc.s[sc.i:], `"""`) {
		sc.advance(3)
		for !sc.eof() {
			switch {
			case sc.peek(0) == '\\':
				sc.advance(2)
			case strings.HasPrefix(sc.s[sc.i:], `"""`):
				sc.advance(3)
				for range 2 { // up to two quotes may end the content
					if sc.peek(0) == '"' {
						sc.advance(1)
					}
				}
				return
			default:
				sc.advance(1)
			}
		}
		return
	}
	sc.advance(1)
	for !sc.eof() {
		switch sc.peek(0) {
		case '\\':
			sc.advance(2)
		case '"':
			sc.advance(1)
			return
		case '\n':
			return
		default:
			sc.advance(1)
		}
	}
}

// literalString skips a literal string, single- or multi-line.
func (sc *scanner) literalString() {
	if strings.HasPrefix(sc.s[sc.i:], "'''") {
		sc.advance(3)
		end := strings.Index(sc.s[sc.i:], "'''")
		if end < 0 {
			sc.advance(len(sc.s))
			return
		}
		sc.advance(end + 3)
		for range 2 {
			if sc.peek(0) == '\'' {
				sc.advance(1)
			}
		}
		return
	}
	sc.advance(1)
	for !sc.eof() && sc.peek(0) != '\'' && sc.peek(0) != '\n' {
		sc.advance(1)
	}
	sc.advance(1)
}
