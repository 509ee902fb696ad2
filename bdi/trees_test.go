package bdi

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"flusherd/inode"
	"flusherd/tree"
)

// TestTrees: a device's figures per tree: each tracked file counts in the
// deepest of the roots at or above its directory (a nested tree's files
// are its own), in none when no root holds it; tracked, dirty, the page
// counts as last seen, the oldest dirtiedWhen, blocked and failed.
func TestTrees(t *testing.T) {
	wb, _, now := newIdleWB(t, testConfig())
	mark := func(ino uint64, path string, at time.Duration) *inode.Inode {
		*now = at
		wb.MarkInodeDirty(inode.Key{Dev: 7, Ino: ino}, path, "", tree.Tree{Expire: time.Hour})
		wb.mu.Lock()
		defer wb.mu.Unlock()
		return wb.inodes.Get(inode.Key{Dev: 7, Ino: ino})
	}
	a := mark(1, "/srv/a/1", 5*time.Second)
	mark(2, "/srv/2", 3*time.Second)
	b := mark(3, "/srv/a/b/3", 4*time.Second)
	mark(4, "/srvx/4", 1*time.Second) // not below /srv
	mark(5, "/other/5", 2*time.Second)
	wb.mu.Lock()
	wb.setPagesLocked(a, 10, 2)
	wb.setPagesLocked(b, 7, 0)
	wb.requeueIOWaitLocked(b)
	wb.mu.Unlock()

	got := wb.Trees([]string{"/srv", "/srv/a/b", "/srvx", "/none"})
	want := []TreeFigures{
		{Root: "/srv", Tracked: 2, Dirty: 2, DirtyPages: 10, WritebackPages: 2, OldestDirtied: 3 * time.Second},
		{Root: "/srv/a/b", Tracked: 1, Dirty: 1, DirtyPages: 7, OldestDirtied: 4 * time.Second, Blocked: 1},
		{Root: "/srvx", Tracked: 1, Dirty: 1, OldestDirtied: 1 * time.Second},
		{Root: "/none"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Trees (-want +got):\n%s", diff)
	}
	if got := wb.Trees([]string{"/"}); got[0].Tracked != 5 || got[0].OldestDirtied != time.Second {
		t.Errorf("the root tree: %+v, want all 5 files, oldest at 1s", got[0])
	}
}

// TestTreeCounters: the pages flusherd writes and the failed attempts count
// in the tree the file was reported from, and its exposure (from
// dirtiedWhen to the attempt that began writing it, once per dirtying) is
// observed; a file of no tree counts in none.
func TestTreeCounters(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	withWB(t, cfg, func(h *harness) {
		a := h.fs.add("/srv/a", 1, 8*pg, 8)
		b := h.fs.add("/srv/sub/b", 2, 4*pg, 4)
		h.wb.MarkInodeDirty(a.key, a.path, "", tree.Tree{Root: "/srv", Expire: 3 * time.Second})
		time.Sleep(time.Second)
		h.wb.MarkInodeDirty(b.key, b.path, "", tree.Tree{Root: "/srv/sub", Expire: 3 * time.Second})
		time.Sleep(10 * time.Second)
		synctest.Wait()
		tt := h.wb.TreeTotals([]string{"/srv", "/srv/sub", "/other"})
		sa, sb := tt[0], tt[1]
		if sa.Written != 8 || sb.Written != 4 || sa.Errors != 0 || tt[2].Written != 0 {
			t.Errorf("written /srv %d, /srv/sub %d, /other %d pages, errors %d; want 8, 4, 0, 0", sa.Written, sb.Written, tt[2].Written, sa.Errors)
		}
		ea, eb := sa.Exposure(h.now()), sb.Exposure(h.now())
		if ea.Count != 1 || eb.Count != 1 || ea.RecentCount != 1 {
			t.Fatalf("exposure counts %+v %+v, want one each", ea, eb)
		}
		// Expired at 3 s, written by the kupdate pass after (1 s
		// interval): between 3 and 4 s dirty.
		if e := ea.MaxRecent; e < 3 || e > 4.01 {
			t.Errorf("exposure of /srv/a: %.3fs, want 3-4s", e)
		}
		// Two devices' totals of one tree add up.
		sum := sa
		sum.add(&sa)
		if e := sum.Exposure(h.now()); sum.Written != 16 || e.Count != 2 || e.RecentCount != 2 || e.MaxRecent != ea.MaxRecent {
			t.Errorf("the sum of two: written %d, exposure %+v", sum.Written, e)
		}
	})
}

// TestExposureFigures: the histogram's cumulative buckets, and the last ten
// minutes' quantiles (the bound of the quantile's bucket, at most the
// largest) and largest; older minutes drop out.
func TestExposureFigures(t *testing.T) {
	var e exposure
	at := time.Hour
	e.observe(500*time.Second, at-20*time.Minute) // out of the window later
	for i := range 100 {
		d := 2 * time.Second // p50 bucket: 2 s
		if i >= 98 {
			d = 40 * time.Second // p99 bucket: 45 s, at most the max 40 s
		}
		e.observe(d, at)
	}
	f := e.figures(at + time.Minute)
	if f.Count != 101 || f.RecentCount != 100 || f.P50 != 2 || f.P99 != 40 || f.MaxRecent != 40 {
		t.Errorf("figures %+v; want count 101, recent 100, p50 2, p99 40, max 40", f)
	}
	if f.Buckets[bucketOf(2*time.Second)] != 98 || f.Buckets[bucketOf(45*time.Second)] != 100 || f.Buckets[len(f.Buckets)-1] != 101 {
		t.Errorf("cumulative buckets %v: want 98 at the 2 s bound, 100 at 45 s, 101 at the last", f.Buckets)
	}
	if f := e.figures(at + 11*time.Minute); f.RecentCount != 0 || f.MaxRecent != 0 {
		t.Errorf("after ten minutes: %+v, want nothing recent", f)
	}
}

// BenchmarkTreeAcctOf measures the look-up of a written file's tree
// (treeAcct.of: on every page counted written, under the list lock), with
// 10, 1,000 and 10,000 roots seen and each file in a directory of its own
// below one of them, more directories than the cache holds: ns/op must
// not grow with the number of roots.
func BenchmarkTreeAcctOf(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("trees=%d", n), func(b *testing.B) {
			var a treeAcct
			for i := range n {
				a.see(fmt.Sprintf("/srv/t%05d", i))
			}
			ins := make([]*inode.Inode, 2*maxTreeDirs)
			for i := range ins {
				ins[i] = &inode.Inode{}
				ins[i].SetPath(fmt.Sprintf("/srv/t%05d/d%d/f", i%n, i))
			}
			b.ResetTimer()
			i := 0
			for b.Loop() {
				if a.of(ins[i%len(ins)]) == nil {
					b.Fatal("a file below a root has no tree")
				}
				i++
			}
		})
	}
}
