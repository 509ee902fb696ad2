package watch

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"flusherd/internal/testfs"
	"flusherd/tree"
)

// scanTreeAt is treeAt by a scan of every tree: the deepest served tree
// whose root is path or above it, a non-recursive one only for its own
// files.
func scanTreeAt(trees []*watchedTree, path string) *watchedTree {
	var best *watchedTree
	for _, t := range trees {
		if t.gone {
			continue
		}
		if path == t.Root || t.Root == "/" || (len(path) > len(t.Root) && path[len(t.Root)] == '/' && strings.HasPrefix(path, t.Root)) {
			if !t.Recursive && filepath.Dir(path) != t.Root && path != t.Root {
				continue
			}
			if best == nil || len(t.Root) > len(best.Root) {
				best = t
			}
		}
	}
	return best
}

// scanTreeOfDir is treeOfDir by a scan of every listed tree.
func scanTreeOfDir(trees []*watchedTree, dir string) *watchedTree {
	var best *watchedTree
	for _, t := range trees {
		in := dir == t.Root || (t.Recursive && (t.Root == "/" || strings.HasPrefix(dir, t.Root+"/")))
		if in && (best == nil || len(t.Root) > len(best.Root)) {
			best = t
		}
	}
	return best
}

// TestTreeIndexMatchesScan: the look-ups by the tree index (treeAt,
// treeOfDir, holdsRoot, the mount's tree of checkMounts) answer as scans
// of every tree do, for nested, non-recursive and gone trees and "/",
// before and after trees are removed and added.
func TestTreeIndexMatchesScan(t *testing.T) {
	trees := []tree.Tree{{Root: "/"}, {Root: "/srv", Recursive: true}, {Root: "/srv/a"},
		{Root: "/srv/a/b", Recursive: true}, {Root: "/srv/ab", Recursive: true}, {Root: "/data/x/y", Recursive: true},
		{Root: "/data/x/y/z"}}
	fa := fakeFanotify(42, trees, &nopSink{}, Options{})
	paths := []string{"/", "/f", "/srv", "/srv/", "/srv/f", "/srv/a", "/srv/a/f", "/srv/a/c", "/srv/a/c/f",
		"/srv/a/b", "/srv/a/b/c/f", "/srv/ab", "/srv/ab/c", "/srv/abc", "/data", "/data/x", "/data/x/y",
		"/data/x/y/z", "/data/x/y/z/f", "/data/x/y/z/w/f", "/etc/f", "/srv//a/f", "rel/f"}
	check := func(stage string) {
		t.Helper()
		list := fa.list()
		for _, p := range paths {
			if got, want := fa.treeAt(p), scanTreeAt(list, p); got != want {
				t.Errorf("%s: treeAt(%q) = %v, a scan finds %v", stage, p, rootOf(got), rootOf(want))
			}
			if got, want := fa.treeOfDir(p), scanTreeOfDir(list, p); got != want {
				t.Errorf("%s: treeOfDir(%q) = %v, a scan finds %v", stage, p, rootOf(got), rootOf(want))
			}
			holds := slices.ContainsFunc(list, func(t *watchedTree) bool {
				return t.Root == p || p == "/" || strings.HasPrefix(t.Root, p+"/")
			})
			fa.mu.Lock()
			got := fa.idx.holdsRoot(p)
			fa.mu.Unlock()
			if got != holds {
				t.Errorf("%s: holdsRoot(%q) = %v, want %v", stage, p, got, holds)
			}
		}
	}
	check("listed")
	fa.mu.Lock()
	fa.idx.at("/srv").gone = true
	fa.mu.Unlock()
	check("/srv gone")
	for _, r := range []string{"/srv/a", "/"} {
		if tr, _ := fa.removeTree(r); tr == nil {
			t.Fatalf("removeTree(%q) found no tree", r)
		}
	}
	check("/srv/a and / removed")
	fa.mu.Lock()
	fa.listTreeLocked(&watchedTree{Tree: tree.Tree{Root: "/srv/a", Recursive: true}})
	fa.mu.Unlock()
	check("/srv/a added back, recursive")
}

// rootOf names t's root for a message.
func rootOf(t *watchedTree) string {
	if t == nil {
		return "none"
	}
	return t.Root
}

