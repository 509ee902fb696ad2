package main

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/internal/cli"
	"flusherd/internal/faultfs"
	"flusherd/internal/testfs"
)

// TestBtrfsSubvolume: a tree at the top of a btrfs filesystem that holds a
// subvolume (its own st_dev, not registered for opens by handle): a file
// written in the subvolume is written back within the bound, and SIGTERM
// does not wait for it. Both backends.
func TestBtrfsSubvolume(t *testing.T) {
	t.Parallel()
	needBtrfs(t)
	for _, backend := range []string{"fanotify", "inotify"} {
		t.Run(backend, func(t *testing.T) {
			mnt := testfs.Mount(t, testfs.Options{Type: "btrfs"})
			sv := filepath.Join(mnt.Dir, "sv")
			makeSubvolume(t, sv)
			d := startDaemon(t, oneTree(backend, mnt.Dir))
			top, inner := filepath.Join(mnt.Dir, "top1"), filepath.Join(sv, "g1")
			writeDirty(t, top, 64<<10)
			writeDirty(t, inner, 64<<10)
			waitAllClean(t, 5*time.Second, top, inner)
			writeDirty(t, filepath.Join(sv, "g2"), 64<<10)
			start := time.Now()
			d.stop(t)
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("SIGTERM took %s", took)
			}
		})
	}
}

// TestBtrfsSubvolumeRoot: a tree whose root is a btrfs subvolume, under
// each backend setting: it is served (a file in it is written back within
// the bound), or, with an explicit backend = "fanotify" that the subvolume
// refuses, the start fails as a configuration error (exit 2) naming the
// tree and suggesting "auto".
func TestBtrfsSubvolumeRoot(t *testing.T) {
	sv := btrfsSubvolume(t)
	conf := func(backend string) string { return oneTree(backend, sv) }
	for _, backend := range []string{"auto", "inotify", "fanotify"} {
		t.Run(backend, func(t *testing.T) {
			// backend = "fanotify": refused or served; either is
			// fine if said clearly.
			d := runDaemon(t, conf(backend), daemonOpts{mayExit: backend == "fanotify"})
			if d.exited() {
				code, out := d.exitCode(), d.log.String()
				if code != cli.ExitUsage || !strings.Contains(out, sv) || !strings.Contains(out, `set backend = \"auto\"`) {
					t.Errorf("backend = \"fanotify\" on a subvolume root: exit %d, want %d, an error naming %s and suggesting auto:\n%s", code, cli.ExitUsage, sv, out)
				}
				t.Logf("refused: exit %d", code)
				return
			}
			if backend == "fanotify" {
				t.Logf("served by fanotify")
			}
			f := filepath.Join(sv, "f-"+backend)
			writeDirty(t, f, 64<<10)
			waitAllClean(t, 3*time.Second, f)
			d.stop(t)
		})
	}
}

