package bdi

import (
	"strings"
	"time"

	"flusherd/inode"
	"flusherd/internal/logpath"
	"flusherd/policy"
	"flusherd/tree"
)

// A file can be dirtied without an event: through a shared mapping (no
// write(2), no FAN_MODIFY), or by Linux AIO's buffered writes
// (io_submit, which make no fsnotify event). The watcher reports the opens
// and closes of the trees' files (Opened); a file open, or kept mapped
// after its descriptor's close (a mapping holds its file: the close event
// comes at munmap or exit), is a candidate. Every
// policy.SweepEvery(watcher.sweep_interval, its tree's expire) the device's
// goroutine looks at each candidate that is not tracked with cachestat
// (wbSweep, off the goroutine as a background sample is), and tracks one
// found dirty as if a write had been reported then: its data is written
// back within its expire plus the sweep interval, plus the pass's slack.

// Open is a watcher's report of an event that opened (Open) and/or closed
// (Closed) the file Key of Tree at Path, Handle its file handle ("" if
// unknown).
type Open struct {
	Path   string
	Key    inode.Key
	Handle inode.Handle
	Tree   tree.Tree
	Open   bool
	// Closes is the closes the report carries: 1, or 2 when the kernel
	// merged a close of a descriptor open for writing and one of a
	// read-only one into one event (FAN_CLOSE_WRITE|FAN_CLOSE_NOWRITE).
	Closes int
	// Linger: the count may be low (inotify names no process, and its
	// queue merges two like events in a row, the daemon's own open with
	// another's): a candidate whose count falls to 0 is kept until a
	// sweep finds it clean.
	Linger bool
}

// candidate is a file open or mapped in a tree, looked at by the sweep.
type candidate struct {
	path   string
	handle inode.Handle
	tree   tree.Tree
	opens  int           // opens seen, less closes (policy.Opens)
	due    time.Duration // its next look (daemon clock)
	// clean is when it was last known clean (daemon clock): made a
	// candidate, seen clean by a look, or forgotten as clean. Data a
	// look finds is dirtied since: its dirtiedWhen, so that its
	// exposure and expiry count from no later than the dirtying.
	clean time.Duration
	found bool // a sweep found it dirty before (logged once)
}

// sweepState is a device's candidates and its sweep. The list lock
// guards it.
type sweepState struct {
	cands   map[inode.Key]*candidate
	next    time.Duration // the earliest due of cands
	running bool          // a sweep call runs
	swept   []sweepResult // a finished sweep, for the goroutine
	found   uint64        // files a sweep found dirty and not tracked (sweep_found)
}

// sweepProbe is a candidate a sweep looks at.
type sweepProbe struct {
	key    inode.Key
	path   string
	handle inode.Handle
	tree   tree.Tree
}

// sweepResult is a sweep's look at one candidate: its dirty and writeback
// pages, at (daemon clock), or gone (deleted: ENOENT, ESTALE).
type sweepResult struct {
	sweepProbe
	ok, gone   bool
	dirty, wbp uint64
	at         time.Duration
}

// Opened takes the watcher's reports of opens and closes of files on this
// device: each changes its file's open count (policy.Opens); a file whose
// count is above 0 is a candidate, and one whose count falls to 0 is let
// go (its close, a FAN_CLOSE_WRITE, is reported as a write by the
// watcher, so a file dirtied through its mapping is tracked then). Nothing
// is kept while the sweep is off (watcher.sweep_interval = "0").
func (wb *Writeback) Opened(reports []Open) {
	now := wb.now()
	wasIdle := false
	wb.mu.Lock()
	every := wb.cfg.SweepInterval
	if every == 0 {
		wb.mu.Unlock()
		return
	}
	for i := range reports {
		o := &reports[i]
		c := wb.sweep.cands[o.Key]
		n := 0
		if c != nil {
			n = c.opens
		}
		n, low := policy.Opens(n, o.Open, o.Closes)
		switch {
		case n == 0 && c != nil && (o.Linger || low):
			c.opens = 0 // let go by the first look that finds it clean
		case n == 0 && c != nil:
			delete(wb.sweep.cands, o.Key)
		case n > 0 && c == nil:
			if wb.sweep.cands == nil {
				wb.sweep.cands = map[inode.Key]*candidate{}
			}
			c = &candidate{due: now + policy.SweepEvery(every, o.Tree.Expire), clean: now}
			wb.sweep.cands[o.Key] = c
			if len(wb.sweep.cands) == 1 || c.due < wb.sweep.next {
				wb.sweep.next = c.due
				wasIdle = true
			}
		}
		if n > 0 {
			c.opens, c.path, c.tree = n, o.Path, o.Tree
			if o.Handle != "" {
				c.handle = o.Handle
			}
		}
	}
	wb.gen++
	wb.mu.Unlock()
	if wasIdle {
		wb.live.kick() // an earlier sweep to schedule
	}
}

