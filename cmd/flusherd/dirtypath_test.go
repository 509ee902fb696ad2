package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"flusherd/control"
	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
)

// TestDirtyUnderPaths: `flusherd dirty PATH...` lists only the tracked
// files that are one of the paths or below one (a relative PATH taken
// from the working directory), and --top counts among those.
func TestDirtyUnderPaths(t *testing.T) {
	testfs.SkipShort(t, "the daemon on loop-mounted ext4")
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64})
	for _, d := range []string{"a", "ab", "b"} {
		if err := os.Mkdir(filepath.Join(mnt.Dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	d := startDaemon(t, fmt.Sprintf("[writeback]\ndirty_writeback_interval = \"200ms\"\n[[watch]]\npath = %q\nexpire = \"1h\"\n", mnt.Dir))
	for _, f := range []string{"a/1", "a/2", "ab/3", "b/4"} {
		writeDirty(t, filepath.Join(mnt.Dir, f), 8<<10)
	}
	list := func(args ...string) []string {
		var out, errb bytes.Buffer
		if code := Main(append([]string{"dirty", "--json", "--stats-dir", d.statsDir}, args...), &out, &errb); code != 0 {
			t.Fatalf("flusherd dirty %q: exit %d: %s", args, code, errb.String())
		}
		var files []control.DirtyFile
		if err := json.Unmarshal(out.Bytes(), &files); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, f := range files {
			rel, _ := filepath.Rel(mnt.Dir, string(f.Path))
			names = append(names, rel)
		}
		slices.Sort(names)
		return names
	}
	testwait.For(t, "the four files tracked", 10*time.Second, func() bool { return len(list("--top", "0")) == 4 })
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{filepath.Join(mnt.Dir, "a")}, []string{"a/1", "a/2"}},
		{[]string{filepath.Join(mnt.Dir, "a") + "/"}, []string{"a/1", "a/2"}},
		{[]string{filepath.Join(mnt.Dir, "a/1"), filepath.Join(mnt.Dir, "b")}, []string{"a/1", "b/4"}},
		{[]string{filepath.Join(mnt.Dir, "nothing")}, nil},
		{[]string{"--top", "1", filepath.Join(mnt.Dir, "ab")}, []string{"ab/3"}},
	} {
		if got := list(tc.args...); !slices.Equal(got, tc.want) {
			t.Errorf("flusherd dirty %q: %q, want %q", tc.args, got, tc.want)
		}
	}
	t.Chdir(mnt.Dir)
	if got := list("b"); !slices.Equal(got, []string{"b/4"}) {
		t.Errorf("flusherd dirty b (relative): %q, want [b/4]", got)
	}
	// A path in no tree: nothing listed, and a note says why; a
	// directory above the tree holds it, and is not outside. A path that
	// does not exist gets one note: that it is in no tree, or, in a
	// tree, that it is listed by name.
	for _, c := range []struct {
		path             string
		outside, missing bool
	}{
		{"/etc", true, false},
		{filepath.Dir(mnt.Dir), false, false},
		{filepath.Join(mnt.Dir, "nothing"), false, true},
		{filepath.Join(t.TempDir(), "nothing"), true, false},
	} {
		var out, errb bytes.Buffer
		if code := Main([]string{"dirty", "--stats-dir", d.statsDir, c.path}, &out, &errb); code != 0 {
			t.Fatalf("flusherd dirty %s: exit %d: %s", c.path, code, errb.String())
		}
		if got := strings.Contains(errb.String(), "not in a watched tree"); got != c.outside {
			t.Errorf("flusherd dirty %s: stderr %q; a note that it is in no tree: %v, want %v", c.path, errb.String(), got, c.outside)
		}
		if got := strings.Contains(errb.String(), "listing the tracked files under that name"); got != c.missing {
			t.Errorf("flusherd dirty %s: stderr %q; a note that it is listed by name: %v, want %v", c.path, errb.String(), got, c.missing)
		}
		if n := strings.Count(errb.String(), "note:"); n > 1 {
			t.Errorf("flusherd dirty %s: %d notes: %q", c.path, n, errb.String())
		}
	}
}