// TestBtrfsSubvolumeRootDeleted: a tree whose root is a btrfs subvolume,
// deleted with a dirty file tracked in it (no event tells the watcher, no
// mount changes): the tree is found gone by the periodic check of the
// roots (rescan_interval), its file dropped, and the shutdown neither
// waits for it nor says its data cannot reach the disk.
func TestBtrfsSubvolumeRootDeleted(t *testing.T) {
	t.Parallel()
	sv := btrfsSubvolume(t)
	d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
shutdown_timeout = "20s"
[watcher]
backend = "inotify"
rescan_interval = "1s"
[[watch]]
path = %q
expire = "1h"
`, sv))
	f := filepath.Join(sv, "f")
	writeDirty(t, f, 1<<20)
	if !poll(5*time.Second, func() bool { return strings.Contains(dirtyList(t, d), f) }) {
		t.Fatalf("%s is not tracked:\n%s", f, dirtyList(t, d))
	}
	if out, err := exec.Command("btrfs", "subvolume", "delete", sv).CombinedOutput(); err != nil {
		t.Fatalf("btrfs subvolume delete: %v\n%s", err, out)
	}
	if !poll(5*time.Second, func() bool { return strings.Contains(d.log.String(), "a watched tree's root is gone") }) {
		t.Fatalf("the deleted subvolume's tree is not found gone within 5 s (rescan_interval 1s):\n%s", d.log.String())
	}
	if l := dirtyList(t, d); l != "" {
		t.Errorf("files of the deleted subvolume still tracked:\n%s", l)
	}
	from := len(d.log.String())
	if took := d.term(t, 30*time.Second); took > 10*time.Second {
		t.Errorf("shutdown took %s", took)
	}
	if log := d.log.String()[from:]; !strings.Contains(log, "every tracked file is clean") {
		t.Errorf("the shutdown did not end clean:\n%s", log)
	}
}

// TestRootMadeAgain: a tree's root removed and made again at once, with
// the same st_dev and inode number (ext4 gives a freed number to the next
// directory; a btrfs subvolume made again gets the deleted one's st_dev
// and root inode), is found gone, not taken for the root it watched:
// inotify's watches went with the old directory, and the new one's files
// would go untracked while status showed the tree served.
func TestRootMadeAgain(t *testing.T) {
	t.Parallel()
	needBtrfs(t)
	for _, c := range []struct{ fs, backend string }{{"ext4", "inotify"}, {"ext4", "fanotify"}, {"btrfs", "auto"}} {
		t.Run(c.fs+"/"+c.backend, func(t *testing.T) {
			t.Parallel()
			mnt := testfs.Mount(t, testfs.Options{Type: c.fs})
			root := filepath.Join(mnt.Dir, "t")
			remake := func() {
				if err := os.RemoveAll(root); err != nil {
					t.Fatal(err)
				}
				if err := os.Mkdir(root, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if c.fs == "btrfs" {
				makeSubvolume(t, root)
				remake = func() {
					for _, op := range []string{"delete", "create"} {
						if out, err := exec.Command("btrfs", "subvolume", op, root).CombinedOutput(); err != nil {
							t.Fatalf("btrfs subvolume %s: %v\n%s", op, err, out)
						}
					}
				}
			} else if err := os.Mkdir(root, 0o755); err != nil {
				t.Fatal(err)
			}
			d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
[watcher]
backend = %q
rescan_interval = "1s"
[[watch]]
path = %q
expire = "1h"
`, c.backend, root))
			var before unix.Stat_t
			if err := unix.Stat(root, &before); err != nil {
				t.Fatal(err)
			}
			remake()
			var after unix.Stat_t
			if err := unix.Stat(root, &after); err != nil {
				t.Fatal(err)
			}
			if after.Dev != before.Dev || after.Ino != before.Ino {
				t.Fatalf("precondition: the root made again is (%d, %d), was (%d, %d): want the same key", after.Dev, after.Ino, before.Dev, before.Ino)
			}
			if !poll(5*time.Second, func() bool { return strings.Contains(d.log.String(), "a watched tree's root is gone") }) {
				t.Fatalf("the root made again is not found gone within 5 s (rescan_interval 1s):\n%s", d.log.String())
			}
			var out, errb bytes.Buffer
			if code := Main([]string{"status", "--stats-dir", d.statsDir}, &out, &errb); code != 0 || !strings.Contains(out.String(), strconv.Quote(root)+" (gone)") {
				t.Errorf("status: exit %d, want the tree shown gone:\n%s%s", code, out.String(), errb.String())
			}
		})
	}
}

// TestOverlayRefused: a tree on overlayfs cannot be served (an overlay
// file's dirty pages belong to its upper layer's inode, which cachestat and
// sync_file_range on the overlay's descriptor do not see), so it is refused
// with the reason by check-config and at start (exit 2), instead of being
// watched and never written back.
func TestOverlayRefused(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mount overlay")
	}
	base := t.TempDir()
	lower, upper, work, merged := filepath.Join(base, "lower"), filepath.Join(base, "upper"), filepath.Join(base, "work"), filepath.Join(base, "merged")
	mkdirs(t, lower, upper, work, merged)
	testfs.HoldMounts(t)
	if out, err := exec.Command("mount", "-t", "overlay", "overlay", "-o",
		"lowerdir="+lower+",upperdir="+upper+",workdir="+work, merged).CombinedOutput(); err != nil {
		testfs.Missing(t, "mount -t overlay: %v %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", merged).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", merged, err, out)
		}
	})
	conf := fmt.Sprintf("[[watch]]\npath = %q\n", merged)
	cfg := filepath.Join(base, "flusherd.toml")
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	check := func(what string, code int, out string) {
		t.Helper()
		if code != cli.ExitUsage || !strings.Contains(out, "is on overlayfs") || !strings.Contains(out, "upperdir") {
			t.Errorf("flusherd %s: exit %d, %s; want exit %d naming overlayfs and the upper layer", what, code, out, cli.ExitUsage)
		}
	}
	code, out := runAs(t, nil, "check-config", cfg)
	check("check-config", code, out)
	d := runDaemon(t, conf, daemonOpts{mayExit: true})
	if !d.exited() {
		t.Fatalf("flusherd run started on an overlayfs tree:\n%s", d.log.String())
	}
	check("run", d.exitCode(), d.log.String())
}

