package watch

import (
	"context"
	"errors"
	"flusherd/internal/logpath"
	"slices"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"flusherd/tree"
)

// rescan scans every served tree again with cachestat (after an
// overflow). Files already tracked keep their dirtiedWhen.
// The trees removed by a reload recently (recentlyRemoved) are scanned
// too: the writes lost may have been made in one before its removal.
func (b *base) rescan(ctx context.Context, onDir func(t tree.Tree, path string, fd int)) {
	b.mu.Lock()
	trees := slices.Clone(b.trees)
	for _, r := range b.recentlyRemoved {
		trees = append(trees, r.t)
	}
	b.mu.Unlock()
	b.rescanTrees(ctx, trees, onDir)
}

// rescanTrees is rescan over trees, the trees served when the rescan was
// asked for and those removed recently: one that a reload has removed is
// scanned all the same (its dirty files are reported as leaving) and is
// then no longer among the recently removed; one whose root is gone is
// not scanned.
func (b *base) rescanTrees(ctx context.Context, trees []*watchedTree, onDir func(t tree.Tree, path string, fd int)) {
	for _, t := range trees {
		served := b.served(t)
		if !served && !b.removedRoot(t.Root) {
			continue
		}
		if !served {
			b.scannedRemoved(t) // (found removed: this scan begins after its removal)
		}
		b.ctr.Rescans.Add(1)
		b.sink.Rescanned(t.rootKey().Dev)
		var f func(string, int)
		if onDir != nil && served { // (a removed tree's directories get no watch)
			f = func(p string, fd int) { onDir(t.Tree, p, fd) }
		}
		b.scanDir(ctx, t.Tree, t.Root, true, f)
		if served && ctx.Err() == nil {
			// The events lost may have told of deletions, which no
			// scan can find: the tracked names are looked at.
			b.sink.CheckNames(t.Root)
		}
	}
}

// overflowRescan runs rescan (a rescan of the trees after an event queue
// overflow) on a goroutine of its own, so that the backend goes on
// reading its queue meanwhile (the reading stalled by a rescan is what
// makes the next overflow); if one runs already, it runs once more when
// that one is done (the events lost meanwhile may concern parts it has
// scanned). The stats file is rewritten after each.
func (b *base) overflowRescan(ctx context.Context, rescan func()) {
	b.rmu.Lock()
	if b.rescanning {
		b.rescanAgain = true
		b.rmu.Unlock()
		return
	}
	b.rescanning = true
	b.rmu.Unlock()
	go func() {
		for {
			rescan()
			b.touched()
			b.rmu.Lock()
			if !b.rescanAgain || ctx.Err() != nil {
				b.rescanning, b.rescanAgain = false, false
				b.rmu.Unlock()
				return
			}
			b.rescanAgain = false
			b.rmu.Unlock()
		}
	}()
}

// overflowLogEvery is the least time between two warnings of event queue
// overflows; the overflows between are counted in the next one (and each
// is counted in the stats and metrics at once).
const overflowLogEvery = 10 * time.Second

// logOverflow warns of an event queue overflow of backend name, at most
// once per overflowLogEvery, with how many overflowed since the last
// warning.
func (b *base) logOverflow(name string) {
	b.rmu.Lock()
	b.overflowsUnlogged++
	now := time.Now()
	if !b.overflowLogged.IsZero() && now.Sub(b.overflowLogged) < overflowLogEvery {
		b.rmu.Unlock()
		return
	}
	n := b.overflowsUnlogged
	b.overflowsUnlogged, b.overflowLogged = 0, now
	b.rmu.Unlock()
	b.log.Warn(name+" event queue overflowed; rescanning the trees with cachestat",
		zap.Int("overflows", n), zap.Stringer("logged_at_most_every", overflowLogEvery))
}

// rescanBusy reports whether an overflow rescan or a scan of a removed
// tree runs (Quiesce waits for them: the files they find are to be written
// before a shutdown ends).
func (b *base) rescanBusy() bool {
	if b.finalScans.Load() > 0 {
		return true
	}
	b.rmu.Lock()
	defer b.rmu.Unlock()
	return b.rescanning
}

// removedTree is a tree removed by a reload, and its removal's number.
type removedTree struct {
	t   *watchedTree
	seq uint64
}

// recentlyRemovedMax bounds recentlyRemoved (inotify, whose queue is not
// seen to empty, keeps the last removals only).
const recentlyRemovedMax = 64

// removed ends the removal of tree t by a reload (RemoveTree), once it is
// out of the list and marked gone: it waits for the reports made with it
// (fence) and, when events may have been lost already (an overflow's
// rescan running, or a rescan after a shortage due), scans it once more
// (finalScan). Otherwise it stays among the recently removed trees: an
// overflow still in the queue, read later, has it rescanned then.
func (b *base) removed(t *watchedTree) {
	b.fence()
	if b.rescanBusy() || b.retry.due.Load() {
		b.scannedRemoved(t)
		b.finalScan(t.Tree)
	}
}

