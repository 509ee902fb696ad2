package bdi

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/inode"
	"flusherd/internal/testfs"
	"flusherd/tree"
)

// dirtyOf sums cachestat's dirty pages of the files at paths.
func dirtyOf(t *testing.T, paths []string) uint64 {
	t.Helper()
	var sum uint64
	for _, p := range paths {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		var cs unix.Cachestat_t
		err = unix.Cachestat(uint(fd), &unix.CachestatRange{}, &cs, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		sum += cs.Dirty
	}
	return sum
}

// within10 reports whether got is within 10 % of want.
func within10(got, want uint64) bool {
	d := int64(got) - int64(want)
	return max(d, -d)*10 <= int64(want)
}

// TestRealDirtyBeforeFirstAttempt: on ext4, a file of 8 MiB written and
// marked dirty in a tree whose expiry is a minute away counts in
// BdiReclaimable, within 10 % of a cachestat of it, within a second of
// the mark: the background check counts it, long before its first
// attempt (none is made).
func TestRealDirtyBeforeFirstAttempt(t *testing.T) {
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 256})
	wb, ch := realWB(t, realConfig())
	p := filepath.Join(mnt.Dir, "f")
	key, w := dirtyFile(t, p, 8<<20)
	if d, _ := pagesOf(t, w); d*4096 < 7<<20 {
		t.Fatalf("precondition: %d dirty pages right after writing 8 MiB", d)
	}
	start := time.Now()
	wb.MarkInodeDirty(key, p, "", tree.Tree{Expire: time.Minute})
	var got, want uint64
	for time.Since(start) < time.Second {
		got, want = wb.Snapshot().BdiReclaimable, dirtyOf(t, []string{p})
		if within10(got, want) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !within10(got, want) {
		t.Fatalf("BdiReclaimable %d pages a second after the mark, cachestat %d: want within 10 %%", got, want)
	}
	t.Logf("counted within %v: %d pages, cachestat %d", time.Since(start).Round(time.Millisecond), got, want)
	if in := inodeOf(wb, key); in == nil || in.Retries != 0 {
		t.Errorf("%+v: want tracked, not attempted", in)
	}
	select {
	case tr := <-ch:
		t.Errorf("an attempt before the expiry: %+v", tr)
	default:
	}
}

// TestRealDirtyBurst: on ext4, a burst of 4,000 files of 12 KiB (more than
// one background check samples) counts in BdiReclaimable, within 10 % of
// a cachestat of the files, from a second after the burst ends: with no
// background threshold (the files wait for their expiry, a minute away)
// and with one of 8 MiB, under which background writeback brings them.
func TestRealDirtyBurst(t *testing.T) {
	for _, bg := range []int64{0, 8 << 20} {
		t.Run(fmt.Sprintf("background_bytes=%d", bg), func(t *testing.T) {
			mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 256})
			cfg := realConfig()
			cfg.DirtyWritebackInterval = 5 * time.Second
			cfg.DirtyBackgroundBytes = bg
			wb, _ := realWB(t, cfg)
			const n = 4000
			data := make([]byte, 12<<10)
			paths := make([]string, n)
			for i := range paths {
				p := filepath.Join(mnt.Dir, fmt.Sprintf("d%02d", i%40), fmt.Sprint(i))
				if i < 40 {
					if err := os.Mkdir(filepath.Dir(p), 0o755); err != nil {
						t.Fatal(err)
					}
				}
				if err := os.WriteFile(p, data, 0o644); err != nil {
					t.Fatal(err)
				}
				key, _, err := inode.Stat(p)
				if err != nil {
					t.Fatal(err)
				}
				wb.MarkInodeDirty(key, p, "", tree.Tree{Expire: time.Minute})
				paths[i] = p
			}
			// The two are read one after the other, and background
			// writeback may be under way between them: they are read
			// again until they agree, for 3 s at most.
			time.Sleep(time.Second)
			start := time.Now()
			got, want := wb.Snapshot().BdiReclaimable, dirtyOf(t, paths)
			for !within10(got, want) && time.Since(start) < 3*time.Second {
				time.Sleep(100 * time.Millisecond)
				got, want = wb.Snapshot().BdiReclaimable, dirtyOf(t, paths)
			}
			if !within10(got, want) {
				t.Errorf("1 to 4 s after the burst: BdiReclaimable %d pages, cachestat %d: want within 10 %%", got, want)
			}
			if bg == 0 && want < n*3*9/10 {
				t.Errorf("precondition: %d pages dirty of %d written (the kernel's flusher wrote them?)", want, n*3)
			}
			if s := wb.Snapshot(); bg > 0 && s.BackgroundWorks == 0 {
				t.Errorf("background_works 0 over the threshold")
			}
			t.Logf("BdiReclaimable %d pages, cachestat %d", got, want)
		})
	}
}

