package bdi

import (
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/inode"
	"flusherd/internal/logpath"
	"flusherd/tree"
)

// Options configure a Registry.
type Options struct {
	Config Config
	// StatsDir is the root of the stats files (<StatsDir>/bdi/<name>/stats);
	// empty means no stats files.
	StatsDir string
	// StatsEvery bounds how often a busy device's stats file is rewritten.
	StatsEvery time.Duration
	// Resolve names the bdi of st_dev dev, given a path on that filesystem
	// (sysfs.FS.BdiName).
	Resolve func(dev uint64, path string) (string, error)
	// Thresholds returns nr_dirty_threshold and
	// nr_dirty_background_threshold in pages; may be nil.
	Thresholds func() (dirty, background uint64, err error)
	// NrDirty returns /proc/vmstat nr_dirty (pages), read by devices with
	// a background threshold; may be nil (then unknown: every freshly
	// written file is looked at).
	NrDirty func() (uint64, error)
	// DiskWritten returns the bytes block device name has completed
	// writing (sysfs.FS.DiskWritten), for the write bandwidth; may be nil.
	DiskWritten func(name string) (uint64, error)
	// Opener opens files by path; nil means inode.OS.
	Opener inode.Opener
	// Handles, if set, opens files by handle (the daemon's inode.Handles).
	Handles Handles
	Log     *zap.Logger
	// BeforePass, if set, becomes each new device's BeforePass (a test
	// hook).
	BeforePass func()
	// Errs, if set, holds the integrity trees' filesystems' error cursors
	// (see ErrWatch).
	Errs *ErrWatch
	// MaxTracked bounds the inodes tracked by all devices
	// (writeback.max_tracked_inodes; see overBudget); 0: no bound.
	MaxTracked int64
}

// Registry holds the devices' writeback goroutines, created on the first
// dirty inode of each device (bdi_register plus the on-demand flusher of
// old kernels). The daemon makes one and owns it until Shutdown and Stop.
// Safe for concurrent use.
type Registry struct {
	opt   Options
	epoch time.Time
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	sub   subscription // the devices' AttemptObserver (Observe)
	// budget is every device's tracked-inode budget.
	budget trackBudget
	// pauses sees the process stopped as a whole (Resumed); started by
	// the first call.
	pauses     pauseWatch
	pausesOnce sync.Once

	mu sync.Mutex
	// +checklocks:mu
	byDev map[uint64]*Writeback
	// +checklocks:mu
	byName map[string]*Writeback
	// +checklocks:mu
	cancel map[string]context.CancelFunc // each device's goroutine
	// +checklocks:mu
	rescans map[uint64]uint64 // rescans of devices not started yet
}

// NewRegistry returns an empty registry whose goroutines run until
// Shutdown. Its clock starts now.
func NewRegistry(opt Options) *Registry {
	if opt.Log == nil {
		opt.Log = zap.NewNop()
	}
	if opt.Opener == nil {
		opt.Opener = inode.OS{}
	}
	if opt.StatsEvery <= 0 {
		opt.StatsEvery = time.Second
	}
	ctx, stop := context.WithCancel(context.Background())
	r := &Registry{opt: opt, epoch: time.Now(), ctx: ctx, stop: stop, byDev: map[uint64]*Writeback{}, byName: map[string]*Writeback{},
		cancel: map[string]context.CancelFunc{}, rescans: map[uint64]uint64{}}
	r.budget.max.Store(max(0, opt.MaxTracked))
	return r
}

// SetMaxTracked sets the tracked-inode budget of every device (0: no
// bound; a reload). Devices over the new budget enter the over-budget
// state at their next new file; those under its low-water mark leave it.
func (r *Registry) SetMaxTracked(n int64) { r.budget.max.Store(max(0, n)) }

// TrackedInodes returns the inodes tracked by every device and the
// budget (0: no bound).
func (r *Registry) TrackedInodes() (n, budget int64) { return r.budget.n.Load(), r.budget.max.Load() }