// TestFanotifyDirEventsOutsideTrees: a directory removed or moved outside
// every tree, holding no root, is dismissed: no root is looked at and the
// directory cache is kept. One that holds a root has only the roots below
// it looked at. (The roots here do not exist: a root looked at is found
// gone.)
func TestFanotifyDirEventsOutsideTrees(t *testing.T) {
	s := &goneSink{sink: sink{seen: map[string]int{}}}
	fa := fakeFanotify(42, []tree.Tree{{Root: "/srv/a", Recursive: true}, {Root: "/srv/b", Recursive: true}}, s, Options{})
	typ := binary.NativeEndian.AppendUint32(nil, 1)
	for h, p := range map[string]string{"out": "/var/out", "srv": "/srv"} {
		fa.dirs[string(fa.cacheKey(testFsid[:], typ, []byte(h)))] = &fanotifyDir{path: p, prefix: p + "/", tree: fa.treeOfDir(p)}
	}
	handle := func(dir, name string, mask uint64) {
		t.Helper()
		var ev event
		if _, ok := parseEvent(fanEventMask(testFsid, []byte(dir), nil, name, mask|unix.FAN_ONDIR), &ev); !ok {
			t.Fatal("malformed test event")
		}
		fa.handle(context.Background(), &ev)
	}
	for range 100 {
		handle("out", "x", unix.FAN_DELETE)
		handle("out", "y", unix.FAN_MOVED_FROM)
		handle("out", "y", unix.FAN_MOVED_TO)
	}
	if len(s.gone) != 0 {
		t.Errorf("directories outside the trees had roots looked at: %q found gone", s.gone)
	}
	if len(fa.dirs) != 2 {
		t.Errorf("the directory cache holds %d entries after events outside the trees, want the 2 it had", len(fa.dirs))
	}
	handle("srv", "a", unix.FAN_DELETE)
	if !slices.Equal(s.gone, []string{"/srv/a"}) {
		t.Errorf("after /srv/a was removed, the roots found gone are %q, want only /srv/a", s.gone)
	}
}

// TestFanotifyOtherMount: a tree reached through another mount of a
// listed tree's filesystem (a bind mount) is refused, naming that tree; a
// tree on the same mount, or whose other-mount tree was removed, is not.
func TestFanotifyOtherMount(t *testing.T) {
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4"})
	a, b, bind := filepath.Join(mnt.Dir, "a"), filepath.Join(mnt.Dir, "b"), filepath.Join(t.TempDir(), "bind")
	for _, d := range []string{a, b, bind} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount(b, bind, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(bind, 0); err != nil {
			t.Errorf("unmounting the bind mount: %v", err)
		}
	})
	fa := fakeFanotify(42, nil, &nopSink{}, Options{})
	for _, r := range []string{a, b} {
		fa.rootMounts.note(r)
	}
	if err := fa.otherMount(b); err != nil {
		t.Errorf("otherMount(%q), a tree on the mount of the others: %v", b, err)
	}
	err := fa.otherMount(bind)
	if err == nil || !strings.Contains(err.Error(), a) {
		t.Errorf("otherMount(%q), a bind mount of the trees' filesystem: %v, want errSecondMount naming %q", bind, err, a)
	}
	fa.rootMounts.note(bind)
	if err := fa.otherMount(a); err == nil || !strings.Contains(err.Error(), bind) {
		t.Errorf("otherMount(%q) with the bind mount listed: %v, want errSecondMount naming it", a, err)
	}
	fa.rootMounts.forget(bind)
	if err := fa.otherMount(a); err != nil {
		t.Errorf("otherMount(%q) once the bind mount's tree was removed: %v", a, err)
	}
}

// TestMountsChanged: the mount points of the mounts made, removed or
// moved between two readings of the mount table, each once.
func TestMountsChanged(t *testing.T) {
	m := func(id int, at string) *mountinfo.Info { return &mountinfo.Info{ID: id, Mountpoint: at} }
	before := []*mountinfo.Info{m(1, "/"), m(2, "/srv"), m(3, "/srv/a"), m(4, "/mnt/x")}
	now := []*mountinfo.Info{m(1, "/"), m(2, "/srv"), m(4, "/mnt/y"), m(5, "/srv/a"), m(6, "/data")}
	got := mountsChanged(before, now)
	slices.Sort(got)
	if want := []string{"/data", "/mnt/x", "/mnt/y", "/srv/a"}; !slices.Equal(got, want) {
		t.Errorf("mountsChanged = %q, want %q", got, want)
	}
	if got := mountsChanged(now, now); len(got) != 0 {
		t.Errorf("mountsChanged of a table and itself = %q, want none", got)
	}
}