// oneTree is a daemon configuration with the tree root, the watch backend,
// an expiry of 1 s and an interval of 500 ms.
func oneTree(backend, root string) string {
	return fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "500ms"
dirty_expire_interval = "1s"
[watcher]
backend = %q
[[watch]]
path = %q
`, backend, root)
}

// needBtrfs skips t in the fast lane or without root, and fails or skips
// it (testfs.Missing) without btrfs-progs.
func needBtrfs(t *testing.T) {
	t.Helper()
	testfs.SkipShort(t, "the daemon on loop-mounted btrfs")
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop mounts")
	}
	if _, err := exec.LookPath("btrfs"); err != nil {
		testfs.Missing(t, "btrfs (btrfs-progs) not found: %v", err)
	}
}

// btrfsSubvolume mounts a btrfs (needBtrfs) and returns the path of a
// subvolume made at its top, sv.
func btrfsSubvolume(t *testing.T) string {
	t.Helper()
	needBtrfs(t)
	sv := filepath.Join(testfs.Mount(t, testfs.Options{Type: "btrfs"}).Dir, "sv")
	makeSubvolume(t, sv)
	return sv
}

// makeSubvolume makes a btrfs subvolume at path and deletes it at cleanup.
func makeSubvolume(t *testing.T, path string) {
	t.Helper()
	if out, err := exec.Command("btrfs", "subvolume", "create", path).CombinedOutput(); err != nil {
		t.Fatalf("btrfs subvolume create: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("btrfs", "subvolume", "delete", path).Run() })
}

// twoTrees is a daemon configuration with two trees, a and b, the watch
// backend, an expiry of 1 s and an interval of 500 ms.
func twoTrees(backend, a, b string) string {
	return oneTree(backend, a) + fmt.Sprintf("[[watch]]\npath = %q\n", b)
}

// bindMount mounts src on dst (MS_BIND) and unmounts it at cleanup.
func bindMount(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount %s on %s: %v", src, dst, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dst, 0); err != nil && err != unix.EINVAL { // EINVAL: the test unmounted it
			t.Errorf("umount %s: %v", dst, err)
		}
	})
}

// TestMountsInsideTree: filesystems mounted inside a tree, before the
// daemon starts and while it runs, are served (each is marked by fanotify,
// or its directories watched by inotify, and scanned); a tmpfs inside a
// tree is logged as having nothing to write back; a tree whose root is a
// bind mount of a directory is served like any other. Before, fanotify
// saw the writes of neither mount and inotify not those of the later one:
// they waited for the kernel's own writeback. Both backends.
func TestMountsInsideTree(t *testing.T) {
	testfs.SkipShort(t, "the daemon across nested loop mounts, each backend")
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop mounts")
	}
	for _, backend := range []string{"fanotify", "inotify"} {
		t.Run(backend, func(t *testing.T) {
			_, tree := mountTree(t, "ext4")
			early := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64})
			late := testfs.Mount(t, testfs.Options{Type: "xfs"})
			host := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64})
			if err := os.Mkdir(filepath.Join(host.Dir, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			bound := filepath.Join(t.TempDir(), "bound")
			bindMount(t, filepath.Join(host.Dir, "sub"), bound)
			bindMount(t, early.Dir, filepath.Join(tree, "early"))
			shm := filepath.Join(tree, "shm")
			if err := os.Mkdir(shm, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := unix.Mount("tmpfs", shm, "tmpfs", 0, "size=1m"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Unmount(shm, 0) })
			d := startDaemon(t, twoTrees(backend, tree, bound))
			files := []string{filepath.Join(tree, "top"), filepath.Join(tree, "early", "e1"), filepath.Join(bound, "b1")}
			for _, p := range files {
				writeDirty(t, p, 64<<10)
			}
			waitAllClean(t, 3*time.Second, files...)
			bindMount(t, late.Dir, filepath.Join(tree, "late"))
			// Cleanups run last first: the daemon, which may hold
			// the mount's directory open for opens by handle, ends
			// before the mount is undone.
			t.Cleanup(func() { d.halt() })
			// The mount table change is seen at once; the file is
			// written 300 ms later, as an operator's would be.
			time.Sleep(300 * time.Millisecond)
			lateFile := filepath.Join(tree, "late", "l1")
			writeDirty(t, lateFile, 64<<10)
			waitAllClean(t, 3*time.Second, lateFile)
			st := statsWhen(t, filepath.Join(d.statsDir, "watch", "stats"), 3*time.Second, func(st map[string]int64) bool {
				return st["nested_mounts"] == 2 && st["unserved_mounts"] == 0
			})
			if st["nested_mounts"] != 2 || st["unserved_mounts"] != 0 {
				t.Errorf("watch/stats: nested_mounts %d, unserved_mounts %d, want 2 and 0", st["nested_mounts"], st["unserved_mounts"])
			}
			log := d.log.String()
			for _, want := range []string{`"mountpoint": "` + filepath.Join(tree, "late") + `"`, `a filesystem without writeback is mounted inside a tree`} {
				if !strings.Contains(log, want) {
					t.Errorf("log lacks %q:\n%s", want, log)
				}
			}
			// A sync of a file on the tmpfs is refused with the reason,
			// and makes no device for the tmpfs.
			shmFile := filepath.Join(shm, "t")
			if err := os.WriteFile(shmFile, []byte("hi"), 0o644); err != nil {
				t.Fatal(err)
			}
			if code, out := runSync(t, d, shmFile); code != cli.ExitUsage || !strings.Contains(out, "on tmpfs, a filesystem without writeback") {
				t.Errorf("sync %s: exit %d, %q; want exit 2 (refused) and the tmpfs named", shmFile, code, out)
			}
			var shmSt unix.Stat_t
			if err := unix.Stat(shm, &shmSt); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(d.statsDir, "bdi", fmt.Sprintf("%d:%d", unix.Major(shmSt.Dev), unix.Minor(shmSt.Dev)))); err == nil {
				t.Errorf("a device was made for the tmpfs by the sync of a file on it")
			}

			// The early filesystem unmounted altogether while a file on
			// it is tracked: the file is forgotten (the unmount wrote
			// it), not retried with ENODEV forever.
			e2 := filepath.Join(tree, "early", "e2")
			writeDirty(t, e2, 64<<10)
			if err := early.Unmount(); err != nil {
				t.Fatal(err)
			}
			if err := testfs.UnmountRetry(filepath.Join(tree, "early")); err != nil {
				t.Fatal(err)
			}
			if !poll(3*time.Second, func() bool {
				return strings.Contains(d.log.String(), "was unmounted") && !strings.Contains(dirtyList(t, d), "e2")
			}) {
				t.Errorf("e2, on a filesystem unmounted, is still listed:\n%s\nlog:\n%s", dirtyList(t, d), d.log.String())
			}
			// Mounted again (a new superblock, the same ext4 UUID and
			// so the same fsid, which fanotify must mark again) under
			// another name: served.
			again := filepath.Join(tree, "again")
			mkdirs(t, again)
			if out, err := exec.Command("mount", "-o", "loop", early.Image, again).CombinedOutput(); err != nil {
				t.Fatalf("mount -o loop %s: %v\n%s", early.Image, err, out)
			}
			t.Cleanup(func() { unix.Unmount(again, 0) }) // after the daemon (registered later, runs first)
			t.Cleanup(func() { d.halt() })
			time.Sleep(300 * time.Millisecond)
			e3 := filepath.Join(again, "e3")
			writeDirty(t, e3, 64<<10)
			waitAllClean(t, 3*time.Second, e3)
		})
	}
}

// TestCheckConfigNoWriteback: a tree on tmpfs is accepted, with a note
// that nothing there is ever written back.
func TestCheckConfigNoWriteback(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a tmpfs")
	}
	dir := filepath.Join(t.TempDir(), "shm")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, 0) })
	cfg := filepath.Join(t.TempDir(), "f.toml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("[[watch]]\npath = %q\n", dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out := runAs(t, nil, "check-config", cfg)
	if code != 0 {
		t.Fatalf("check-config: exit %d\n%s", code, out)
	}
	if want := fmt.Sprintf("note: %q is on tmpfs, a filesystem without writeback", dir); !strings.Contains(out, want) {
		t.Errorf("check-config output lacks %q:\n%s", want, out)
	}
}

// TestBackendPerFilesystem: with backend = "auto", an ext4 tree and a FUSE
// tree (which refuses fanotify marks) are served at once, the ext4 one by
// fanotify and the FUSE one by inotify, and both are written back within
// the bound; watch/stats says "fanotify+inotify" and the log names the
// tree that went to inotify. Before, the FUSE tree moved every tree to
// inotify. With backend = "fanotify", the daemon refuses to start and
// names the tree.
func TestBackendPerFilesystem(t *testing.T) {
	testfs.SkipShort(t, "the daemon on ext4, FUSE and tmpfs at once")
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop mounts, FUSE, fanotify")
	}
	_, ext := mountTree(t, "ext4")
	ffs := faultfs.MountT(t)
	conf := func(backend string) string { return twoTrees(backend, ext, ffs.Dir) }
	d := startDaemon(t, conf("auto"))
	a := filepath.Join(ext, "a")
	writeDirty(t, a, 64<<10)
	b := writeHeld(t, filepath.Join(ffs.Dir, "b"), 64<<10)
	waitAllClean(t, 3*time.Second, a)
	if !poll(3*time.Second, func() bool { n, err := fdDirty(b); return err == nil && n == 0 }) {
		t.Fatalf("the FUSE tree's file was not written back; log:\n%s", d.log.String())
	}
	log := d.log.String()
	for _, want := range []string{"watch backend: fanotify+inotify (auto: per filesystem)", `"fanotify_trees": 1, "inotify_trees": 1`,
		`this tree's filesystem refuses fanotify; it is served by inotify	{"root": "` + ffs.Dir + `"`} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	stats, err := os.ReadFile(filepath.Join(d.statsDir, "watch", "stats"))
	if err != nil || !strings.Contains(string(stats), "fanotify+inotify") {
		t.Errorf("watch/stats does not say fanotify+inotify: %v\n%s", err, stats)
	}
	checkTreeLines(t, d, map[string]string{ext: "fanotify", ffs.Dir: "inotify"})
	d.stop(t)

	// Started on the ext4 tree alone (fanotify), then a reload adds the
	// FUSE tree: it is served by inotify.
	d = startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "500ms"
dirty_expire_interval = "1s"
[[watch]]
path = %q
`, ext))
	d.reload(t, conf("auto"))
	if !poll(5*time.Second, func() bool { return strings.Contains(d.log.String(), "configuration reloaded") }) {
		t.Fatalf("the reload did not complete; log:\n%s", d.log.String())
	}
	c := writeHeld(t, filepath.Join(ffs.Dir, "c"), 64<<10)
	if !poll(3*time.Second, func() bool { n, err := fdDirty(c); return err == nil && n == 0 }) {
		t.Fatalf("the FUSE tree added by a reload was not served; log:\n%s", d.log.String())
	}
	if log := d.log.String(); !strings.Contains(log, "watch root added") || strings.Contains(log, "cannot watch a root added by the reload") {
		t.Errorf("the reload did not add the FUSE tree:\n%s", log)
	}
	checkTreeLines(t, d, map[string]string{ext: "fanotify", ffs.Dir: "inotify"})
	d.stop(t)

	d = runDaemon(t, conf("fanotify"), daemonOpts{mayExit: true})
	// The log's JSON escapes the quotes of the message.
	if out := d.log.String(); !d.exited() || d.exitCode() != cli.ExitUsage || !strings.Contains(out, ffs.Dir) || !strings.Contains(out, `set backend = \"auto\"`) {
		t.Errorf("backend = \"fanotify\" with a FUSE tree: exited %v, want exit %d and a refusal naming %s:\n%s", d.exited(), cli.ExitUsage, ffs.Dir, out)
	}
}