// Observe subscribes o to every device's attempts' opens, background
// checks and forgotten inodes, replacing the one before (nil: none).
func (r *Registry) Observe(o AttemptObserver) { r.sub.set(o) }

// Now is the daemon's monotonic clock: time since the registry was made.
func (r *Registry) Now() time.Duration { return time.Since(r.epoch) }

// pauseTick is how often the registry's pause watch wakes; a wake-up more
// than pauseTick+pauseLate after the one before ends a pause of the whole
// process (Resumed).
const (
	pauseTick = 100 * time.Millisecond
	pauseLate = 400 * time.Millisecond
)

// pauseWatch holds, on the daemon clock (nanoseconds), the watch's last
// wake-up and the end of the last pause it saw.
type pauseWatch struct {
	last, resumed atomic.Int64
}

// Resumed returns when (daemon clock) the whole process last resumed after
// being stopped: frozen by the cgroup freezer, SIGSTOP, a paused virtual
// machine. CLOCK_MONOTONIC runs on meanwhile, so a goroutine caught awake
// by the stop looks silent for the stop's length; silence before Resumed
// is not the goroutine's (Writeback.HealthySince). While the process is
// resuming (the watch's own wake-up is late), it is now. The watch's
// goroutine starts at the first call and ends with the registry.
func (r *Registry) Resumed() time.Duration {
	r.pausesOnce.Do(func() {
		r.pauses.last.Store(int64(r.Now()))
		r.wg.Go(r.watchPauses)
	})
	now := r.Now()
	if now-time.Duration(r.pauses.last.Load()) > pauseTick+pauseLate {
		return now
	}
	return time.Duration(r.pauses.resumed.Load())
}

// watchPauses wakes every pauseTick until the registry stops, and
// records a late wake-up as the end of a pause.
func (r *Registry) watchPauses() {
	t := time.NewTicker(pauseTick)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		now := int64(r.Now())
		if last := r.pauses.last.Swap(now); now-last > int64(pauseTick+pauseLate) {
			r.pauses.resumed.Store(now)
		}
	}
}

// Device returns the writeback state of st_dev dev, starting it if new.
// path is any path on that filesystem, used to name the bdi.
//
// The bdi is named (Resolve: an open, fstatfs, an ioctl, /sys reads) without
// Registry's lock, so that one hung filesystem does not stall the marking
// of files on every other device.
func (r *Registry) Device(dev uint64, path string) (*Writeback, error) {
	r.mu.Lock()
	if wb := r.byDev[dev]; wb != nil {
		r.mu.Unlock()
		return wb, nil
	}
	r.mu.Unlock()
	if r.ctx.Err() != nil {
		return nil, fmt.Errorf("bdi: shutting down")
	}
	name, err := r.opt.Resolve(dev, path)
	if err != nil {
		return nil, fmt.Errorf("bdi: naming the device of %s: %w", path, err)
	}
	cw := closeWrites(path)
	r.mu.Lock()
	defer r.mu.Unlock()
	if wb := r.byDev[dev]; wb != nil {
		return wb, nil // named meanwhile by another caller
	}
	if r.ctx.Err() != nil {
		return nil, fmt.Errorf("bdi: shutting down")
	}
	wb := r.byName[name]
	if wb == nil {
		var sw *statsWriter
		if r.opt.StatsDir != "" {
			sw = NewStatsWriter(r.opt.StatsDir, name, r.opt.StatsEvery, r.opt.Thresholds, r.opt.Log)
		}
		files := Files{Opener: r.opt.Opener, Handles: r.opt.Handles, Observer: &r.sub}
		wb = New(name, r.opt.Config, r.Now, files, r.opt.Log, sw)
		wb.errs = r.opt.Errs
		wb.budget = &r.budget
		wb.Hooks.BeforePass = r.opt.BeforePass
		wb.loop.thresholds, wb.loop.vmDirty = r.opt.Thresholds, r.opt.NrDirty
		if dw := r.opt.DiskWritten; dw != nil {
			wb.bw.diskWritten = func() (uint64, error) { return dw(name) }
		}
		r.byName[name] = wb
		ctx, cancel := context.WithCancel(r.ctx)
		r.cancel[name] = cancel
		r.wg.Go(func() { wb.Run(ctx) })
		r.opt.Log.Info("writeback started for device", zap.String("bdi", name))
	}
	r.byDev[dev] = wb
	if cw {
		wb.mu.Lock()
		wb.bg.closeWrites[dev] = true
		wb.mu.Unlock()
	}
	if n := r.rescans[dev]; n > 0 {
		delete(r.rescans, dev)
		wb.mu.Lock()
		wb.acct.rescans += n
		wb.mu.Unlock()
	}
	return wb, nil
}