// TestRealIntegrityCopy: on ext4, a copy of 400 files of 12 KiB into an
// integrity tree (plug.integrity_syncfs 64, max_pending 256, the
// defaults) is written back with a handful of syncfs calls, the batches'
// and their filesystem error checks, not one per file found clean by an
// earlier batch's syncfs; and BdiWritten grows by the 4,800 KiB copied,
// within 10 %: the files the batch syncfs wrote count once.
func TestRealIntegrityCopy(t *testing.T) {
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 256})
	errs := NewErrWatch()
	defer errs.Close()
	if _, err := errs.Add(mnt.Dir); err != nil {
		t.Fatal(err)
	}
	op := &syncOpener{}
	cfg := realConfig()
	cfg.IntegritySyncfs, cfg.MaxPending, cfg.QueueDepth = 64, 256, 8
	epoch := time.Now()
	wb := New("test", cfg, func() time.Duration { return time.Since(epoch) }, Files{Opener: op}, nil, nil)
	wb.errs = errs
	ctx, cancel := context.WithCancel(context.Background())
	go wb.Run(ctx)
	defer func() { cancel(); <-wb.Stopped() }()
	const n, size = 400, 12 << 10
	data := make([]byte, size)
	integrity := tree.Tree{Expire: time.Second, Mode: tree.ModeIntegrity}
	for i := range n {
		p := filepath.Join(mnt.Dir, fmt.Sprint(i))
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		key, _, err := inode.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		wb.MarkInodeDirty(key, p, "", integrity)
	}
	deadline := time.Now().Add(20 * time.Second)
	for wb.Tracked() != 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if left := wb.Tracked(); left != 0 {
		t.Fatalf("%d files still tracked after 20 s", left)
	}
	s := wb.Snapshot()
	written, want := s.BdiWritten*4, uint64(n*size>>10)
	if !within10(written, want) {
		t.Errorf("BdiWritten grew by %d kB for %d kB copied: want within 10 %%", written, want)
	}
	batch, checks := op.syncfses.Load(), errs.Checks()
	// A handful, not one per file (400): an error check is made once per
	// batch in which the kernel wrote a file before flusherd, which it
	// does more often while the machine has much dirty data (9 checks
	// in a CI run with the other packages' tests beside it).
	if batch+int64(checks) > 16 {
		t.Errorf("%d batch syncfs and %d error checks (syncfs) for %d files, want a handful (at most 16)", batch, checks, n)
	}
	if len(wb.Failed()) != 0 || s.WritebackErrors != 0 {
		t.Errorf("failed %v, writeback_errors %d; want none", wb.Failed(), s.WritebackErrors)
	}
	t.Logf("BdiWritten %d kB, %d batch syncfs, %d error checks, %d fdatasync", written, batch, checks, op.datasyncs.Load())
}

// TestRealIntegrityOthersSync: an integrity file that another program's
// syncfs wrote back before flusherd's attempt does not count in
// BdiWritten: the attempt found it clean, and the error check's syncfs it
// then made began after that look. Its last known dirty pages counted as
// that syncfs's.
func TestRealIntegrityOthersSync(t *testing.T) {
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64})
	errs := NewErrWatch()
	defer errs.Close()
	if _, err := errs.Add(mnt.Dir); err != nil {
		t.Fatal(err)
	}
	epoch := time.Now()
	wb := New("test", realConfig(), func() time.Duration { return time.Since(epoch) }, Files{Opener: &syncOpener{}}, nil, nil)
	wb.errs = errs
	ctx, cancel := context.WithCancel(context.Background())
	go wb.Run(ctx)
	defer func() { cancel(); <-wb.Stopped() }()
	p := filepath.Join(mnt.Dir, "f")
	if err := os.WriteFile(p, make([]byte, 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	key, _, err := inode.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	wb.MarkInodeDirty(key, p, "", tree.Tree{Expire: 2 * time.Second, Mode: tree.ModeIntegrity})
	deadline := time.Now().Add(time.Second)
	for wb.Snapshot().BdiReclaimable == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if wb.Snapshot().BdiReclaimable == 0 {
		t.Fatal("precondition: the file's dirty pages were not counted")
	}
	fd, err := unix.Open(mnt.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.Syncfs(fd) // another program's sync
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for wb.Tracked() != 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if wb.Tracked() != 0 {
		t.Fatal("the file is still tracked after 10 s")
	}
	if s := wb.Snapshot(); s.BdiWritten != 0 {
		t.Errorf("BdiWritten %d pages for a file another program's syncfs wrote, want 0", s.BdiWritten)
	}
}
