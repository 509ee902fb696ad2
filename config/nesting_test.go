package config

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/BurntSushi/toml"
)

// TestNestingBound: a document nested deeper than MaxDepth (arrays, inline
// tables, dotted keys, table headers) is refused with the line where the
// nesting passed the bound, and parsing it allocates little: before the
// bound, 80 KB of nested arrays made the key scanner allocate 4 GB (a key
// per level, each as long as the depth). One level less is not refused for
// its nesting.
func TestNestingBound(t *testing.T) {
	const n = 40000 // 80 KB of brackets
	dotted := func(k string, parts int) string { return strings.TrimSuffix(strings.Repeat(k+".", parts), ".") }
	inline := func(depth int) string { return strings.Repeat("{a=", depth) + "1" + strings.Repeat("}", depth) }
	for _, tc := range []struct {
		name, src string
		line      int // 0: not refused for its nesting
	}{
		{"arrays", "[writeback]\nx = " + strings.Repeat("[", n) + strings.Repeat("]", n) + "\n", 2},
		{"arrays across lines", "[writeback]\nx = [\n" + strings.Repeat("[", n) + strings.Repeat("]", n) + "]\n", 3},
		{"inline tables", "x = " + inline(n) + "\n", 1},
		{"dotted key", "\n" + dotted("a", n) + " = 1\n", 2},
		{"table header", "[" + dotted("a", n) + "]\n", 1},
		{"array of tables header", "[[" + dotted("a", n) + "]]\n", 1},
		{"long keys, few parts", "[" + dotted(strings.Repeat("k", 8000), 10) + "]\n" + dotted(strings.Repeat("v", 8000), 10) + " = [[[1]]]\n", 0},
		// The key is one level.
		{"arrays at the bound", "x = " + strings.Repeat("[", MaxDepth-1) + strings.Repeat("]", MaxDepth-1) + "\n", 0},
		{"arrays one past", "x = " + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + "\n", 1},
		{"dotted key at the bound", dotted("a", MaxDepth) + " = 1\n", 0},
		{"dotted key one past", dotted("a", MaxDepth+1) + " = 1\n", 1},
		{"key parts and arrays at the bound", dotted("a", MaxDepth-2) + " = [[1]]\n", 0},
		{"key parts and arrays one past", dotted("a", MaxDepth-2) + " = [[[1]]]\n", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := Parse("f.toml", []byte(tc.src))
			runtime.ReadMemStats(&after)
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
				t.Errorf("Parse of %d bytes allocated %d MB", len(tc.src), alloc>>20)
			}
			var ce *Error
			deep := errors.As(err, &ce) && strings.Contains(ce.Msg, "nested more than")
			if tc.line == 0 {
				if deep {
					t.Errorf("refused for its nesting: %v", err)
				}
				return
			}
			if !deep {
				t.Fatalf("Parse error = %v, want one about nesting", err)
			}
			if ce.Line != tc.line || ce.File != "f.toml" {
				t.Errorf("error at %s:%d, want f.toml:%d (%v)", ce.File, ce.Line, tc.line, err)
			}
		})
	}
}

// FuzzScanLines: on any input the key scanner ends, without panicking,
// with lines inside the input; and on a document the TOML parser accepts
// and that is not too deep, it gives a line to every top-level key the
// parser found.
func FuzzScanLines(f *testing.F) {
	for _, s := range []string{
		"",
		"[writeback]\ndirty_expire_interval = \"5s\"\n[[watch]]\npath = \"/srv\"\n",
		"a = [1, [2, {b = 'c'}], \"\"\"x\ny\"\"\"]\n[t.'q k'.\"r\"]\nz = 1979-05-27T07:32:00Z\n",
		"x = '''\n]]]\n'''\ny = \"a\\\"b\" # c\n[[arr]]\n[[arr]]\nv = {a.b = 1}\n",
		"[[[[", "a = {", "\"\"\"", "'\n", "a.b.c.d = [[[[[[",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		lines, tooDeep := scanLines(src)
		nl := strings.Count(src, "\n") + 1
		if tooDeep < 0 || tooDeep > nl {
			t.Fatalf("tooDeep = %d, the input has %d lines", tooDeep, nl)
		}
		for k, l := range lines {
			if l < 1 || l > nl {
				t.Fatalf("line of %q = %d, the input has %d lines", k, l, nl)
			}
			if len(k) > maxMarkedKey+len("[2147483647]") {
				t.Fatalf("a key of %d bytes was recorded", len(k))
			}
		}
		if tooDeep > 0 || !utf8.ValidString(src) {
			return
		}
		var m map[string]any
		md, err := toml.Decode(src, &m)
		if err != nil {
			return
		}
		for _, k := range md.Keys() {
			if len(k) != 1 || len(k[0]) > maxMarkedKey {
				continue
			}
			if _, ok := lines[joinKey("", k[0])]; !ok {
				t.Errorf("the parser found top-level key %q; the scanner has no line for it (%v)", k[0], lines)
			}
		}
	})
}