// closeWrites reports whether a close(2) of a file on path's filesystem
// writes the file's dirty pages back and waits (FUSE's flush, with the
// writeback cache), so that a background check's count of a file there,
// an open and a close, would write it. Unknown is false.
func closeWrites(path string) bool {
	fd, err := inode.OpenPath(path)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Statfs_t
	return unix.Fstatfs(fd, &st) == nil && uint32(st.Type) == unix.FUSE_SUPER_MAGIC
}

// Snapshot is wb.Snapshot with the dirty thresholds filled in, as in the
// stats file.
func (r *Registry) Snapshot(wb *Writeback) Stats {
	s := wb.Snapshot()
	if r.opt.Thresholds != nil {
		if d, b, err := r.opt.Thresholds(); err == nil {
			s.DirtyThresh, s.BackgroundThresh, s.BdiDirtyThresh = d, b, d
		}
	}
	return s
}

// SetConfig gives every device, and those started later, new tunables (a
// configuration reload).
func (r *Registry) SetConfig(cfg Config) {
	r.mu.Lock()
	r.opt.Config = cfg
	devs := make([]*Writeback, 0, len(r.byName))
	for _, wb := range r.byName {
		devs = append(devs, wb)
	}
	r.mu.Unlock()
	for _, wb := range devs {
		wb.SetConfig(cfg)
	}
}

// TreeRemoved is for a tree taken out of the configuration: its tracked
// inodes (those keep does not claim for another tree) are written back
// once more and forgotten (Writeback.RetireUnder). It returns how many.
func (r *Registry) TreeRemoved(root string, keep func(path string) bool) int {
	n := 0
	for _, wb := range r.Devices() {
		n += wb.RetireUnder(root, keep)
	}
	return n
}

// TreeRestricted applies a reloaded tree's stricter settings to the files
// tracked under root on every device (Writeback.RestrictUnder); it returns
// how many files the tree holds.
func (r *Registry) TreeRestricted(root string, t tree.Tree, holds func(path string) bool) int {
	n := 0
	for _, wb := range r.Devices() {
		n += wb.RestrictUnder(root, t, holds)
	}
	return n
}

// Rescanned counts a rescan of a tree on filesystem dev in its device's
// statistics (watch.Sink).
func (r *Registry) Rescanned(dev uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	wb := r.byDev[dev]
	if wb == nil {
		r.rescans[dev]++
		return
	}
	wb.mu.Lock()
	wb.acct.rescans++
	wb.gen++
	wb.mu.Unlock()
}

