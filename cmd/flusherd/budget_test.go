package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/internal/testfs"
)

// inotifyInstances counts the inotify instances open in the processes of
// uid 0 (the budget fs.inotify.max_user_instances bounds).
func inotifyInstances(t *testing.T) int {
	t.Helper()
	n := 0
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		var st unix.Stat_t
		if unix.Stat(p, &st) != nil || st.Uid != 0 {
			continue
		}
		fds, _ := filepath.Glob(p + "/fd/*")
		for _, fd := range fds {
			if l, err := os.Readlink(fd); err == nil && l == "anon_inode:inotify" {
				n++
			}
		}
	}
	return n
}

// useUpInotify sets fs.inotify.max_user_instances so that no new inotify
// instance can be made by root, and restores it at cleanup.
func useUpInotify(t *testing.T) {
	t.Helper()
	const sysctl = "/proc/sys/fs/inotify/max_user_instances"
	old, err := os.ReadFile(sysctl)
	if err != nil {
		testfs.Missing(t, "%s: %v", sysctl, err)
	}
	t.Cleanup(func() { os.WriteFile(sysctl, old, 0o644) })
	for range 5 {
		if err := os.WriteFile(sysctl, []byte(strconv.Itoa(inotifyInstances(t))), 0o644); err != nil {
			testfs.Missing(t, "cannot set %s: %v", sysctl, err)
		}
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
		if err != nil {
			return // used up
		}
		unix.Close(fd)
	}
	t.Fatalf("could not use up %s: other processes keep changing their inotify instances", sysctl)
}

// TestInotifyBudgetUsedUp: with fs.inotify.max_user_instances used up by
// other processes, backend "auto" still serves an ext4 tree with fanotify
// (warning that what fanotify cannot serve is not), and backend "inotify"
// refuses to start with an error that names the sysctl.
func TestInotifyBudgetUsedUp(t *testing.T) {
	testfs.SkipShort(t, "changes fs.inotify.max_user_instances; the daemon on loop-mounted ext4")
	if os.Geteuid() != 0 {
		t.Skip("needs root (fanotify, the sysctl)")
	}
	// The sysctl is the machine's: no other test binary may make an
	// inotify instance meanwhile (they hold the lock shared: testfs.Mount,
	// runDaemon, watch's backends).
	testfs.ExcludeMounts(t)
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64})
	useUpInotify(t)
	d := runDaemon(t, fmt.Sprintf("[writeback]\ndirty_writeback_interval = \"200ms\"\n[[watch]]\npath = %q\nexpire = \"500ms\"\n", mnt.Dir), daemonOpts{})
	if !strings.Contains(d.log.String(), "fs.inotify.max_user_instances") || !strings.Contains(d.log.String(), "watch backend: fanotify") {
		t.Errorf("auto with no inotify instance left: want fanotify and a warning naming the sysctl:\n%s", d.log.String())
	}
	p := filepath.Join(mnt.Dir, "f")
	writeDirty(t, p, 64<<10)
	waitClean(t, p, 10*time.Second)
	d.stop(t)

	r := runDaemon(t, fmt.Sprintf("[watcher]\nbackend = \"inotify\"\n[[watch]]\npath = %q\n", mnt.Dir), daemonOpts{mayExit: true})
	if !r.exited() || r.exitCode() == 0 || !strings.Contains(r.log.String(), "sysctl fs.inotify.max_user_instances=N") {
		t.Errorf("backend inotify with no instance left: want a refusal naming the sysctl:\n%s", r.log.String())
	}
}
