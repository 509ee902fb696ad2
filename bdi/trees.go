package bdi

import (
	"time"

	"flusherd/inode"
)

// TreeFigures are a device's figures for one watched tree: its tracked
// files, those whose directory is at or below Root and below no deeper
// root of the trees asked for (a nested tree's files are its own).
type TreeFigures struct {
	Root string
	// Tracked counts the files on a writeback list (as Stats.Tracked).
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

// treeOf returns the index of the tree an inode in directory dir belongs
// to: the deepest root at or above dir (index: the roots' indexes by
// root), -1 for none. cache holds the answers by directory. It walks up
// dir, O(depth), not O(roots).
func treeOf(dir string, index map[string]int, cache map[string]int) int {
	if i, ok := cache[dir]; ok {
		return i
	}
	best := -1
	if i, ok := index[dir]; ok {
		best = i
	}
	for j := len(dir) - 1; best < 0 && j > 0; j-- {
		if dir[j] == '/' {
			if i, ok := index[dir[:j]]; ok {
				best = i
			}
		}
	}
	if i, ok := index["/"]; ok && best < 0 {
		best = i
	}
	cache[dir] = best
	return best
}

// rootIndex returns roots' indexes by root (the first, for a root listed
// twice).
func rootIndex(roots []string) map[string]int {
	index := make(map[string]int, len(roots))
	for i, r := range roots {
		if _, ok := index[r]; !ok {
			index[r] = i
		}
	}
	return index
}

// Trees returns the device's figures for each of roots (absolute,
// cleaned), in their order; a file under none of them counts in none.
func (wb *Writeback) Trees(roots []string) []TreeFigures {
	out := make([]TreeFigures, len(roots))
	for i, r := range roots {
		out[i].Root = r
	}
	cache, index := map[string]int{}, rootIndex(roots)
	wb.mu.Lock()
	defer wb.mu.Unlock()
	add := func(in *inode.Inode, blocked, failed bool) {
		i := treeOf(in.Dir(), index, cache)
		if i < 0 {
			return
		}
		f := &out[i]
		if !failed {
			f.Tracked++
		}
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
	index map[string]int  // roots' indexes by root
	dirs  map[string]int  // treeOf's answers by directory
}

// maxTreeDirs bounds treeAcct's cache of directories.
const maxTreeDirs = 1 << 14

// see records root, a tree its files are reported from.
func (a *treeAcct) see(root string) {
	if _, ok := a.index[root]; ok || root == "" {
		return
	}
	if a.index == nil {
		a.index = map[string]int{}
	}
	a.index[root] = len(a.roots)
	a.roots = append(a.roots, root)
	a.by = append(a.by, &treeCounters{})
	clear(a.dirs) // a new root may be deeper
}

// of returns the counters of in's tree, nil for none.
func (a *treeAcct) of(in *inode.Inode) *treeCounters {
	if a.dirs == nil || len(a.dirs) > maxTreeDirs {
		a.dirs = map[string]int{}
	}
	if i := treeOf(in.Dir(), a.index, a.dirs); i >= 0 {
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

// TreeTotals are a tree's figures (TreeFigures) and counters: the pages
// flusherd wrote of its files, their failed attempts, and their exposure
// (see Exposure).
type TreeTotals struct {
	TreeFigures
	Written, Errors uint64
	exposure        exposure
}

// OldestAge is the age at now (daemon clock) of the tree's oldest dirty
// data, 0 when none is dirty.
func (t *TreeTotals) OldestAge(now time.Duration) time.Duration {
	if t.Dirty == 0 {
		return 0
	}
	return max(now-t.OldestDirtied, 0)
}

// Exposure returns the tree's exposure figures at now (daemon clock).
func (t *TreeTotals) Exposure(now time.Duration) Exposure { return t.exposure.figures(now) }

// add adds o's figures and counters to t (another device's of the same
// tree).
func (t *TreeTotals) add(o *TreeTotals) {
	if o.Dirty > 0 && (t.Dirty == 0 || o.OldestDirtied < t.OldestDirtied) {
		t.OldestDirtied = o.OldestDirtied
	}
	t.Tracked += o.Tracked
	t.Dirty += o.Dirty
	t.DirtyPages += o.DirtyPages
	t.WritebackPages += o.WritebackPages
	t.Blocked += o.Blocked
	t.Failed += o.Failed
	t.Written += o.Written
	t.Errors += o.Errors
	t.exposure.add(&o.exposure)
}

// TreeTotals returns the device's figures and counters of each of roots,
// in their order (Trees; the counters of the trees its files were reported
// from).
func (wb *Writeback) TreeTotals(roots []string) []TreeTotals {
	figs := wb.Trees(roots)
	out := make([]TreeTotals, len(roots))
	wb.mu.Lock()
	defer wb.mu.Unlock()
	for i, r := range roots {
		out[i].TreeFigures = figs[i]
		if j, ok := wb.trees.index[r]; ok {
			c := wb.trees.by[j]
			out[i].Written, out[i].Errors, out[i].exposure = c.written, c.errors, c.exposure
		}
	}
	return out
}

// TreeTotals returns each of roots' figures and counters over every
// device, in roots' order.
func (r *Registry) TreeTotals(roots []string) []TreeTotals {
	out := make([]TreeTotals, len(roots))
	for i, root := range roots {
		out[i].Root = root
	}
	for _, wb := range r.Devices() {
		for i, t := range wb.TreeTotals(roots) {
			out[i].add(&t)
		}
	}
	return out
}