// TreeGone drops the inodes of a tree whose root is gone (watch.Sink;
// unmounted: its filesystem was unmounted, which wrote them back), and
// lets go of its filesystem's error cursor (Options.Errs).
// When it was the last tree on its filesystem (lastOnDev), the device is
// retired once nothing of it is tracked: its goroutine ends, its stats
// file is removed, and the filesystem's handle registration is dropped.
func (r *Registry) TreeGone(root string, dev uint64, lastOnDev, unmounted bool) {
	if r.opt.Errs != nil {
		// Its filesystem's error cursor is let go with it: the held
		// root would keep a lazily unmounted filesystem, and its loop
		// device, alive. A reload that serves the tree again takes a
		// new one.
		r.opt.Errs.Remove(root)
	}
	wb := r.known(dev)
	if wb != nil {
		d := wb.DropUnder(root)
		if d.Tracked > 0 && !unmounted {
			// Renamed or mounted over, the files are still there and
			// may be dirty; removed, their data went with them;
			// unmounted, the unmount wrote them back.
			r.opt.Log.Warn("dropped the files of a tree that is gone, some tracked as dirty: if the tree was renamed or mounted over, their dirty data is left to the kernel's flusher (removed, it went with them)",
				logpath.String("root", root), zap.Int("files", d.Files), zap.Int("tracked", d.Tracked),
				zap.Uint64("dirty_pages_last_seen", d.DirtyPages), zap.String("bdi", wb.Name))
		} else {
			r.opt.Log.Info("dropped the files of a tree that is gone", logpath.String("root", root), zap.Int("files", d.Files), zap.String("bdi", wb.Name))
		}
		if paths, files := wb.dropUnverifiedUnder(root, lastOnDev); files > 0 {
			slices.Sort(paths)
			r.opt.Log.Warn("files of a tree that is gone whose writeback flusherd started without waiting for it (writeback mode, or a range writeback) have an outcome not known: no read of the filesystem's writeback error cursor covered their writes before the tree went; if their writeback failed, their data is lost",
				logpath.String("root", root), zap.String("bdi", wb.Name), zap.Int("files", files), logpath.Strings("first", paths[:min(len(paths), 20)]))
		}
	}
	if !lastOnDev {
		return
	}
	if r.opt.Handles != nil {
		r.opt.Handles.RemoveMount(dev)
	}
	if wb == nil {
		return
	}
	r.wg.Go(func() { r.retire(dev, wb, nil) })
}

// Retire retires the device of st_dev dev, whose last tree a reload took
// out (Writeback.RetireUnder writes its files back once more), once it
// tracks nothing, as TreeGone does, unless unused, called then without
// any lock of the registry's held, says it is used again (a tree on it
// added meanwhile). The filesystem's handle registration is kept.
func (r *Registry) Retire(dev uint64, unused func() bool) {
	if wb := r.known(dev); wb != nil {
		r.wg.Go(func() { r.retire(dev, wb, unused) })
	}
}

// StDevs returns the st_devs the registry has a device for, sorted.
func (r *Registry) StDevs() []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.byDev))
}