// checkTreeLines waits (3 s at most) until watch/stats has exactly one
// "tree:" line for each root of want, naming the backend want gives it.
func checkTreeLines(t *testing.T, d *flusherdProc, want map[string]string) {
	t.Helper()
	var got map[string]string
	var text []byte
	ok := poll(3*time.Second, func() bool {
		text, _ = os.ReadFile(filepath.Join(d.statsDir, "watch", "stats"))
		got = map[string]string{}
		for _, line := range strings.Split(string(text), "\n") {
			rest, isTree := strings.CutPrefix(line, "tree:")
			if !isTree {
				continue
			}
			backend, quoted, _ := strings.Cut(strings.TrimSpace(rest), " ")
			root, err := strconv.Unquote(quoted)
			if err != nil {
				t.Fatalf("watch/stats: tree line %q: %v", line, err)
			}
			got[root] = backend
		}
		return maps.Equal(got, want)
	})
	if !ok {
		t.Errorf("watch/stats trees = %v, want %v:\n%s", got, want, text)
	}
}

// TestFUSEMountedInsideFanotifyTree: with backend = "auto", a FUSE
// filesystem (which refuses fanotify marks) mounted inside an ext4 tree
// served by fanotify, after the start, is served by the inotify half: a
// file written there is clean within the bound, watch/stats lists the
// mount as an inotify tree, and its unmount forgets it without an error.
// Before, it was logged as not served and counted in unserved_mounts.
func TestFUSEMountedInsideFanotifyTree(t *testing.T) {
	testfs.SkipShort(t, "the daemon with FUSE inside a fanotify tree")
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop mounts, FUSE, fanotify")
	}
	if err := faultfs.Available(); err != nil {
		testfs.Missing(t, "%v", err)
	}
	_, ext := mountTree(t, "ext4")
	d := startDaemon(t, oneTree("auto", ext))
	mp := filepath.Join(ext, "fuse")
	mkdirs(t, mp)
	testfs.HoldMounts(t)
	ffs, err := faultfs.Mount(mp, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	mounted := true
	t.Cleanup(func() {
		if mounted {
			if err := ffs.Unmount(); err != nil {
				t.Error(err)
			}
		}
	})
	if !poll(5*time.Second, func() bool { return strings.Contains(d.log.String(), "it is served by inotify") }) {
		t.Fatalf("the FUSE mount was not handed to inotify; log:\n%s", d.log.String())
	}
	// In a directory made after the hand-over (inotify watches it as it
	// comes), by a writer that keeps its file open: its own close would
	// flush it.
	mkdirs(t, filepath.Join(mp, "sub"))
	f := writeHeld(t, filepath.Join(mp, "sub", "f"), 64<<10)
	start := time.Now()
	if !poll(5*time.Second, func() bool { n, err := fdDirty(f); return err == nil && n == 0 }) {
		t.Fatalf("a file in the FUSE mount inside the tree was not written back; log:\n%s", d.log.String())
	}
	took := time.Since(start)
	t.Logf("FUSE file inside the fanotify tree clean after %s", took.Round(10*time.Millisecond))
	if bound := time.Second + 500*time.Millisecond + time.Second; took > bound {
		t.Errorf("took %s, more than expire + interval + 1 s (%s)", took, bound)
	}
	checkTreeLines(t, d, map[string]string{ext: "fanotify", mp: "inotify"})
	st := statsWhen(t, filepath.Join(d.statsDir, "watch", "stats"), 3*time.Second, func(st map[string]int64) bool {
		return st["nested_mounts"] == 1 && st["unserved_mounts"] == 0
	})
	if st["nested_mounts"] != 1 || st["unserved_mounts"] != 0 {
		t.Errorf("nested_mounts %d, unserved_mounts %d, want 1 and 0", st["nested_mounts"], st["unserved_mounts"])
	}
	f.Close()
	if err := ffs.Unmount(); err != nil {
		t.Fatal(err)
	}
	mounted = false
	if !poll(5*time.Second, func() bool { return strings.Contains(d.log.String(), "was unmounted") }) {
		t.Errorf("the unmount was not noticed; log:\n%s", d.log.String())
	}
	if log := d.log.String(); strings.Contains(log, "root is gone") {
		t.Errorf("the handed-over mount's unmount was reported as a tree root gone:\n%s", log)
	}
	// The ext4 tree is still served.
	a := filepath.Join(ext, "a")
	writeDirty(t, a, 4096)
	waitAllClean(t, 3*time.Second, a)
}

