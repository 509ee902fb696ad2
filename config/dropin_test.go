package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// writeFiles writes each name's text under dir, making directories.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDropIns: the *.toml files of flusherd.d/ beside the main file are
// read after it in lexical order: a key overrides the one before (the
// last file wins), [[watch]] entries are added in order, and defaults that
// follow a key follow its final value; other and hidden files are not
// read.
func TestDropIns(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"a", "b", "c"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFiles(t, dir, map[string]string{
		"flusherd.toml": "[writeback]\ndirty_expire_interval = \"5s\"\nmin_pause = \"20ms\"\n[[watch]]\npath = \"" + dir + "/a\"\n",
		// Read in this order, whatever order they were made in.
		"flusherd.d/20-b.toml":    "[writeback]\ndirty_expire_interval = \"9s\"\n[[watch]]\npath = \"" + dir + "/c\"\nmode = \"integrity\"\n",
		"flusherd.d/10-a.toml":    "[writeback]\ndirty_expire_interval = \"7s\"\n[plug]\nmax_pending = 32\n[[watch]]\npath = \"" + dir + "/b\"\nexpire = \"2s\"\n",
		"flusherd.d/notes.txt":    "not toml at all [",
		"flusherd.d/.hidden.toml": "not toml at all [",
	})
	c, err := Load(filepath.Join(dir, "flusherd.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Writeback.DirtyExpireInterval != 9*time.Second || c.Writeback.MinPause != 20*time.Millisecond || c.Plug.MaxPending != 32 {
		t.Errorf("expire %v, min_pause %v, max_pending %d; want 9s (the last drop-in), 20ms (the main file), 32 (10-a.toml)",
			c.Writeback.DirtyExpireInterval, c.Writeback.MinPause, c.Plug.MaxPending)
	}
	var got []string
	for _, w := range c.Watch {
		got = append(got, fmt.Sprintf("%s %s %v", filepath.Base(w.Root), w.Mode, w.Expire))
	}
	want := []string{"a writeback 9s", "b writeback 2s", "c integrity 9s"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("trees (-want +got):\n%s", diff)
	}
}

// TestDropInErrors: every problem of the main file and its drop-ins is
// reported in one run, each with its own file, its line there, and the key
// as that file numbers its [[watch]] entries; the main file's first, then
// each drop-in's in reading order. A syntax error names its file.
func TestDropInErrors(t *testing.T) {
	dir := t.TempDir()
	main := filepath.Join(dir, "flusherd.toml")
	writeFiles(t, dir, map[string]string{
		"flusherd.toml":        "[writeback]\nmin_pause = 3\n[[watch]]\npath = \"" + dir + "\"\n",
		"flusherd.d/10-a.toml": "# trees\n[[watch]]\npath = \"" + dir + "/missing\"\n[[watch]]\nmode = \"integrity\"\n",
		"flusherd.d/20-b.toml": "[plug]\nmax_pending = 0\n[watcher]\nbackend = \"x\"\n",
	})
	_, err := Load(main)
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("Load: %v, want Errors", err)
	}
	var got []string
	for _, e := range es {
		got = append(got, fmt.Sprintf("%s:%d %s", filepath.Base(e.File), e.Line, e.Key))
	}
	want := []string{
		"flusherd.toml:2 writeback.min_pause",
		"10-a.toml:3 watch[0].path",
		"10-a.toml:4 watch[1].path",
		"20-b.toml:2 plug.max_pending",
		"20-b.toml:4 watcher.backend",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("errors (-want +got):\n%s\n(%v)", diff, err)
	}

	writeFiles(t, dir, map[string]string{"flusherd.d/30-c.toml": "[writeback\n"})
	_, err = Load(main)
	var e *Error
	if !errors.As(err, &e) || filepath.Base(e.File) != "30-c.toml" || e.Line != 1 {
		t.Errorf("a drop-in's syntax error: %v, want 30-c.toml line 1", err)
	}
}

// TestDropInDir: the drop-in directory is the main file's name without
// its extension, with ".d", beside it.
func TestDropInDir(t *testing.T) {
	for in, want := range map[string]string{
		"/etc/flusherd/flusherd.toml": "/etc/flusherd/flusherd.d",
		"/srv/conf/other.toml":        "/srv/conf/other.d",
		"cfg":                         "cfg.d",
	} {
		if got := DropInDir(in); got != want {
			t.Errorf("DropInDir(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestDropInDuplicate: a drop-in's tree that another file already watches
// is an error at the drop-in's line that names the other entry by its
// file, line and the key as that file numbers it (a duplicate within one
// file names the line only: TestParseErrors).
func TestDropInDuplicate(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"a", "b"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	main := filepath.Join(dir, "flusherd.toml")
	writeFiles(t, dir, map[string]string{
		"flusherd.toml":        "# main\n[[watch]]\npath = \"" + dir + "/b\"\n[[watch]]\npath = \"" + dir + "/a\"\n",
		"flusherd.d/10-x.toml": "[[watch]]\npath = \"" + dir + "/a\"\n[[watch]]\npath = \"" + dir + "/a/\"\n",
	})
	_, err := Load(main)
	var es Errors
	if !errors.As(err, &es) || len(es) != 2 {
		t.Fatalf("Load: %v, want two errors", err)
	}
	want := []string{
		"10-x.toml:2: watch[0].path: \"" + dir + "/a\" is already watched by watch[1] (" + main + ":5)",
		"10-x.toml:4: watch[1].path: \"" + dir + "/a\" is already watched by watch[1] (" + main + ":5)",
	}
	var got []string
	for _, e := range es {
		got = append(got, fmt.Sprintf("%s:%d: %s: %s", filepath.Base(e.File), e.Line, e.Key, e.Msg))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
}