// retire waits until wb tracks nothing, then, unless unused (if not nil)
// says otherwise, stops it and removes it and its stats file.
func (r *Registry) retire(dev uint64, wb *Writeback, unused func() bool) {
	for wb.Tracked() > 0 {
		select {
		case <-r.ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	if unused != nil && !unused() {
		return
	}
	r.mu.Lock()
	if r.byDev[dev] != wb {
		r.mu.Unlock()
		return
	}
	delete(r.byDev, dev)
	shared := false
	for _, o := range r.byDev {
		shared = shared || o == wb
	}
	if !shared {
		wb.mu.Lock()
		r.budget.n.Add(-int64(wb.inodes.Len())) // failed files, kept to be reported
		wb.mu.Unlock()
		delete(r.byName, wb.Name)
		r.cancel[wb.Name]()
		delete(r.cancel, wb.Name)
	}
	r.mu.Unlock()
	if shared {
		return
	}
	<-wb.live.stopped
	if wb.stats != nil {
		if err := os.Remove(wb.stats.path); err != nil && !os.IsNotExist(err) {
			r.opt.Log.Warn("cannot remove a retired device's stats file", zap.Error(err))
		}
		os.Remove(filepath.Dir(wb.stats.path))
	}
	r.opt.Log.Info("writeback stopped for device: none of its trees is left", zap.String("bdi", wb.Name))
}

// MarkInodeDirty marks the inode key at path dirty on its device
// (__mark_inode_dirty); h is its file handle, if known (see
// Writeback.MarkInodeDirty).
func (r *Registry) MarkInodeDirty(path string, key inode.Key, h inode.Handle, t tree.Tree) error {
	return r.mark(path, key, h, t, 0)
}

// MarkInodeClosed is MarkInodeDirty for a close with no write reported
// (Writeback.MarkInodeClosed).
func (r *Registry) MarkInodeClosed(path string, key inode.Key, h inode.Handle, t tree.Tree) error {
	return r.mark(path, key, h, t, markClosed)
}

func (r *Registry) mark(path string, key inode.Key, h inode.Handle, t tree.Tree, how markHow) error {
	wb, err := r.Device(key.Dev, path)
	if err != nil {
		return err
	}
	wb.mark(key, path, h, t, how)
	return nil
}

// MarkInodesDirty takes a batch of reports (MarkInodeDirty, or
// MarkInodeClosed for those with Closed): each run of consecutive reports
// on one device is marked with one look-up of the device and one
// acquisition of its list lock per 64 reports (Writeback.markBatch). A
// report whose device cannot be named (each is then tried alone) gets
// Registry.Device's error in its Err; the others' Err is nil.
func (r *Registry) MarkInodesDirty(ms []Mark) {
	for len(ms) > 0 {
		dev := ms[0].Key.Dev
		n := 1
		for n < len(ms) && ms[n].Key.Dev == dev {
			n++
		}
		run := ms[:n]
		ms = ms[n:]
		wb, err := r.Device(dev, run[0].Path)
		if err != nil {
			// Each report as alone (a failure may be the first
			// path's own).
			for i := range run {
				m := &run[i]
				m.Err = r.mark(m.Path, m.Key, m.Handle, m.Tree, m.how())
			}
			continue
		}
		for i := range run {
			run[i].Err = nil
		}
		wb.markBatch(run)
	}
}

// InodesOpened takes a batch of the watcher's reports of opens and
// closes (Writeback.Opened), each run of consecutive reports on one device
// with one look-up of the device. A device is made for an open, not for a
// close alone (nothing of it is a candidate). A report whose device cannot
// be named is dropped: the file's writes, if any are reported, name it
// again.
func (r *Registry) InodesOpened(reports []Open) {
	for len(reports) > 0 {
		dev := reports[0].Key.Dev
		n := 1
		opens := reports[0].Open
		for n < len(reports) && reports[n].Key.Dev == dev {
			opens = opens || reports[n].Open
			n++
		}
		run := reports[:n]
		reports = reports[n:]
		wb := r.known(dev)
		if wb == nil && opens {
			wb, _ = r.Device(dev, run[0].Path)
		}
		if wb != nil {
			wb.Opened(run)
		}
	}
}

// known returns the device of st_dev dev, nil if it has none yet.
func (r *Registry) known(dev uint64) *Writeback {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byDev[dev]
}

// Unchecked reports whether the device dev acts on freshly written files
// only by counting their pages (no range writeback, no background
// threshold: see checksWantedLocked), so that a watcher may stop reporting
// the writes of a file it has reported dirty until its writeback attempt
// (the fanotify watcher's quieted files). A quieted file's count is then
// as old as its last report until that attempt. An unknown device
// answers false.
func (r *Registry) Unchecked(dev uint64) bool {
	wb := r.known(dev)
	if wb == nil {
		return false
	}
	wb.mu.Lock()
	defer wb.mu.Unlock()
	return !wb.checksWantedLocked()
}

// Tracks reports whether the inode key is tracked on its device under the
// name path (Writeback.Tracks). It names no device: an unknown st_dev has
// nothing tracked.
func (r *Registry) Tracks(key inode.Key, path string) bool {
	wb := r.known(key.Dev)
	return wb != nil && wb.Tracks(key, path)
}

// InodeUnlinked tells the device of key that a name of the inode, or the
// inode itself, was deleted, with the inode's file handle h (fanotify's
// FAN_DELETE with FAN_REPORT_TARGET_FID, FAN_DELETE_SELF;
// watch.Sink): Writeback.Unlinked. A device not known is not made.
func (r *Registry) InodeUnlinked(key inode.Key, h inode.Handle) {
	if wb := r.known(key.Dev); wb != nil {
		wb.Unlinked(key, h)
	}
}

// NameUnlinked tells the device of key that the name path of the inode was
// deleted (inotify's IN_DELETE, watch.Sink):
// Writeback.NameUnlinked. A device not known is not made.
func (r *Registry) NameUnlinked(key inode.Key, path string) {
	if wb := r.known(key.Dev); wb != nil {
		wb.NameUnlinked(key, path)
	}
}

// CheckNames looks, on every device, whether each file tracked under root
// still has its name (Writeback.CheckNames), after a rescan of the tree
// (watch.Sink).
func (r *Registry) CheckNames(root string) {
	for _, wb := range r.Devices() {
		if n := wb.CheckNames(root); n > 0 {
			r.opt.Log.Debug("after a rescan, tracked files whose names are gone are looked at by the next pass",
				logpath.String("root", root), zap.Int("files", n), zap.String("bdi", wb.Name))
		}
	}
}

// TracksKey reports whether the inode key is tracked, under any name
// (watch.Sink).
func (r *Registry) TracksKey(key inode.Key) bool {
	wb := r.known(key.Dev)
	return wb != nil && wb.Tracks(key, "")
}

// Devices returns the devices, sorted by name.
func (r *Registry) Devices() []*Writeback {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*Writeback, 0, len(r.byName))
	for _, wb := range r.byName {
		out = append(out, wb)
	}
	slices.SortFunc(out, func(a, b *Writeback) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Drain writes back every tracked inode of the device, repeating until
// none is tracked (each is clean: no dirty and no writeback pages), a
// whole-filesystem pass has covered every file not tracked for the
// budget (overBudget) and, when shutting down, no read of an error cursor
// is under way or due (awaitsVerify), or ctx ends, and returns ctx's error in the latter
// case. Integrity trees get fdatasync, the others sync_file_range.
func (wb *Writeback) Drain(ctx context.Context, reason string) error {
	wb.mu.Lock() // wb.cfg is replaced by applyConfig (a reload) under wb.mu
	pause := max(wb.cfg.MinPause, time.Millisecond)
	wb.mu.Unlock()
	for {
		w := &Work{NrPages: math.MaxInt64, All: true, Reason: reason}
		wb.Queue(w)
		select {
		case <-w.done:
		case <-ctx.Done():
			return ctx.Err()
		case <-wb.live.stopped:
			return fmt.Errorf("bdi %s: writeback stopped", wb.Name)
		}
		if wb.Tracked() == 0 && len(wb.Uncovered()) == 0 && !wb.awaitsVerify() {
			return nil
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		pause = min(pause*2, 100*time.Millisecond)
	}
}

// without returns u less the files that given, lost or left name: the
// report says they were not written (or not all), which an "outcome not
// known, clean" line would contradict.
func (u Unverified) without(given, lost []GivenUp, left []string) Unverified {
	named := make(map[string]bool, len(given)+len(lost)+len(left))
	for _, g := range slices.Concat(given, lost) {
		named[g.Path] = true
	}
	for _, p := range left {
		named[p] = true
	}
	out := Unverified{Files: u.Files}
	for _, p := range u.Paths {
		if named[p] {
			out.Files--
			continue
		}
		out.Paths = append(out.Paths, p)
	}
	return out
}

// leftPaths returns the paths of the tracked inodes, sorted, less those
// on bFailed, which Shutdown reports as lost instead.
func (wb *Writeback) leftPaths() []string {
	wb.mu.Lock()
	// (Gathered first: the body of a range over Table.All is a function
	// literal, in which checklocks does not see wb.mu held.)
	all := make([]*inode.Inode, 0, wb.inodes.Len())
	for in := range wb.inodes.All {
		all = append(all, in)
	}
	out := make([]string, 0, len(all))
	for _, in := range all {
		if !wb.failedLocked(in) {
			out = append(out, in.Path())
		}
	}
	wb.mu.Unlock()
	slices.Sort(out)
	return out
}

// ShutdownReport is what Registry.Shutdown could not write, by device name.
type ShutdownReport struct {
	// Left are the paths still tracked (dirty, or under writeback) when
	// ctx ended: not seen clean, whether their writeback was started or
	// their attempts failed.
	Left map[string][]string
	// GivenUp are the files whose filesystem could not be written, or
	// that the daemon may not open (EACCES, EPERM).
	GivenUp map[string][]GivenUp
	// Lost are the files whose data was lost to a failed writeback
	// (b_failed: Writeback.Failed), with the error it was lost to.
	Lost map[string][]GivenUp
	// Unverified are the files whose writeback flusherd started in
	// writeback mode and whose outcome no read of their filesystem's
	// error cursor has seen (clean, but whether the writeback failed is
	// not known): their paths (Writeback.Unverified) and how many in all,
	// by device.
	Unverified map[string]Unverified
}

// Unverified is a device's writes in writeback mode not verified at a
// shutdown: the named ones' paths, and how many files in all.
type Unverified struct {
	Paths []string
	Files int
}

// Shutdown drains every device (Drain) within ctx, giving up at once on
// files whose filesystem cannot be written (EROFS, ESHUTDOWN, ENODEV,
// ENXIO: policy.FSUnavailable), whose open the filesystem refuses (EIO,
// EUCLEAN, EBADMSG: policy.OpenFailed), or that the daemon may not open
// (EACCES, EPERM), stops the goroutines, and reports what is
// left. Files already clean are forgotten at their first attempt, so they
// are never waited on.
func (r *Registry) Shutdown(ctx context.Context) ShutdownReport {
	rep := ShutdownReport{Left: map[string][]string{}, GivenUp: map[string][]GivenUp{}, Lost: map[string][]GivenUp{}, Unverified: map[string]Unverified{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, wb := range r.Devices() {
		wb.mu.Lock()
		wb.stop.on = true
		wb.mu.Unlock()
		wg.Go(func() {
			err := wb.Drain(ctx, "shutdown")
			wb.mu.Lock()
			given := wb.stop.givenUp
			wb.stop.givenUp = nil
			wb.mu.Unlock()
			lost := append(wb.Failed(), wb.passesLost()...)
			unv := Unverified{Paths: wb.Unverified(), Files: wb.UnverifiedCount()}
			var left []string
			if err != nil {
				left = wb.leftPaths()
				for _, root := range wb.Uncovered() {
					left = append(left, root+" (files not tracked over the tracked-inode budget: their syncfs pass did not complete)")
				}
			}
			unv = unv.without(given, lost, left)
			mu.Lock()
			if err != nil {
				rep.Left[wb.Name] = left
			}
			if len(given) > 0 {
				rep.GivenUp[wb.Name] = given
			}
			if len(lost) > 0 {
				rep.Lost[wb.Name] = lost
			}
			if unv.Files > 0 {
				rep.Unverified[wb.Name] = unv
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	r.Stop()
	return rep
}

// Stop ends the goroutines without writing anything back and waits for
// them.
func (r *Registry) Stop() {
	r.mu.Lock()
	r.stop()
	r.mu.Unlock()
	r.wg.Wait()
}
