package bdi

import (
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"flusherd/inode"
	"flusherd/policy"
	"flusherd/tree"
)

// sweepConfig is testConfig with a 500 ms kupdate period and the sweep at
// half each tree's expire.
func sweepConfig() Config {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = 500 * time.Millisecond
	cfg.SweepInterval = policy.SweepAuto
	return cfg
}

// closesOf is the Closes of a report that carries a close or none.
func closesOf(closed bool) int {
	if closed {
		return 1
	}
	return 0
}

func (h *harness) opened(f *fakeFile, expire time.Duration, open, closed bool) {
	h.wb.Opened([]Open{{Path: f.path, Key: f.key, Tree: tree.Tree{Root: "/", Expire: expire}, Open: open, Closes: closesOf(closed)}})
}

// TestSweepFindsMappedWrites: a file open in a tree (a candidate) whose
// pages are dirtied with no event (a shared mapping) is found by the sweep
// (every expire/2 = 1 s), tracked from the time found, and written back
// within expire + sweep interval + the kupdate period of its dirtying; it
// is found again after its writeback when dirtied again, counted each
// time, and logged the first time only. Once closed it is no longer
// looked at.
func TestSweepFindsMappedWrites(t *testing.T) {
	const expire = 2 * time.Second
	core, logs := observer.New(zapcore.DebugLevel)
	withWB(t, sweepConfig(), func(h *harness) {
		t := h.t
		f := h.fs.add("/m", 1, 16*pg, 0)
		openedAt := h.now()
		h.opened(f, expire, true, false)
		if n := h.wb.Snapshot().SweepCandidates; n != 1 {
			t.Fatalf("sweep_candidates = %d after the open, want 1", n)
		}
		time.Sleep(300 * time.Millisecond)
		f.redirty(0) // through the mapping: no report
		dirtied := h.now()
		time.Sleep(900 * time.Millisecond) // past the first sweep (1 s)
		synctest.Wait()
		in := h.inode("/m")
		if in == nil {
			t.Fatalf("a dirty candidate is not tracked 1.2 s after its open (sweep every 1 s)")
		}
		if in.DirtiedWhen != openedAt {
			t.Errorf("dirtiedWhen %v, want when it was last known clean (its open, %v), not after its dirtying (%v) nor at the look (1 s)",
				in.DirtiedWhen, openedAt, dirtied)
		}
		if s := h.wb.Snapshot(); s.SweepFound != 1 || s.BdiReclaimable != 1 {
			t.Errorf("sweep_found %d, BdiReclaimable %d pages; want 1, 1", s.SweepFound, s.BdiReclaimable)
		}
		bound := dirtied + expire + time.Second + 500*time.Millisecond
		time.Sleep(bound - h.now() + 10*time.Millisecond)
		synctest.Wait()
		w := h.fs.callsOf("sync_file_range", "/m")
		if len(w) == 0 {
			t.Fatalf("not written back by %v (dirtied at %v; bound expire + sweep + interval)", bound, dirtied)
		}
		if w[0].at < in.DirtiedWhen+expire {
			t.Errorf("written at %v, before its expiry (%v)", w[0].at, in.DirtiedWhen+expire)
		}
		// Dirtied again after its writeback: found again, dirtied no
		// earlier than when it was last known clean, after that
		// writeback, and no later than its dirtying.
		redirtied := h.now()
		f.redirty(1)
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		if s := h.wb.Snapshot(); s.SweepFound != 2 {
			t.Errorf("sweep_found %d after a second dirtying, want 2", s.SweepFound)
		}
		if in := h.inode("/m"); in == nil || in.DirtiedWhen < w[0].at || in.DirtiedWhen > redirtied {
			t.Errorf("after the second dirtying (at %v, its writeback at %v): inode %+v, want dirtiedWhen between them", redirtied, w[0].at, in)
		}
		if n := logs.FilterMessageSnippet("found by the sweep").Len(); n != 1 {
			t.Errorf("%d debug lines for the file found, want 1 (the first time)", n)
		}
		// Closed: no longer a candidate, nor looked at.
		time.Sleep(4 * time.Second)
		synctest.Wait()
		h.opened(f, expire, false, true)
		if n := h.wb.Snapshot().SweepCandidates; n != 0 {
			t.Errorf("sweep_candidates = %d after the close, want 0", n)
		}
		opens := len(h.fs.callsOf("open", "/m"))
		f.redirty(2)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if n := len(h.fs.callsOf("open", "/m")); n != opens {
			t.Errorf("a closed file was opened %d times more", n-opens)
		}
	}, func(h *harness) { h.wb.log = zap.New(core) })
}

