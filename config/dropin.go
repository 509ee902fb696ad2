package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// DropInDir is the drop-in directory of the main configuration file path:
// beside it, its name without the extension and with ".d"
// (/etc/flusherd/flusherd.toml: /etc/flusherd/flusherd.d).
func DropInDir(path string) string {
	return strings.TrimSuffix(path, filepath.Ext(path)) + ".d"
}

// dropIns lists the drop-ins of dir: its *.toml files (not hidden ones),
// in lexical order; none when dir does not exist. Errors are
// *fs.PathError.
func dropIns(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if n := e.Name(); strings.HasSuffix(n, ".toml") && !strings.HasPrefix(n, ".") {
			out = append(out, filepath.Join(dir, n))
		}
	}
	slices.Sort(out)
	return out, nil
}

// mergeTables merges the TOML tree m of a drop-in into dst: a key
// overrides dst's (a table's keys one by one), and [[watch]] entries are
// appended to dst's. It returns the number of dst's [[watch]] entries
// before m's (0 when m's replace them: either is not an array).
func mergeTables(dst, m map[string]any) (offset int) {
	for k, v := range m {
		old, had := dst[k]
		switch {
		case k == "watch" && had:
			a, okA := tomlArray(old)
			b, okB := tomlArray(v)
			if okA && okB {
				offset = len(a)
				dst[k] = append(a, b...)
				continue
			}
		case had:
			if t, ok := old.(map[string]any); ok {
				if u, ok := v.(map[string]any); ok {
					mergeTables(t, u)
					continue
				}
			}
		}
		dst[k] = v
	}
	return offset
}

// tomlArray returns v as a generic array when it is one (the TOML decoder
// gives an array of tables as []map[string]any).
func tomlArray(v any) ([]any, bool) {
	switch a := v.(type) {
	case []any:
		return slices.Clone(a), true
	case []map[string]any:
		out := make([]any, len(a))
		for i, t := range a {
			out[i] = t
		}
		return out, true
	}
	return nil, false
}

var watchIndex = regexp.MustCompile(`^watch\[(\d+)\]`)

// globalKey numbers a file's [[watch]] entry key after the offset entries
// of the files before it ("watch[0].path" at offset 2: "watch[2].path").
func globalKey(key string, offset int) string {
	m := watchIndex.FindStringSubmatchIndex(key)
	if m == nil || offset == 0 {
		return key
	}
	i, _ := strconv.Atoi(key[m[2]:m[3]])
	return "watch[" + strconv.Itoa(i+offset) + "]" + key[m[1]:]
}
