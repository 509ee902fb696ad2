package bdi

import (
	"slices"
	"strings"
	"time"

	"flusherd/inode"
)

// TreeFigures are a device's figures for one watched tree: its tracked
// files, those whose directory is at or below Root and below no deeper
// root of the trees asked for (a nested tree's files are its own).
type TreeFigures struct {
	Root string
	// Tracked counts the files on a writeback list or failed.
	Tracked int
	// DirtyPages and WritebackPages are the files' cachestat(2) counts
	// as last seen (the same counts as BdiReclaimable and BdiWriteback).
	DirtyPages, WritebackPages uint64
	// Dirty counts the files with dirty data (inode.Dirty), and
	// OldestDirtied is the oldest one's dirtiedWhen (daemon clock;
	// meaningless when Dirty is 0).
	Dirty         int
	OldestDirtied time.Duration
	// Blocked counts the files on b_more_io_wait, Failed those whose
	// data was lost (flusherd dirty's "failed").
	Blocked, Failed int
}

// treeOf returns the index in roots of the tree an inode in directory dir
// belongs to: the deepest root at or above dir, -1 for none. cache holds
// the answers by directory.
func treeOf(dir string, roots []string, cache map[string]int) int {
	if i, ok := cache[dir]; ok {
		return i
	}
	best := -1
	for i, r := range roots {
		if (dir == r || r == "/" || strings.HasPrefix(dir, r+"/")) && (best < 0 || len(r) > len(roots[best])) {
			best = i
		}
	}
	cache[dir] = best
	return best
}

// Trees returns the device's figures for each of roots (absolute,
// cleaned), in their order; a file under none of them counts in none.
func (wb *Writeback) Trees(roots []string) []TreeFigures {
	out := make([]TreeFigures, len(roots))
	for i, r := range roots {
		out[i].Root = r
	}
	cache := map[string]int{}
	wb.mu.Lock()
	defer wb.mu.Unlock()
	add := func(in *inode.Inode, blocked, failed bool) {
		i := treeOf(in.Dir(), roots, cache)
		if i < 0 {
			return
		}
		f := &out[i]
		f.Tracked++
		f.DirtyPages += uint64(in.DirtyPages)
		f.WritebackPages += uint64(in.WritebackPages)
		if in.Has(inode.Dirty) {
			if f.Dirty == 0 || in.DirtiedWhen < f.OldestDirtied {
				f.OldestDirtied = in.DirtiedWhen
			}
			f.Dirty++
		}
		if blocked {
			f.Blocked++
		}
		if failed {
			f.Failed++
		}
	}
	for _, c := range wb.bDirty.classes {
		for in := range c.list.All {
			add(in, false, false)
		}
	}
	for in := range wb.BIO.All {
		add(in, false, false)
	}
	for in := range wb.inflight.All {
		add(in, false, false)
	}
	for in := range wb.BMoreIO.All {
		add(in, false, false)
	}
	for in := range wb.BMoreIOWait.All {
		add(in, true, false)
	}
	for in := range wb.bFailed.All {
		add(in, false, true)
	}
	return out
}

// treeCounters are a tree's counters on a device: the pages flusherd
// wrote of its files, their failed attempts, and their exposure.
type treeCounters struct {
	written, errors uint64
	exposure        exposure
}

// treeAcct is a device's counters per tree, by root: the roots of the
// trees its files were reported from, each file counted in the deepest
// root at or above it. The list lock guards it.
type treeAcct struct {
	roots []string
	by    []*treeCounters // parallel to roots
	dirs  map[string]int  // treeOf's answers by directory
}

// maxTreeDirs bounds treeAcct's cache of directories.
const maxTreeDirs = 1 << 14

// see records root, a tree its files are reported from.
func (a *treeAcct) see(root string) {
	if root == "" || slices.Contains(a.roots, root) {
		return
	}
	a.roots = append(a.roots, root)
	a.by = append(a.by, &treeCounters{})
	clear(a.dirs) // a new root may be deeper
}

// of returns the counters of in's tree, nil for none.
func (a *treeAcct) of(in *inode.Inode) *treeCounters {
	if a.dirs == nil || len(a.dirs) > maxTreeDirs {
		a.dirs = map[string]int{}
	}
	if i := treeOf(in.Dir(), a.roots, a.dirs); i >= 0 {
		return a.by[i]
	}
	return nil
}

// wroteLocked counts pages of in written back by flusherd: BdiWritten, and
// its tree's. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) wroteLocked(in *inode.Inode, pages uint64) {
	wb.acct.written += pages
	if t := wb.trees.of(in); t != nil {
		t.written += pages
	}
}

// attemptFailedLocked counts a failed attempt of in: the device's
// writeback errors, and its tree's. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) attemptFailedLocked(in *inode.Inode) {
	wb.acct.errors++
	if t := wb.trees.of(in); t != nil {
		t.errors++
	}
}

// TreeCounters are a tree's counters on a device.
type TreeCounters struct {
	Root            string
	Written, Errors uint64 // pages; failed attempts
	Exposure        Exposure
}

// TreeCounters returns the device's counters of each tree it has seen, at
// now (daemon clock).
func (wb *Writeback) TreeCounters() []TreeCounters {
	now := wb.now()
	wb.mu.Lock()
	defer wb.mu.Unlock()
	out := make([]TreeCounters, len(wb.trees.roots))
	for i, r := range wb.trees.roots {
		t := wb.trees.by[i]
		out[i] = TreeCounters{Root: r, Written: t.written, Errors: t.errors, Exposure: t.exposure.figures(now)}
	}
	return out
}
