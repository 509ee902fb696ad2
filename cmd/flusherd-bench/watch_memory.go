package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// Per file: a 4 KiB data block and page, an inode (up to 512 bytes on
// xfs), a directory entry; per 1,000 files a directory.
const (
	diskPerFile = 4096 + 512 + 64
	// Page cache and slab while the files are dirty, plus the loop image's
	// own page cache once they are written to it.
	memPerFile = 2*4096 + 2048
)

// fitInodes returns the largest count up to n, in thousands, whose
// filesystem fits the free disk under dir and the available memory, and
// why it is smaller if it is.
func fitInodes(dir string, n int) (int, string) {
	var st unix.Statfs_t
	why := ""
	if unix.Statfs(dir, &st) == nil {
		free := int64(st.Bavail) * st.Bsize
		if m := int((free*8/10 - 1<<30) / diskPerFile); m < n {
			n, why = m, "free disk"
		}
	}
	if avail := int64(meminfoKB().available) << 10; avail > 0 {
		if m := int((avail*8/10 - 2<<30) / memPerFile); m < n {
			n, why = m, "available memory"
		}
	}
	return max(n/1000*1000, 0), why
}

// memory is the memory phase for want files (fewer if they do not fit):
// the daemon's RSS on an empty tree, then once it tracks them.
func (r *watchRun) memory(ctx context.Context, backend string, want int) error {
	n, label, ok := r.memoryCount(want)
	if !ok {
		return nil
	}
	dir, err := os.MkdirTemp(r.base, fmt.Sprintf("mem-%s-%d-", backend, n))
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sizeMB := int64(n)*diskPerFile*5/4>>20 + 1024
	l, err := newBenchLoop(dir, r.o.fstype, sizeMB, n+n/1000+4096)
	if err != nil {
		return err
	}
	// Clean-up: SIGKILL the daemon (SIGTERM would make it write every
	// file back first), then syncfs and unmount. The loop device is
	// buffered and the ext4 journal issues no flushes (barrier=0), so the
	// written-back data stays in the image file's page cache and is
	// dropped with the image; finally drop the caches for the next run.
	defer func() {
		t := time.Now()
		syncfs(l.Dir)
		closeFS(l, "watch")
		os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200)
		r.progress("%s: N=%d: clean-up took %v", backend, n, time.Since(t).Round(time.Millisecond))
	}()
	root := filepath.Join(l.Dir, "tree")
	if err := os.Mkdir(root, 0o755); err != nil {
		return err
	}
	d, statsDir, err := r.startWatchDaemon(filepath.Join(dir, "daemon"), backend, root)
	if err != nil {
		return err
	}
	defer d.kill()
	if err := sleepCtx(ctx, settle); err != nil {
		return err
	}
	m, err := r.track(ctx, backend, n, d, statsDir, root)
	if err != nil {
		return err
	}
	r.memoryRows(backend, label, n, m, countOverflowLines(d.logText()))
	d.kill()
	return nil
}

// memoryCount is the file count of the memory phase for want (fitInodes)
// and its label; false if it is too small to run, with a note.
func (r *watchRun) memoryCount(want int) (int, string, bool) {
	n, why := fitInodes(r.base, want)
	label := thousands(uint64(want))
	if n < want {
		if n < 1000 {
			r.notes = append(r.notes, fmt.Sprintf("memory N=%s not run (%s)", label, why))
			return 0, "", false
		}
		r.notes = append(r.notes, fmt.Sprintf("memory N=%s: %s files used instead (%s)", label, thousands(uint64(n)), why))
		label = fmt.Sprintf("%s (asked %s)", thousands(uint64(n)), label)
	}
	return n, label, true
}

// memTrack is what the memory phase measured.
type memTrack struct {
	base, rss, hwm uint64 // kB
	got            uint64 // files tracked
	tTracked       time.Duration
	cpu            float64 // daemon CPU seconds while tracking
	st0, st1       watchStats
	hasEv          bool
	ovLog0         int // the daemon's overflow log lines before
}