// TestSweepSkipsTracked: a candidate tracked already (its writes were
// reported) is not opened by the sweep; a deleted one is let go; with the
// sweep off, opens are not kept.
func TestSweepSkipsTracked(t *testing.T) {
	withWB(t, sweepConfig(), func(h *harness) {
		t := h.t
		f := h.fs.add("/w", 1, pg, 1)
		h.mark(f, time.Hour)
		h.opened(f, 2*time.Second, true, false)
		opens := h.afterSample("/w")
		time.Sleep(5 * time.Second) // five sweeps
		synctest.Wait()
		if n := len(h.fs.callsOf("open", "/w")); n != opens {
			t.Errorf("a tracked candidate was opened %d times by the sweep", n-opens)
		}
		g := h.fs.add("/gone", 2, pg, 0)
		h.opened(g, 2*time.Second, true, false)
		h.fs.remove("/gone")
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		if n := h.wb.Snapshot().SweepCandidates; n != 1 {
			t.Errorf("sweep_candidates = %d after a candidate was deleted, want 1 (/w)", n)
		}
	})
	cfg := sweepConfig()
	cfg.SweepInterval = 0
	withWB(t, cfg, func(h *harness) {
		f := h.fs.add("/m", 1, pg, 0)
		h.opened(f, 2*time.Second, true, false)
		f.redirty(0)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if s := h.wb.Snapshot(); s.SweepCandidates != 0 || len(h.fs.callsOf("open", "/m")) != 0 {
			t.Errorf("sweep off: %d candidates, %d opens; want none", s.SweepCandidates, len(h.fs.callsOf("open", "/m")))
		}
	})
}

// TestOpenedCounts: a file stays a candidate until its opens are all
// closed; a merged open and close leaves the count as it is.
func TestOpenedCounts(t *testing.T) {
	withWB(t, sweepConfig(), func(h *harness) {
		t := h.t
		f := h.fs.add("/m", 1, pg, 0)
		for i, c := range []struct {
			open, closed bool
			want         int
		}{
			{true, false, 1}, {true, false, 1}, {true, true, 1}, {false, true, 1}, {false, true, 0}, {false, true, 0}, {true, true, 0},
		} {
			h.opened(f, time.Second, c.open, c.closed)
			if n := h.wb.Snapshot().SweepCandidates; n != c.want {
				t.Errorf("report %d (open %v, closed %v): %d candidates, want %d", i, c.open, c.closed, n, c.want)
			}
		}
	})
}

// TestRegistryInodesOpened: an open makes its device (a close alone does
// not), each run of one device's reports reaches that device, and a
// removed or gone tree's candidates are let go with it (RetireUnder keeps
// those another tree holds; DropUnder none).
func TestRegistryInodesOpened(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.SweepInterval = policy.SweepAuto
		r, _, _ := newTestRegistry(t, cfg, map[uint64]string{10: "8:0", 11: "8:16"})
		tr := tree.Tree{Root: "/a", Expire: time.Second}
		open := func(dev, ino uint64, path string, o, c bool) Open {
			return Open{Path: path, Key: inode.Key{Dev: dev, Ino: ino}, Tree: tr, Open: o, Closes: closesOf(c)}
		}
		r.InodesOpened([]Open{open(11, 1, "/b/x", false, true)})
		if len(r.Devices()) != 0 {
			t.Fatalf("a close alone made a device: %v", r.Devices())
		}
		r.InodesOpened([]Open{open(10, 1, "/a/f", true, false), open(10, 2, "/a/keep/g", true, false),
			open(10, 3, "/a/h", true, false), open(11, 1, "/b/x", true, false)})
		a, b := r.known(10), r.known(11)
		if a == nil || b == nil || a.Candidates() != 3 || b.Candidates() != 1 {
			t.Fatalf("devices %v; want 3 candidates on 8:0 and 1 on 8:16", r.Devices())
		}
		r.InodesOpened([]Open{open(10, 3, "/a/h", false, true)})
		if n := a.Candidates(); n != 2 {
			t.Errorf("%d candidates after a close, want 2", n)
		}
		r.TreeRemoved("/a", func(p string) bool { return p == "/a/keep/g" })
		if n := a.Candidates(); n != 1 {
			t.Errorf("%d candidates after the tree's removal, want 1 (held by another tree)", n)
		}
		a.DropUnder("/a")
		if n := a.Candidates(); n != 0 {
			t.Errorf("%d candidates after the tree was dropped, want 0", n)
		}
		if n := b.Candidates(); n != 1 {
			t.Errorf("another device's candidates: %d, want 1", n)
		}
	})
}

