package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"flusherd/internal/testfs"
)

// TestBtrfsSubvolume: a tree at the top of a btrfs filesystem that holds a
// subvolume (its own st_dev, not registered for opens by handle): a file
// written in the subvolume is written back within the bound, and SIGTERM
// does not wait for it. Both backends.
func TestBtrfsSubvolume(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop mounts")
	}
	if _, err := exec.LookPath("btrfs"); err != nil {
		testfs.Missing(t, "btrfs (btrfs-progs) not found: %v", err)
	}
	for _, backend := range []string{"fanotify", "inotify"} {
		t.Run(backend, func(t *testing.T) {
			mnt := testfs.Mount(t, testfs.Options{Type: "btrfs"})
			sv := filepath.Join(mnt.Dir, "sv")
			if out, err := exec.Command("btrfs", "subvolume", "create", sv).CombinedOutput(); err != nil {
				t.Fatalf("btrfs subvolume create: %v\n%s", err, out)
			}
			t.Cleanup(func() { exec.Command("btrfs", "subvolume", "delete", sv).Run() })
			d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "500ms"
dirty_expire_interval = "1s"
[watcher]
backend = %q
[[watch]]
path = %q
`, backend, mnt.Dir))
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

// TestOverlayRefused: a tree on overlayfs cannot be served (an overlay
// file's dirty pages belong to its upper layer's inode, which cachestat and
// sync_file_range on the overlay's descriptor do not see), so it is refused
// with the reason by check-config and at start (exit 2), instead of being
// watched and never written back.
func TestOverlayRefused(t *testing.T) {
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
	cfg := filepath.Join(base, "flusherd.toml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "[stats]\ndir = %q\n[[watch]]\npath = %q\n", filepath.Join(base, "run"), merged), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check-config", cfg}, {"run", "--config", cfg}} {
		out, err := exec.Command(binary, args...).CombinedOutput()
		code := -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if code != exitUsage || !strings.Contains(string(out), "is on overlayfs") || !strings.Contains(string(out), "upperdir") {
			t.Errorf("flusherd %s: exit %d, %s; want exit %d naming overlayfs and the upper layer", args[0], code, out, exitUsage)
		}
	}
}