// TestNestedBindUnmountedKeepsFiles: a bind mount of a filesystem inside a
// tree, unmounted while that filesystem stays mounted elsewhere, wrote
// nothing back (only the last unmount of a filesystem does): the file
// tracked there stays tracked, and `flusherd sync` writes it. Before, it
// was dropped with "the unmount wrote them back" and stayed dirty. Both
// backends; the expire is an hour, so only the sync writes it.
func TestNestedBindUnmountedKeepsFiles(t *testing.T) {
	t.Parallel()
	testfs.SkipShort(t, "the daemon across a bind mount unmounted, each backend")
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop mounts")
	}
	for _, backend := range []string{"fanotify", "inotify"} {
		t.Run(backend, func(t *testing.T) {
			_, tree := mountTree(t, "ext4")
			other := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64})
			bound := filepath.Join(tree, "bound")
			bindMount(t, other.Dir, bound)
			d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
dirty_expire_interval = "1h"
[watcher]
backend = %q
[[watch]]
path = %q
`, backend, tree))
			t.Cleanup(func() { d.halt() }) // before the mounts are undone
			time.Sleep(300 * time.Millisecond)
			f := filepath.Join(bound, "f")
			writeDirty(t, f, 64<<10)
			if !poll(5*time.Second, func() bool { return strings.Contains(dirtyList(t, d), f) }) {
				t.Fatalf("%s is not tracked:\n%s", f, dirtyList(t, d))
			}
			if err := testfs.UnmountRetry(bound); err != nil {
				t.Fatal(err)
			}
			if !poll(5*time.Second, func() bool { return strings.Contains(d.log.String(), "it is still mounted elsewhere") }) {
				t.Fatalf("the unmount of the bind mount was not logged as such:\n%s", d.log.String())
			}
			if code, out := runSync(t, d); code != 0 || !strings.Contains(out, "1 file written back") {
				t.Errorf("flusherd sync: exit %d, %q; want 1 file written back", code, out)
			}
			waitAllClean(t, 3*time.Second, filepath.Join(other.Dir, "f"))
		})
	}
}

// TestSameFilesystemBindInTree: a bind mount inside a tree of a directory
// of the tree's own filesystem, from outside the tree, is served: with
// fanotify (auto) by inotify, as fanotify names an event's file through
// the filesystem's first mount, where its path is outside the tree (the
// write was ignored, and sync and the shutdown called the tree clean);
// with backend = "fanotify" it is logged as not served.
func TestSameFilesystemBindInTree(t *testing.T) {
	t.Parallel()
	testfs.SkipShort(t, "the daemon across bind mounts, three backends")
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop mounts")
	}
	for _, backend := range []string{"auto", "inotify", "fanotify"} {
		t.Run(backend, func(t *testing.T) {
			mnt, tree := mountTree(t, "ext4")
			src := filepath.Join(mnt.Dir, "real", "sub")
			mkdirs(t, src)
			bound := filepath.Join(tree, "bsub")
			bindMount(t, src, bound)
			d := startDaemon(t, oneTree(backend, tree))
			t.Cleanup(func() { d.halt() }) // before the mounts are undone
			f := filepath.Join(bound, "f2")
			if backend == "fanotify" {
				if !poll(5*time.Second, func() bool {
					return strings.Contains(d.log.String(), "fanotify names this mount's files through another mount of its filesystem")
				}) {
					t.Fatalf("the bind mount is not logged as not served:\n%s", d.log.String())
				}
				return
			}
			time.Sleep(300 * time.Millisecond)
			writeDirty(t, f, 64<<10)
			waitAllClean(t, 5*time.Second, f)
		})
	}
}

// TestTreesThroughTwoMounts: two trees on one filesystem, one reached
// through a bind mount of it, the second inside the first's directory:
// under backend = "auto" the second is served by inotify, and its
// integrity expire of 1 s holds for a file written through it, which
// fanotify had named through the first mount and tracked under the first
// tree's hour (a sync of its root wrote nothing).
func TestTreesThroughTwoMounts(t *testing.T) {
	t.Parallel()
	testfs.SkipShort(t, "the daemon until a file expires through a bind mount")
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop mounts")
	}
	mnt, _ := mountTree(t, "ext4")
	mkdirs(t, filepath.Join(mnt.Dir, "a", "sub"))
	bind := filepath.Join(t.TempDir(), "bind")
	bindMount(t, mnt.Dir, bind)
	d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
[watcher]
backend = "auto"
[[watch]]
path = %q
expire = "1h"
[[watch]]
path = %q
expire = "1s"
mode = "integrity"
`, filepath.Join(mnt.Dir, "a"), filepath.Join(bind, "a", "sub")))
	t.Cleanup(func() { d.halt() }) // before the mounts are undone
	if !strings.Contains(d.log.String(), "fanotify serves through another mount") {
		t.Errorf("the second tree is not logged as served by inotify:\n%s", d.log.String())
	}
	f := filepath.Join(bind, "a", "sub", "f")
	writeDirty(t, f, 64<<10)
	waitAllClean(t, 4*time.Second, f)
}