// scannedRemoved takes t, a removed tree that a scan begun after its
// removal covers, off the recently removed trees.
func (b *base) scannedRemoved(t *watchedTree) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.recentlyRemoved = slices.DeleteFunc(b.recentlyRemoved, func(r removedTree) bool { return r.t == t })
}

// removeSeqNow returns the number of the last removal (removeTree).
func (b *base) removeSeqNow() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.removeSeq
}

// forgetRemovedUpTo drops the recently removed trees whose removal's
// number is at most seq, when no rescan is running or due: the event queue
// was seen empty after their removal (a read that emptied it), so an
// overflow read from now on happened after it, and lost none of their
// writes from before it (and no rescan asked for earlier is yet to list
// the trees).
func (b *base) forgetRemovedUpTo(seq uint64) {
	if b.rescanBusy() || b.retry.due.Load() {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.recentlyRemoved) == 0 {
		return
	}
	b.recentlyRemoved = slices.DeleteFunc(b.recentlyRemoved, func(r removedTree) bool { return r.seq <= seq })
}

// finalScan looks for the dirty files of t, a tree a reload removed, that
// are not tracked, on a goroutine of its own: events lost before the
// removal (a queue overflow whose rescan had not reached them, or a
// shortage) left them unknown, and the reload writes back the files of the
// tree it knows of once more. Each file found is reported as leaving
// (retargetLocked), or to the tree that holds it now.
func (b *base) finalScan(t tree.Tree) {
	b.finalScans.Add(1)
	b.log.Info("events were lost before this tree was removed; scanning it once more for dirty files to write back",
		logpath.String("root", t.Root))
	go func() {
		defer b.finalScans.Add(-1)
		b.scanDir(context.Background(), t, t.Root, true, nil)
	}()
}

// ErrUnsettled is Settle's error: events or scans were lost for want of a
// resource and the rescan that makes up for them could not complete, so
// files in the trees may be dirty without being tracked.
var ErrUnsettled = errors.New("events were lost for want of resources and the rescan of the trees could not complete: files may be dirty without being tracked")

// Settle runs now the rescan that a lost event or an incomplete scan has
// scheduled (scanIncomplete), if one is due, instead of after its delay: a
// shutdown calls it after Quiesce, so that a file whose event was lost is
// tracked, and written back, before the daemon says every tracked file is
// clean. It returns ErrUnsettled (wrapping the last shortage seen) when
// that rescan is left incomplete too; nil when nothing was due or the
// rescan completed.
func (b *base) Settle(ctx context.Context) error {
	if !b.retry.due.Load() {
		return nil
	}
	before := b.retry.failures.Load()
	b.rescan(ctx, nil)
	if b.retry.failures.Load() != before || ctx.Err() != nil {
		return ErrUnsettled
	}
	b.retry.due.Store(false)
	return nil
}

// Default backoff of the rescans after an incomplete scan (Options
// RetryMin and RetryMax override it).
const (
	defaultRetryMin = time.Second
	defaultRetryMax = 30 * time.Second
	// defaultRootCheck is the period of the check of every root when
	// Options.RescanInterval is 0 (watcher.rescan_interval's default).
	defaultRootCheck = 30 * time.Second
)

// retryState is the rescan-after-shortage schedule of a base.
type retryState struct {
	due      atomic.Bool   // a rescan is scheduled
	failures atomic.Uint64 // scans left incomplete, ever
	delay    atomic.Int64  // the next delay (ns); 0 means min
	// min and max bound the delay: the first rescan comes min after the
	// failure, each further one after twice the last delay, at most
	// max; a complete rescan resets it. Set once, by init.
	min, max time.Duration
}

// scanIncomplete records that a scan or an event could not be completed
// for want of a resource, and schedules a cachestat rescan of every tree
// (files already tracked keep their dirtiedWhen). Rescans repeat, with the
// delay doubling from Options.RetryMin up to RetryMax (the daemon passes
// min_pause and max_pause), until one completes. Logged once per
// episode.
func (b *base) scanIncomplete(err error) {
	b.retry.failures.Add(1)
	if b.retry.due.Swap(true) {
		return
	}
	d := time.Duration(b.retry.delay.Load())
	if d == 0 {
		d = b.retry.min
		b.log.Warn("a scan or event could not be completed for want of resources; rescanning the trees until a pass completes",
			zap.Error(err), zap.Stringer("first_retry", d))
	}
	b.retry.delay.Store(int64(min(2*d, b.retry.max)))
	time.AfterFunc(d, func() {
		before := b.retry.failures.Load()
		b.retry.due.Store(false)
		b.rescan(context.Background(), nil)
		if b.retry.failures.Load() == before {
			b.retry.delay.Store(0)
			b.log.Info("rescan after the resource shortage completed")
		}
	})
}
