package bdi

import (
	"math"
	"strings"
	"time"

	"flusherd/inode"
	"flusherd/lists"
	"flusherd/tree"
)

// Tracks reports whether the inode key is tracked (on any list, the
// failed one included) under the name path; "" is any name. (st_dev, st_ino) alone is not
// an identity: ext4 gives a deleted file's number to the next file at
// once, so a file whose number is tracked under another name may be a new
// file, to be looked at (MarkInodeDirty then gives the inode its name, and
// its attempt its new handle).
func (wb *Writeback) Tracks(key inode.Key, path string) bool {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	in := wb.inodes.Get(key)
	return in != nil && (path == "" || in.HasPath(path))
}

// Failed returns the inodes whose data was lost (see bFailed): path and
// the errno of the failure.
func (wb *Writeback) Failed() []GivenUp {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	var out []GivenUp
	for in := range wb.bFailed.All {
		out = append(out, GivenUp{Path: in.Path(), Err: errnoError(in.LastErr)})
	}
	return out
}

// tracked is a tracked inode and its path, as read under the list lock.
type tracked struct {
	in   *inode.Inode
	path string
}

// under returns the tracked inodes below root with their paths, for a
// caller that asks the watcher about each path without the list lock (it
// takes the watcher's).
func (wb *Writeback) under(root string) []tracked {
	var out []tracked
	wb.mu.Lock()
	defer wb.mu.Unlock()
	for in := range wb.inodes.All {
		if in.InDir(root) {
			out = append(out, tracked{in, in.Path()})
		}
	}
	return out
}

// RestrictUnder applies a tree's new, stricter settings (a reload that
// shortened its expire or made it an integrity tree) to the files tracked
// under root that the tree holds (holds: the deepest tree of the path is
// this one): each takes the shorter expire class, keeping its
// dirtiedWhen, and the integrity mode (stricterTreeLocked). Looser
// settings apply to data dirtied from then on, as all of them do to the
// sweep's candidates the tree holds (data a sweep finds was dirtied since
// it was last known clean): they take the tree, and a shorter sweep
// interval from now on. It returns how many tracked files it looked at;
// holds is called without the list lock.
func (wb *Writeback) RestrictUnder(root string, t tree.Tree, holds func(path string) bool) int {
	cands := wb.under(root)
	var held []*inode.Inode
	for _, c := range cands {
		if holds(c.path) {
			held = append(held, c.in)
		}
	}
	heldCands := map[string]bool{}
	for _, p := range wb.candidatesUnder(root) {
		if holds(p) {
			heldCands[p] = true
		}
	}
	now := wb.now()
	wb.mu.Lock()
	live := held[:0]
	for _, in := range held {
		if wb.inodes.Get(in.Key()) == in {
			live = append(live, in)
		}
	}
	wb.stricterTreesLocked(live, t)
	wb.retreeCandidatesLocked(heldCands, t, now)
	wb.gen++
	wb.mu.Unlock()
	wb.live.kick()
	return len(held)
}

// RetireUnder is for a tree removed from the configuration (a reload):
// every tracked inode below root for which keep(path) is false (keep says
// whether another tree still holds the path) is written back once more,
// at the next pass (a file with more than write_chunk dirty in as many
// attempts as it takes, while each leaves less dirty), and then
// forgotten; a write reported for it meanwhile (its tree added back)
// keeps it. It returns how many. keep is
// called without the list lock (it takes the watcher's).
func (wb *Writeback) RetireUnder(root string, keep func(path string) bool) int {
	cands := wb.under(root)
	leaving := make(map[*inode.Inode]bool, len(cands))
	for _, c := range cands {
		if !keep(c.path) {
			leaving[c.in] = true
		}
	}
	keptCands := map[string]bool{}
	for _, p := range wb.candidatesUnder(root) {
		if keep(p) {
			keptCands[p] = true
		}
	}
	n := 0
	wb.mu.Lock()
	wb.dropCandidatesLocked(root, keptCands)
	for in := range leaving {
		if wb.inodes.Get(in.Key()) != in {
			continue // forgotten meanwhile
		}
		n++
		if wb.failedLocked(in) {
			// Nothing to write: its data was lost earlier (logged
			// then); the tree no longer holds it.
			wb.forgetFailedLocked(in)
			continue
		}
		in.State |= inode.Leaving
		if !in.Has(inode.Sync) {
			wb.requeueIOLocked(in) // taken by the next queue_io
		}
	}
	wb.gen++
	wb.mu.Unlock()
	if n > 0 {
		wb.Queue(&Work{NrPages: math.MaxInt64, Reason: "reload"})
	}
	return n
}

// MaxDirtyAge returns the age of the oldest dirty data of a tracked inode
// (now minus the smallest dirtiedWhen), 0 when nothing is tracked. It
// looks at the front of each b_dirty class (each is in dirtiedWhen order)
// and at every inode of the other lists.
func (wb *Writeback) MaxDirtyAge() time.Duration {
	now := wb.now()
	wb.mu.Lock()
	defer wb.mu.Unlock()
	oldest, any := now, false
	see := func(in *inode.Inode) {
		if in != nil && in.DirtiedWhen < oldest {
			oldest = in.DirtiedWhen
		}
		any = any || in != nil
	}
	for _, c := range wb.bDirty.classes {
		see(c.list.Front())
	}
	for _, l := range []*lists.List[*inode.Inode]{&wb.BIO, &wb.BMoreIO, &wb.BMoreIOWait, &wb.inflight} {
		for in := range l.All {
			see(in)
		}
	}
	if !any {
		return 0
	}
	return now - oldest
}