// TestOpenedLinger: a report that asks to linger (inotify's, whose count
// may be low) keeps a candidate whose count falls to 0 until a sweep finds
// it clean: one found dirty is tracked and stays a candidate; one found
// clean is let go. Without Linger the close lets it go at once.
func TestOpenedLinger(t *testing.T) {
	const expire = 2 * time.Second
	withWB(t, sweepConfig(), func(h *harness) {
		t := h.t
		f := h.fs.add("/m", 1, pg, 0)
		linger := func(open, closed bool) {
			h.wb.Opened([]Open{{Path: f.path, Key: f.key, Tree: tree.Tree{Root: "/", Expire: expire}, Open: open, Closes: closesOf(closed), Linger: true}})
		}
		linger(true, false)
		linger(false, true) // its count 0: the merged open of another writer may be missing
		if n := h.wb.Snapshot().SweepCandidates; n != 1 {
			t.Fatalf("sweep_candidates = %d after a lingering close, want 1", n)
		}
		f.redirty(0) // through a mapping: no report
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		if h.inode("/m") == nil {
			t.Fatalf("a lingering candidate dirtied is not tracked after its sweep")
		}
		if n := h.wb.Snapshot().SweepCandidates; n != 1 {
			t.Errorf("sweep_candidates = %d after it was found dirty, want 1", n)
		}
		time.Sleep(6 * time.Second) // written back, then looked at clean
		synctest.Wait()
		if n := h.wb.Snapshot().SweepCandidates; n != 0 {
			t.Errorf("sweep_candidates = %d once found clean, want 0", n)
		}
		g := h.fs.add("/n", 2, pg, 0)
		h.opened(g, expire, true, false)
		h.opened(g, expire, false, true)
		if n := h.wb.Snapshot().SweepCandidates; n != 0 {
			t.Errorf("sweep_candidates = %d after a close without Linger, want 0", n)
		}
	})
}

// TestSweepCandidateReloaded: a candidate opened under a tree with a 20 s
// expire (a sweep every 10 s), whose tree a reload makes an integrity tree
// with a 1 s expire (RestrictUnder), is looked at on the new tree's
// interval, and data dirtied through its mapping after the reload is
// found and made durable (fdatasync) within the new expire + sweep +
// kupdate period, not on the old tree's schedule with sync_file_range.
func TestSweepCandidateReloaded(t *testing.T) {
	withWB(t, sweepConfig(), func(h *harness) {
		t := h.t
		f := h.fs.add("/m", 1, 16*pg, 0)
		h.opened(f, 20*time.Second, true, false)
		time.Sleep(time.Second)
		newTree := tree.Tree{Root: "/", Expire: time.Second, Mode: tree.ModeIntegrity}
		h.wb.RestrictUnder("/", newTree, func(string) bool { return true })
		f.redirty(0) // through the mapping: no report
		dirtied := h.now()
		bound := dirtied + time.Second + 500*time.Millisecond + 500*time.Millisecond
		time.Sleep(bound - h.now() + 10*time.Millisecond)
		synctest.Wait()
		if w := h.fs.callsOf("fdatasync", "/m"); len(w) == 0 {
			t.Errorf("not made durable by %v (dirtied at %v; the reloaded tree: integrity, 1 s expire); sync_file_range calls: %d",
				bound, dirtied, len(h.fs.callsOf("sync_file_range", "/m")))
		}
		if w := h.fs.callsOf("sync_file_range", "/m"); len(w) > 0 {
			t.Errorf("written with sync_file_range at %v: the tree before the reload", w[0].at)
		}
	})
}