// track reads the daemon's baseline RSS, creates n dirty files under root
// and reads its RSS once it tracks them.
func (r *watchRun) track(ctx context.Context, backend string, n int, d *daemon, statsDir, root string) (memTrack, error) {
	var m memTrack
	pid := d.cmd.Process.Pid
	m.base = procStatusKB(pid).rss
	m.st0, _ = readWatchStats(statsDir)
	m.ovLog0 = countOverflowLines(d.logText())
	cpu0, t0 := d.cpu(), time.Now()
	r.progress("%s: memory: baseline RSS %d kB; creating %d dirty files", backend, m.base, n)
	created := make(chan error, 1)
	go func() { created <- createTree(ctx, root, n, 1) }()
	got, grew, err := r.waitTracked(ctx, backend, n, statsDir, created, t0)
	if err != nil {
		return m, err
	}
	m.got, m.tTracked = got, time.Since(t0)
	if got == uint64(n) {
		// The count is there once the last event is handled; the loop
		// above exits with the stats file, at most a second later.
		m.tTracked = grew.Sub(t0)
	}
	mem := procStatusKB(pid)
	m.rss, m.hwm = mem.rss, mem.hwm
	m.cpu = (d.cpu() - cpu0).Seconds()
	m.st1, m.hasEv = readWatchStats(statsDir)
	r.progress("%s: memory: %d tracked in %v, RSS %d kB", backend, got, m.tTracked.Round(time.Millisecond), m.rss)
	return m, nil
}

// waitTracked waits for the daemon to track all n files, or for its count
// to stop growing for 10 s once the files exist (created says so); it
// returns the count and when it last grew.
func (r *watchRun) waitTracked(ctx context.Context, backend string, n int, statsDir string, created <-chan error, t0 time.Time) (uint64, time.Time, error) {
	var got uint64
	grew := time.Now()
	createDone := false
	for got < uint64(n) {
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			if !createDone {
				<-created
			}
			return 0, grew, err
		}
		if !createDone {
			select {
			case err := <-created:
				if err != nil {
					return 0, grew, err
				}
				createDone = true
				grew = time.Now()
				r.progress("%s: memory: %d files created in %v", backend, n, time.Since(t0).Round(time.Millisecond))
			default:
			}
		}
		if c, _ := tracked(statsDir); c > got {
			got, grew = c, time.Now()
		}
		if createDone && time.Since(grew) >= 10*time.Second {
			break
		}
	}
	return got, grew, nil
}

// memTargetPerInode is the most RSS per tracked file, in bytes, at
// 1,000,000 files.
const memTargetPerInode = 150

// memoryRows records the memory phase's rows; ovLog is the daemon's
// overflow log lines now.
func (r *watchRun) memoryRows(backend, label string, n int, m memTrack, ovLog int) {
	name := func(s string) string { return fmt.Sprintf("memory N=%s: %s", label, s) }
	r.t.set(2, name("files tracked (time until the stats file showed them)"), "", backend, fmt.Sprintf("%s (%.1f s)", thousands(m.got), m.tTracked.Seconds()))
	r.t.set(2, name("RSS baseline -> tracked (peak)"), "", backend, fmt.Sprintf("%s -> %s (%s)", mib(m.base), mib(m.rss), mib(m.hwm)))
	// The target is for 1,000,000 tracked files.
	// Below it, fixed costs (the runtime, caches of up to 65,536
	// entries) weigh on each inode: the cell says so.
	target, perInode := "none below 1M (fixed costs dominate)", "n/a"
	if n >= 1000000 {
		target = fmt.Sprintf("≤ %d at 1M", memTargetPerInode)
	}
	if m.got > 0 {
		per := float64(int64(m.rss)-int64(m.base)) * 1024 / float64(m.got)
		perInode = fmt.Sprintf("%.0f", per)
		if n >= 1000000 {
			perInode += " " + metIf(per <= memTargetPerInode)
		}
	}
	r.t.set(2, name("bytes RSS per tracked inode"), target, backend, perInode)
	r.t.set(2, name("daemon CPU while tracking"), "", backend, fmt.Sprintf("%.2f s", m.cpu))
	r.t.set(2, name("queue overflows / rescans"), "", backend, overflowCell(m.st0, m.st1, m.hasEv, ovLog-m.ovLog0))
}
