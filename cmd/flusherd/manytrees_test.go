package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"flusherd/internal/testfs"
)

// manyTrees is the number of [[watch]] trees of TestManyTreesChurn: a
// cost that grows with the square of it takes minutes.
const manyTrees = 3000

// TestManyTreesChurn: with 3,000 trees on one filesystem, the daemon
// starts (its initial scan done) within runDaemon's 30 s, with either
// backend; and 2,000 directories made and removed on that filesystem
// outside every tree (fanotify's filesystem mark reports each) do not
// delay the files written in the trees after them: each is clean within
// the expiry, the writeback interval and a loaded machine's slack.
func TestManyTreesChurn(t *testing.T) {
	testfs.SkipShort(t, "3,000 trees and 2,000 directories made and removed on loop-mounted ext4")
	for _, backend := range []string{"fanotify", "inotify"} {
		t.Run(backend, func(t *testing.T) { manyTreesChurn(t, backend) })
	}
}

// manyTreesConfig mounts an ext4 filesystem with manyTrees directories
// and one outside them, and returns the configuration that watches each
// as a tree with backend (expire 1 s, interval 200 ms), the roots, and
// the directory outside.
func manyTreesConfig(t *testing.T, backend string) (cfg string, roots []string, outside string) {
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4"})
	var b strings.Builder
	fmt.Fprintf(&b, "[watcher]\nbackend = %q\n[writeback]\ndirty_writeback_interval = \"200ms\"\ndirty_expire_interval = \"1s\"\n", backend)
	roots = make([]string, manyTrees)
	for i := range roots {
		roots[i] = filepath.Join(mnt.Dir, "trees", fmt.Sprintf("t%04d", i))
		if err := os.MkdirAll(roots[i], 0o755); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "[[watch]]\npath = %q\n", roots[i])
	}
	outside = filepath.Join(mnt.Dir, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	return b.String(), roots, outside
}

func manyTreesChurn(t *testing.T, backend string) {
	const bound = 4 * time.Second // expire 1 s + interval 200 ms + slack
	if k := kernelDirtyExpire(t); k < 4*bound {
		testfs.Missing(t, "vm.dirty_expire_centisecs is %v: the kernel's flusher would clean the files within the %v bound", k, bound)
	}
	cfg, roots, outside := manyTreesConfig(t, backend)
	d := startDaemon(t, cfg)
	for i := range 2000 {
		p := filepath.Join(outside, "d"+strconv.Itoa(i))
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	var files []string
	for i := 0; i < manyTrees; i += manyTrees / 10 {
		p := filepath.Join(roots[i], "f")
		writeDirty(t, p, 64<<10)
		files = append(files, p)
	}
	mustBeDirty(t, files[0])
	waitAllClean(t, bound, files...)
	d.stop(t)
}

// TestManyTreesTermAtStart: a SIGTERM sent while the daemon starts with
// 3,000 trees (fanotify, as auto picks as root) is served within 15 s:
// the daemon exits.
func TestManyTreesTermAtStart(t *testing.T) {
	testfs.SkipShort(t, "3,000 trees on loop-mounted ext4")
	cfg, _, _ := manyTreesConfig(t, "fanotify")
	d := runDaemon(t, cfg, daemonOpts{readyLine: "watching\t"})
	d.term(t, 15*time.Second)
}