// Candidates returns the number of files the sweep looks at
// (sweep_candidates).
func (wb *Writeback) Candidates() int {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	return len(wb.sweep.cands)
}

// sweepWaitLocked returns how long until the next sweep is due, and false
// when none is to come (no candidate, or a sweep runs and its end wakes
// the goroutine). Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) sweepWaitLocked(now time.Duration) (time.Duration, bool) {
	if len(wb.sweep.cands) == 0 || wb.sweep.running {
		return 0, false
	}
	return max(wb.sweep.next-now, time.Millisecond), true
}

// wbSweep takes in the last sweep's results (applySweepLocked) and, when a
// candidate is due, starts the next: every due candidate that is not
// tracked is opened (as attempts open files) and looked at with
// cachestat, on a goroutine of its own, as a call off the device's
// goroutine (counted in stuck_calls past attempt_timeout). Called on the
// device's goroutine.
func (wb *Writeback) wbSweep() {
	now := wb.now()
	wb.mu.Lock()
	var found []string
	if res := wb.sweep.swept; res != nil {
		wb.sweep.swept = nil
		found = wb.applySweepLocked(res)
	}
	if wb.sweep.running || len(wb.sweep.cands) == 0 || now < wb.sweep.next {
		wb.mu.Unlock()
		wb.logFound(found)
		return
	}
	if wb.acct.stuck+wb.calls.running() >= maxStuckCalls {
		// The filesystem holds maxStuckCalls calls already: no
		// sweep (its opens would be more) until some return.
		wb.sweep.next = now + backgroundCheckInterval
		wb.mu.Unlock()
		wb.logFound(found)
		return
	}
	every := wb.cfg.SweepInterval
	var probes []sweepProbe
	next := time.Duration(-1)
	for key, c := range wb.sweep.cands {
		// A candidate due within half its interval is looked at now
		// too: the candidates of one interval are looked at in at most
		// two rounds per interval, whenever each was opened, and each
		// at least once per interval.
		iv := policy.SweepEvery(every, c.tree.Expire)
		if c.due <= now+iv/2 {
			c.due = now + iv
			if wb.inodes.Get(key) == nil {
				probes = append(probes, sweepProbe{key: key, path: c.path, handle: c.handle, tree: c.tree})
			}
		}
		if next < 0 || c.due < next {
			next = c.due
		}
	}
	wb.sweep.next = next
	if len(probes) == 0 {
		wb.mu.Unlock()
		wb.logFound(found)
		return
	}
	wb.sweep.running = true
	id := wb.calls.track(now)
	wb.mu.Unlock()
	wb.logFound(found)
	go func() {
		res := wb.runSweep(probes)
		wb.mu.Lock()
		wb.calls.returned(id, 0)
		wb.sweep.running = false
		wb.sweep.swept = res
		wb.mu.Unlock()
		wb.live.kick()
	}()
}