// TestNoWritebackTrees: trees on filesystems that never write back (a
// proc, a sysfs, a tmpfs of their own) and a tmpfs mounted inside an ext4
// tree: none of their files is opened or tracked, so that the shutdown
// waits for none of them and says every tracked file is clean; the ext4
// tree's file is written back as usual.
func TestNoWritebackTrees(t *testing.T) {
	t.Parallel()
	testfs.SkipShort(t, "the daemon on proc, sysfs, tmpfs and ext4 mounts")
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts proc, sysfs and tmpfs")
	}
	_, ext := mountTree(t, "ext4")
	base := t.TempDir()
	mountOwn := func(name, fstype, data string) string {
		dir := filepath.Join(base, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(fstype, dir, fstype, 0, data); err != nil {
			t.Fatalf("mount %s on %s: %v", fstype, dir, err)
		}
		t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
		return dir
	}
	proc := mountOwn("proc", "proc", "")
	sys := mountOwn("sys", "sysfs", "")
	shm := mountOwn("shm", "tmpfs", "size=4m")
	nested := filepath.Join(ext, "nested")
	if err := os.Mkdir(nested, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", nested, "tmpfs", 0, "size=4m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(nested, unix.MNT_DETACH) })
	writeDirty(t, filepath.Join(shm, "before"), 8192)
	writeDirty(t, filepath.Join(nested, "before"), 8192)
	for _, backend := range []string{"auto", "inotify"} {
		t.Run(backend, func(t *testing.T) {
			// A file tracked stays on b_dirty for an hour, except in
			// the ext4 tree: what the list shows is what was tracked.
			var conf strings.Builder
			fmt.Fprintf(&conf, "[writeback]\ndirty_writeback_interval = \"200ms\"\ndirty_expire_interval = \"1h\"\nshutdown_timeout = \"20s\"\n[watcher]\nbackend = %q\n", backend)
			for _, root := range []string{proc, sys, shm} {
				fmt.Fprintf(&conf, "[[watch]]\npath = %q\n", root)
			}
			fmt.Fprintf(&conf, "[[watch]]\npath = %q\nexpire = \"500ms\"\n", ext)
			d := startDaemon(t, conf.String())
			a := filepath.Join(ext, "a")
			writeDirty(t, a, 64<<10)
			writeDirty(t, filepath.Join(shm, "after-"+backend), 8192)
			writeDirty(t, filepath.Join(nested, "after-"+backend), 8192)
			waitAllClean(t, 5*time.Second, a)
			settleEvents()
			for _, f := range dirtyFiles(t, d) {
				if p := string(f.Path); !strings.HasPrefix(p, ext+"/") || strings.HasPrefix(p, nested+"/") {
					t.Errorf("a file tracked on a filesystem without writeback: %q (%s)", p, f.List)
				}
			}
			d.stop(t)
			log := d.log.String()
			if !strings.Contains(log, "every tracked file is clean; exiting") {
				t.Errorf("the shutdown did not end clean:\n%s", log)
			}
			for _, root := range []string{proc, sys, shm} {
				if !strings.Contains(log, "this tree is on a filesystem without writeback") || !strings.Contains(log, root) {
					t.Errorf("no warning for the tree %s:\n%s", root, log)
				}
			}
		})
	}
}
