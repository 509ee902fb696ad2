package watch

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/inode"
)

// nextEvent returns the next event of in, failing the test after 5 s.
func nextEvent(t *testing.T, in *inotifyFD) inotifyEvent {
	t.Helper()
	select {
	case ev := <-in.Events:
		return ev
	case err := <-in.Errors:
		t.Fatalf("inotify error: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("no inotify event within 5s")
	}
	return inotifyEvent{}
}

// TestInotifyFDNames: a watch added on a descriptor is the directory
// opened, under the name given, whatever the path leads to; a directory
// added again under a new name (moved) takes it, and the old name is no
// longer watched; a symlink is not watched.
func TestInotifyFDNames(t *testing.T) {
	root := t.TempDir()
	a, b, outside := filepath.Join(root, "a"), filepath.Join(root, "b"), filepath.Join(root, "outside")
	for _, d := range []string{a, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	in, err := newInotifyFD(16, false)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	addPath := func(name, path string) error {
		fd, err := inode.OpenPath(path)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return in.AddFD(name, fd)
	}
	if err := addPath(a, a); err != nil {
		t.Fatal(err)
	}
	// a moved to b, and a symlink to outside put at a: the watch is
	// still a's directory, named a until it is added under b.
	if err := os.Rename(a, b); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, a); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for ev := nextEvent(t, in); ev.Name != filepath.Join(a, "f") || !ev.Has(opCreate); ev = nextEvent(t, in) {
		if ev.Name != a || !ev.Has(opRename) { // (its IN_MOVE_SELF)
			t.Fatalf("event %+v, want a Create of a/f", ev)
		}
	}
	if err := addPath(b, b); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b, "g"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, in); ev.Name != filepath.Join(b, "g") || !ev.Has(opCreate) {
		t.Fatalf("event %+v after the directory was added as b, want a Create of b/g", ev)
	}
	if err := in.Remove(a); !errors.Is(err, errNoWatch) {
		t.Errorf("Remove of the old name: %v, want errNoWatch", err)
	}
	// The symlink at a, opened O_PATH|O_NOFOLLOW: IN_ONLYDIR refuses it
	// (ENOTDIR), and nothing outside is watched.
	if err := addPath(a, a); !errors.Is(err, unix.ENOTDIR) {
		t.Errorf("AddFD of a symlink's descriptor: %v, want ENOTDIR", err)
	}
	if err := os.WriteFile(filepath.Join(outside, "h"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := in.Remove(b); err != nil {
		t.Errorf("Remove of b: %v", err)
	}
	select {
	case ev := <-in.Events:
		t.Errorf("event %+v after b's watch was removed; want none (outside is not watched)", ev)
	case <-time.After(100 * time.Millisecond):
	}
}

// TestInotifyFDEnableOpens: an instance made with opens reports no open
// or close of a file until EnableOpens, then does, on the watches added
// before and after it; a watched name that leads to another directory by
// then is counted as missed and gets no watch.
func TestInotifyFDEnableOpens(t *testing.T) {
	root := t.TempDir()
	a, b, c, other := filepath.Join(root, "a"), filepath.Join(root, "b"), filepath.Join(root, "c"), filepath.Join(root, "other")
	for _, d := range []string{a, b, c, other} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "f"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	in, err := newInotifyFD(64, true)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	add := func(path string) {
		fd, err := inode.OpenPath(path)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := in.AddFD(path, fd); err != nil {
			t.Fatal(err)
		}
	}
	touch := func(dir string) {
		f, err := os.Open(filepath.Join(dir, "f"))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	add(a)
	add(c)
	touch(a)
	if err := os.WriteFile(filepath.Join(a, "marker"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, in); ev.Name != filepath.Join(a, "marker") || !ev.Has(opCreate) {
		t.Fatalf("event %+v before EnableOpens, want the marker's create (no open of a/f)", ev)
	}
	// c now names another directory: not watched by EnableOpens.
	if err := os.Rename(c, filepath.Join(root, "c-old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(other, c); err != nil {
		t.Fatal(err)
	}
	for ev := nextEvent(t, in); !(ev.Name == c && ev.Has(opRename)); ev = nextEvent(t, in) {
	} // (c's IN_MOVE_SELF)
	if n := in.EnableOpens(inode.OpenDir); n != 1 {
		t.Errorf("EnableOpens missed %d watches, want 1 (c)", n)
	}
	add(b)
	for _, dir := range []string{a, b, c} {
		touch(dir)
	}
	if err := os.WriteFile(filepath.Join(a, "end"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	got := map[string]inotifyOp{}
	for ev := nextEvent(t, in); ev.Name != filepath.Join(a, "end"); ev = nextEvent(t, in) {
		got[ev.Name] |= ev.Op
	}
	for _, dir := range []string{a, b} {
		if op := got[filepath.Join(dir, "f")]; op&opOpen == 0 || op&opClose == 0 {
			t.Errorf("%s/f: ops %b after EnableOpens, want an open and a close", dir, op)
		}
	}
	if op, ok := got[filepath.Join(c, "f")]; ok {
		t.Errorf("c/f (another directory now): ops %b, want none", op)
	}
}
