package service

import "testing"

// TestIsUnder: a tracked file is listed under a path that is it or one of
// its directories, compared by name.
func TestIsUnder(t *testing.T) {
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
	} {
		if got := isUnder(tc.path, tc.under); got != tc.want {
			t.Errorf("isUnder(%q, %q) = %v, want %v", tc.path, tc.under, got, tc.want)
		}
	}
}
