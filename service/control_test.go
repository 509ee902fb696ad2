package service

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// TestPathSet: a tracked file is listed under a path that is it or one of
// its directories, compared by name.
func TestPathSet(t *testing.T) {
	for _, tc := range []struct {
		path  string
		under []string
		want  bool
	}{
		{"/srv/a/f", []string{"/srv/a"}, true},
		{"/srv/a/f", []string{"/srv/a/"}, true},
		{"/srv/a/f", []string{"/srv/a/f"}, true},
		{"/srv/ab/f", []string{"/srv/a"}, false},
		{"/srv/a", []string{"/srv/a/f"}, false},
		{"/srv/a/f", []string{"/x", "/srv"}, true},
		{"/srv/a/f", []string{"/"}, true},
		{"/srv/a/f", []string{"/srv/b"}, false},
		{"/srv/a/f", []string{"/srv/a/../a"}, true},
		{"/srv", []string{"/srv/a", "/s"}, false},
		{"/srv/a/f", nil, false},
	} {
		if got := newPathSet(tc.under).under(tc.path); got != tc.want {
			t.Errorf("%q under %q: %v, want %v", tc.path, tc.under, got, tc.want)
		}
	}
}

// BenchmarkPathSet filters 30,000 tracked paths by 2,000 paths named in a
// dirty request (none of them a directory of the tracked files): the set,
// against the linear scan of the paths for each file (linear) it replaced.
// It reports ms per request.
func BenchmarkPathSet(b *testing.B) {
	tracked := make([]string, 30000)
	for i := range tracked {
		tracked[i] = fmt.Sprintf("/srv/many/d%02d/f%06d", i%50, i)
	}
	named := make([]string, 2000)
	for i := range named {
		named[i] = fmt.Sprintf("/srv/many/nonexist%06d", i)
	}
	linear := func(path string, paths []string) bool {
		for _, p := range paths {
			p = filepath.Clean(p)
			if path == p || p == "/" || strings.HasPrefix(path, p+"/") {
				return true
			}
		}
		return false
	}
	for _, mode := range []string{"set", "linear"} {
		b.Run(mode, func(b *testing.B) {
			n := 0
			for b.Loop() {
				set := newPathSet(named)
				for _, p := range tracked {
					if mode == "set" && set.under(p) || mode == "linear" && linear(p, named) {
						n++
					}
				}
			}
			if n != 0 {
				b.Fatalf("%d tracked paths under paths that hold none", n)
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/request")
		})
	}
}