// runSweep opens each probed candidate and reads its pages with
// cachestat. Runs off the device's goroutine.
func (wb *Writeback) runSweep(probes []sweepProbe) []sweepResult {
	out := make([]sweepResult, 0, len(probes))
	for _, p := range probes {
		r := sweepResult{sweepProbe: p}
		f, _, err := wb.openFile(p.path, p.key, p.handle)
		if err != nil {
			r.gone = policy.ClassifyErr(err) == policy.Gone
			out = append(out, r)
			continue
		}
		if d, w, err := f.Cachestat(0, 0); err == nil {
			r.ok, r.dirty, r.wbp = true, d, w
		}
		f.Close()
		r.at = wb.now()
		out = append(out, r)
	}
	return out
}

// applySweepLocked takes in a sweep's results: a candidate found dirty
// and not tracked is marked dirty as of its look (dirtiedWhen = the time
// found) and counted in sweep_found; a deleted one is let go. It returns
// the paths of the candidates found dirty for the first time, for the
// debug log. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) applySweepLocked(res []sweepResult) (first []string) {
	for _, r := range res {
		c := wb.sweep.cands[r.key]
		if r.gone {
			if c != nil {
				delete(wb.sweep.cands, r.key)
			}
			continue
		}
		if c != nil && c.opens == 0 && r.ok && r.dirty == 0 {
			delete(wb.sweep.cands, r.key) // closed (Linger), and clean
			continue
		}
		tracked := wb.inodes.Get(r.key) != nil
		if c != nil && r.ok && r.dirty == 0 && !tracked {
			c.clean = max(c.clean, r.at)
		}
		if !r.ok || r.dirty == 0 || tracked {
			continue // clean, or tracked since (an event, an attempt's count is newer)
		}
		wb.markInodeDirtyLocked(r.key, r.path, r.handle, r.tree, r.at, 0)
		if in := wb.inodes.Get(r.key); in != nil && !in.Has(inode.Sync) {
			wb.setPagesLocked(in, r.dirty, r.wbp)
			if c != nil && c.clean < in.DirtiedWhen && in.Link().Linked() && in.Has(inode.Dirty) && !in.Has(inode.Sync) {
				// Dirtied since it was last known clean, not at
				// the look: counted from then.
				in.DirtiedWhen = c.clean
				wb.bDirty.insertByAge(in)
			}
		}
		wb.sweep.found++
		if c != nil && !c.found {
			c.found = true
			first = append(first, r.path)
		}
	}
	wb.gen++
	return first
}

// logFound logs, at debug level, the files a sweep found dirty for the
// first time.
func (wb *Writeback) logFound(paths []string) {
	for _, p := range paths {
		wb.log.Debug("a file dirtied without an event (a shared mapping, Linux AIO) was found by the sweep; it is tracked as dirtied when it was last known clean",
			logpath.String("path", p))
	}
}

// dropCandidatesLocked lets go of the candidates whose path is below root
// and for which keep (nil: none kept) is false. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) dropCandidatesLocked(root string, keep map[string]bool) {
	for key, c := range wb.sweep.cands {
		if pathUnder(c.path, root) && !keep[c.path] {
			delete(wb.sweep.cands, key)
		}
	}
}

// retreeCandidatesLocked gives the candidates at paths the tree t (a
// reload's), and the sweep interval of its expire from now (daemon clock)
// where that is sooner than their next look. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) retreeCandidatesLocked(paths map[string]bool, t tree.Tree, now time.Duration) {
	every := wb.cfg.SweepInterval
	for _, c := range wb.sweep.cands {
		if !paths[c.path] {
			continue
		}
		c.tree = t
		if due := now + policy.SweepEvery(every, t.Expire); due < c.due {
			c.due = due
			if due < wb.sweep.next {
				wb.sweep.next = due
			}
		}
	}
}

// candidatesUnder returns the paths of the candidates below root.
func (wb *Writeback) candidatesUnder(root string) []string {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	var out []string
	for _, c := range wb.sweep.cands {
		if pathUnder(c.path, root) {
			out = append(out, c.path)
		}
	}
	return out
}

// pathUnder reports whether path is below the directory root.
func pathUnder(path, root string) bool {
	if root == "/" {
		return strings.HasPrefix(path, "/")
	}
	return strings.HasPrefix(path, root+"/")
}