// DropUnder forgets every tracked inode whose path is below root (its tree
// is gone: removed or unmounted); one under an attempt is dropped when the
// attempt completes. It returns the number dropped or marked, and of those
// not failed (tracked as dirty) how many and their dirty pages at their
// last look.
func (wb *Writeback) DropUnder(root string) Dropped {
	var d Dropped
	wb.mu.Lock()
	// The inodes are gathered first, then dropped: the body of a range
	// over Table.All is a function literal, in which checklocks does not
	// see wb.mu held.
	var under []*inode.Inode
	for in := range wb.inodes.All {
		if in.InDir(root) {
			under = append(under, in)
		}
	}
	wb.dropCandidatesLocked(root, nil)
	for _, in := range under {
		d.Files++
		if !wb.failedLocked(in) {
			d.Tracked++
			d.DirtyPages += uint64(in.DirtyPages)
		}
		if in.Has(inode.Sync) {
			in.State |= inode.Dropped
			continue
		}
		if wb.failedLocked(in) {
			wb.acct.failed--
		}
		lists.Remove(in)
		wb.dropInodeLocked(in)
		wb.acct.gone++
	}
	wb.gen++
	wb.mu.Unlock()
	wb.live.kick()
	return d
}

// Dropped is what DropUnder dropped: Files in all, Tracked of them not
// failed, and the dirty pages those had at their last look.
type Dropped struct {
	Files, Tracked int
	DirtyPages     uint64
}

// Tracked returns the number of tracked (dirty) inodes.
func (wb *Writeback) Tracked() int {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	return wb.inodes.Len() - wb.acct.failed
}

// Refs returns a FileRef for every tracked inode whose path is under dir
// (every one when dir is ""), for a sync request.
func (wb *Writeback) Refs(dir string) []FileRef {
	dir = strings.TrimSuffix(dir, "/")
	wb.mu.Lock()
	defer wb.mu.Unlock()
	var out []FileRef
	classes := wb.bDirty.classes // (read here: checklocks does not see wb.mu held in the loop's body)
	for in := range wb.inodes.All {
		if dir != "" && !in.InDir(dir) {
			continue
		}
		t := tree.Tree{Mode: tree.ModeWriteback, Expire: classes[in.Class].expire}
		if in.Has(inode.Integrity) {
			t.Mode = tree.ModeIntegrity
		}
		out = append(out, FileRef{Key: in.Key(), Path: in.Path(), Tree: t})
	}
	return out
}

// InodeInfo describes one tracked inode, for `flusherd dirty`.
type InodeInfo struct {
	Path   string
	Key    inode.Key
	Handle inode.Handle
	// List is b_dirty, b_io (including an attempt in flight), b_more_io,
	// b_more_io_wait, or failed (its data was lost; see bFailed).
	List string
	// DirtiedWhen is on the daemon's monotonic clock (see Registry.Now).
	DirtiedWhen         time.Duration
	DirtyPages, WBPages uint32 // as last seen by cachestat
	Retries, Errors     uint16
	LastErr             uint8 // errno; inode.ErrnoOther for an error that is not one
	Busy                bool  // a call for it exceeded attempt_timeout and has not returned
	// Probing: its device is probed with one file per pause (every retry
	// failed with one device-level error, Stats.Probing).
	Probing bool
}

// Inodes describes every tracked inode.
func (wb *Writeback) Inodes() []InodeInfo {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	out := make([]InodeInfo, 0, wb.inodes.Len())
	probing := wb.probe.on
	add := func(list string, in *inode.Inode) {
		out = append(out, InodeInfo{Path: in.Path(), Key: in.Key(), Handle: in.Handle(), List: list,
			DirtiedWhen: in.DirtiedWhen, DirtyPages: in.DirtyPages, WBPages: in.WritebackPages,
			Retries: in.Retries, Errors: in.Errors, LastErr: in.LastErr, Busy: in.Has(inode.Busy), Probing: probing})
	}
	for _, c := range wb.bDirty.classes {
		for in := range c.list.All {
			add("b_dirty", in)
		}
	}
	for _, l := range []struct {
		name string
		list *lists.List[*inode.Inode]
	}{{"b_io", &wb.BIO}, {"b_io", &wb.inflight}, {"b_more_io", &wb.BMoreIO}, {"b_more_io_wait", &wb.BMoreIOWait}, {"failed", &wb.bFailed}} {
		for in := range l.list.All {
			add(l.name, in)
		}
	}
	return out
}

// OpenInode opens a tracked inode as its writeback attempts do (by handle
// when it has one), for a fresh cachestat.
func (wb *Writeback) OpenInode(i InodeInfo) (inode.File, error) {
	f, _, err := wb.openFile(i.Path, i.Key, i.Handle)
	return f, err
}
