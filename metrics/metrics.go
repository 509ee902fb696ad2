// Package metrics exports flusherd's statistics in the Prometheus format:
// the figures of the stats files (<stats.dir>/bdi/<dev>/stats and
// <stats.dir>/watch/stats), per device and for the watcher.
//
// The Collector reads the live objects when it is scraped, through a
// Source; nothing runs between scrapes (no goroutine, no timer). Serve
// answers GET /metrics over HTTP until its context ends.
package metrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"flusherd/bdi"
	"flusherd/policy"
	"flusherd/watch"
)

// Device is one backing device's figures at the time of a scrape.
type Device struct {
	Name        string        // the kernel's name of the bdi ("8:0", "btrfs-1")
	Stats       bdi.Stats     // page counts in pages
	MaxDirtyAge time.Duration // age of the oldest dirty data; 0 when nothing is tracked
}

// Tree is one watched tree's figures at the time of a scrape
// (bdi.Registry.TreeTotals).
type Tree struct {
	Root      string
	Totals    bdi.TreeTotals
	OldestAge time.Duration // of its oldest dirty data; 0 when none is dirty
	Exposure  bdi.Exposure
}

// Source gives the Collector the figures to export. It is called at every
// scrape, possibly from several goroutines at once.
type Source interface {
	// Devices returns one entry per device, each name once.
	Devices() []Device
	// Watch returns the watcher backend's name ("fanotify" or "inotify")
	// and its counters; nil counters leave the watcher's metrics out.
	Watch() (backend string, c *watch.Counters)
	// Trees returns one entry per watched tree, each root once.
	Trees() []Tree
}

// Watcher is what the metrics read of a watch.Backend.
type Watcher interface {
	Name() string
	Counters() *watch.Counters
	Trees() []watch.TreeUse
}

// NewSource returns a Source over the daemon's live registry and watcher
// backend (w may be nil: no watcher metrics).
func NewSource(reg *bdi.Registry, w Watcher) Source {
	return liveSource{reg: reg, w: w}
}

type liveSource struct {
	reg *bdi.Registry
	w   Watcher
}

func (s liveSource) Devices() []Device {
	wbs := s.reg.Devices()
	out := make([]Device, 0, len(wbs))
	for _, wb := range wbs {
		out = append(out, Device{Name: wb.Name, Stats: wb.Snapshot(), MaxDirtyAge: wb.MaxDirtyAge()})
	}
	return out
}

func (s liveSource) Trees() []Tree {
	if s.w == nil {
		return nil
	}
	var roots []string
	for _, u := range s.w.Trees() {
		roots = append(roots, u.Root)
	}
	now := s.reg.Now()
	out := make([]Tree, 0, len(roots))
	for _, t := range s.reg.TreeTotals(roots) {
		out = append(out, Tree{Root: t.Root, Totals: t, OldestAge: t.OldestAge(now), Exposure: t.Exposure(now)})
	}
	return out
}

func (s liveSource) Watch() (string, *watch.Counters) {
	if s.w == nil {
		return "", nil
	}
	return s.w.Name(), s.w.Counters()
}

// errorKinds are the outcomes of failed attempts, exported as the kind
// label of flusherd_writeback_errors_total. Blocked, FSUnavailable and
// IOError add up to writeback_errors in the stats file; Gone is not in
// it (the file is dropped and counted in inodes_gone, unless it lives on
// under another name).
var errorKinds = []policy.Outcome{policy.Blocked, policy.FSUnavailable, policy.IOError, policy.Gone}

// Collector is a prometheus.Collector over a Source.
type Collector struct {
	src      Source
	pageSize float64

	inodes, dirty, writeback, retryPause, maxDirtyAge, stuckCalls     *prometheus.Desc
	written, plugRequests, plugMerges, plugBatches, wbErrors, rescans *prometheus.Desc
	watchEvents, watchOverflows, watchRescans, watchUnwatched         *prometheus.Desc
	watchBackend                                                      *prometheus.Desc
	backgroundWorks, rangeWritebacks, inflight, bandwidth, dirtied    *prometheus.Desc
	inflightWindow                                                    *prometheus.Desc
	pace                                                              *prometheus.Desc
	probing, throttled, detachedCalls, inodesGone                     *prometheus.Desc
	listLockMax, loopStallMax, sweepCandidates, sweepFound            *prometheus.Desc
	watchNested, watchUnserved, watchQuieted                          *prometheus.Desc
	treeTracked, treeDirty, treeOldest, treeWritten, treeErrors       *prometheus.Desc
	treeExposure                                                      *prometheus.Desc
	overBudget, untracked, syncfsPasses, syncfsErrors                 *prometheus.Desc
}

// NewCollector returns a Collector over src; pageSize (bytes) converts the
// page counts of bdi.Stats to bytes.
func NewCollector(src Source, pageSize int) *Collector {
	dev := []string{"bdi"}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("flusherd_"+name, help, labels, nil)
	}
	return &Collector{
		src:      src,
		pageSize: float64(pageSize),

		inodes: d("inodes", "Tracked files on each of the device's writeback lists: b_dirty (dirty, not yet due), "+
			"b_io (picked for this pass or under an attempt), b_more_io (write_chunk used up, more to write), "+
			"b_more_io_wait (could not be written now, retried after a pause), failed (data lost after a failed "+
			"writeback, until written again; failed_files in the stats file).", "bdi", "list"),
		dirty: d("dirty_bytes", "Dirty page-cache data in tracked files, as cachestat saw it at each file's last "+
			"writeback attempt or background check (BdiReclaimable).", dev...),
		writeback: d("writeback_bytes", "Page-cache data under writeback in tracked files, as cachestat saw it at "+
			"each file's last writeback attempt or background check (BdiWriteback, inflight_bytes).", dev...),
		retryPause: d("retry_pause_seconds", "Current pause before files on b_more_io_wait are retried; "+
			"0 when none waits.", dev...),
		maxDirtyAge: d("max_dirty_age_seconds", "Age of the oldest dirty data of a tracked file on the device; "+
			"0 when nothing is tracked.", dev...),
		stuckCalls: d("stuck_calls", "Writeback system calls that exceeded attempt_timeout and have not returned "+
			"(a frozen or hung filesystem; stuck_calls).", dev...),
		written:      d("written_bytes_total", "Data written back by flusherd (BdiWritten).", dev...),
		plugRequests: d("plug_requests_total", "Writeback requests queued in the plug (plug_requests).", dev...),
		plugMerges:   d("plug_merges_total", "Writeback requests merged into a neighbour in the plug (plug_merges).", dev...),
		plugBatches:  d("plug_batches_total", "Plug flushes: batches of writeback requests submitted (plug_batches).", dev...),
		wbErrors: d("writeback_errors_total", "Failed writeback attempts by kind: blocked (EAGAIN, EBUSY, EINTR, "+
			"EMFILE, ENFILE, or longer than attempt_timeout), fs_unavailable (EROFS, ESHUTDOWN, ENODEV, ENXIO), "+
			"io_error (EIO, ENOSPC, EDQUOT and other errors), gone (the file was deleted or replaced; it is dropped).",
			"bdi", "kind"),
		rescans: d("rescans_total", "Cachestat rescans of trees on the device (after an event queue overflow, "+
			"and of directories inotify could not watch; rescans).", dev...),
		watchEvents:    d("watch_events_total", "Events the watcher read from the kernel."),
		watchOverflows: d("watch_overflows_total", "Event queue overflows (each is followed by a rescan of the trees)."),
		watchRescans:   d("watch_rescans_total", "Cachestat rescans of the watched trees (rescans)."),
		watchUnwatched: d("watch_unwatched_directories", "Directories inotify could not watch (fs.inotify.max_user_watches "+
			"reached); they are rescanned every watcher.rescan_interval."),
		backgroundWorks: d("background_works_total", "Background writeback works run: the tracked files' dirty data was "+
			"over dirty_background_bytes or dirty_background_ratio (background_works).", dev...),
		rangeWritebacks: d("range_writebacks_total", "Range writebacks behind streaming writers (range_bytes; "+
			"range_writebacks).", dev...),
		inflight: d("inflight_bytes", "Data under writeback in tracked files (inflight_bytes; what "+
			"max_inflight_bytes bounds).", dev...),
		inflightWindow: d("inflight_window_bytes", "What may be under writeback before big files, ranges and background "+
			"work wait: writeback.target_latency × the write bandwidth, at most max_inflight_bytes; 0: no bound (window_bytes).", dev...),
		pace: d("pace_bytes_per_second", "The pace flusherd starts writeback at on the device: a share of its "+
			"write rate as measured while flusherd's writeback filled the window (writeback.target_latency); 0: none (pace_kBps).", dev...),
		bandwidth: d("write_bandwidth_bytes_per_second", "The device's completed write bandwidth, smoothed as the "+
			"kernel's wb_update_write_bandwidth (BdiWriteBandwidth).", dev...),
		dirtied: d("dirtied_bytes_total", "Data seen newly dirty in tracked files (BdiDirtied).", dev...),
		probing: d("probing", "1 while the device is probed with one file per retry pause: every retry failed with the "+
			"same device-level error (ENOTCONN, ENODEV, EROFS, EIO on open, attempt_timeout; probing).", dev...),
		throttled: d("throttled_total", "Attempts deferred: big files and ranges while max_inflight_bytes was under "+
			"writeback, any file while 1,024 calls were outstanding (throttled).", dev...),
		detachedCalls: d("detached_calls_total", "Background writeback calls left to finish on their worker after 100 ms "+
			"(a slow device); the file is retried once each returns (detached_calls).", dev...),
		inodesGone:  d("inodes_gone_total", "Tracked files dropped because they were deleted or replaced (inodes_gone).", dev...),
		listLockMax: d("list_lock_max_seconds", "The longest time the device's list lock was held (list_lock_max_us).", dev...),
		loopStallMax: d("loop_stall_max_seconds", "The longest time the device's goroutine, awake, went without a sign "+
			"of life (loop_stall_max_us).", dev...),
		sweepCandidates: d("sweep_candidates", "Files open or mapped in the trees, looked at with cachestat every "+
			"watcher.sweep_interval for data dirtied without an event (sweep_candidates).", dev...),
		sweepFound: d("sweep_found_total", "Files the sweep found dirty and not tracked: dirtied without an event, "+
			"through a shared mapping or Linux AIO (sweep_found).", dev...),
		watchNested:   d("watch_nested_mounts", "Filesystems mounted inside a watched tree that are served (nested_mounts)."),
		watchUnserved: d("watch_unserved_mounts", "Filesystems mounted inside a watched tree that cannot be served, each logged with the reason (unserved_mounts)."),
		watchQuieted: d("watch_quieted_total", "Times a file written continually was quieted: its events ignored until its "+
			"next writeback attempt (fanotify; quieted)."),
		watchBackend: d("watch_backend_info", "The watcher backend in use, in the label backend (fanotify or inotify); always 1.",
			"backend"),
		treeTracked: d("tree_tracked_files", "Tracked files of the tree on a writeback list (a nested tree's files are its own).", "tree"),
		treeDirty: d("tree_dirty_bytes", "Dirty page-cache data in the tree's tracked files, as cachestat last saw it "+
			"(their share of flusherd_dirty_bytes).", "tree"),
		treeOldest: d("tree_oldest_dirty_age_seconds", "Age of the oldest dirty data of a tracked file of the tree; "+
			"0 when none is dirty. Compare with the tree's expire.", "tree"),
		treeWritten: d("tree_written_bytes_total", "Data of the tree's files written back by flusherd.", "tree"),
		treeErrors:  d("tree_writeback_errors_total", "Failed writeback attempts of the tree's files.", "tree"),
		overBudget: d("over_budget", "1 while the device does not track new files: the tracked files of all devices "+
			"reached writeback.max_tracked_inodes, and whole-filesystem passes (syncfs) write the files not tracked (over_budget).", dev...),
		untracked: d("untracked_reports_total", "Reports of new files not tracked over the tracked-inode budget; "+
			"whole-filesystem passes write them (untracked_reports).", dev...),
		syncfsPasses: d("syncfs_passes_total", "Whole-filesystem passes (syncfs) completed over the tracked-inode budget "+
			"(syncfs_passes).", dev...),
		syncfsErrors: d("syncfs_errors_total", "Whole-filesystem passes that reported a writeback error or could not be "+
			"made (syncfs_errors).", dev...),
		treeExposure: d("tree_exposure_seconds", "How long data of the tree's files stayed dirty before flusherd began "+
			"writing it: from a file's first dirtying to the attempt that first wrote it.", "tree"),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.inodes, c.dirty, c.writeback, c.retryPause, c.maxDirtyAge, c.stuckCalls,
		c.written, c.plugRequests, c.plugMerges, c.plugBatches, c.wbErrors, c.rescans,
		c.watchEvents, c.watchOverflows, c.watchRescans, c.watchUnwatched, c.watchBackend,
		c.backgroundWorks, c.rangeWritebacks, c.inflight, c.inflightWindow, c.pace, c.bandwidth, c.dirtied, c.probing,
		c.throttled, c.detachedCalls, c.inodesGone, c.listLockMax, c.loopStallMax,
		c.sweepCandidates, c.sweepFound,
		c.watchNested, c.watchUnserved, c.watchQuieted,
		c.treeTracked, c.treeDirty, c.treeOldest, c.treeWritten, c.treeErrors, c.treeExposure,
		c.overBudget, c.untracked, c.syncfsPasses, c.syncfsErrors,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: it reads the Source now.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	bytes := func(pages uint64) float64 { return float64(pages) * c.pageSize }
	for _, dev := range c.src.Devices() {
		s, n := &dev.Stats, dev.Name
		gauge(c.inodes, float64(s.BDirty), n, "b_dirty")
		gauge(c.inodes, float64(s.BIO), n, "b_io")
		gauge(c.inodes, float64(s.BMoreIO), n, "b_more_io")
		gauge(c.inodes, float64(s.BMoreIOWait), n, "b_more_io_wait")
		gauge(c.inodes, float64(s.FailedFiles), n, "failed")
		gauge(c.dirty, bytes(s.BdiReclaimable), n)
		gauge(c.writeback, bytes(s.BdiWriteback), n)
		gauge(c.retryPause, float64(s.RetryPauseMs)/1e3, n)
		gauge(c.stuckCalls, float64(s.StuckCalls), n)
		gauge(c.maxDirtyAge, dev.MaxDirtyAge.Seconds(), n)
		ch <- prometheus.MustNewConstMetric(c.written, prometheus.CounterValue, bytes(s.BdiWritten), n)
		counter(c.plugRequests, s.PlugRequests, n)
		counter(c.plugMerges, s.PlugMerges, n)
		counter(c.plugBatches, s.PlugBatches, n)
		for _, o := range errorKinds {
			counter(c.wbErrors, s.Outcomes[o], n, o.String())
		}
		counter(c.rescans, s.Rescans, n)
		counter(c.backgroundWorks, s.BackgroundWorks, n)
		counter(c.rangeWritebacks, s.RangeWritebacks, n)
		gauge(c.inflight, float64(s.InflightBytes), n)
		gauge(c.inflightWindow, float64(s.InflightWindowBytes), n)
		gauge(c.pace, float64(s.PaceKBps)*1024, n)
		gauge(c.bandwidth, float64(s.BdiWriteBandwidth)*1024, n)
		ch <- prometheus.MustNewConstMetric(c.dirtied, prometheus.CounterValue, bytes(s.BdiDirtied), n)
		gauge(c.probing, float64(s.Probing), n)
		counter(c.throttled, s.Throttled, n)
		counter(c.detachedCalls, s.DetachedCalls, n)
		counter(c.inodesGone, s.InodesGone, n)
		gauge(c.listLockMax, float64(s.ListLockMaxUs)/1e6, n)
		gauge(c.loopStallMax, float64(s.LoopStallMaxUs)/1e6, n)
		gauge(c.sweepCandidates, float64(s.SweepCandidates), n)
		counter(c.sweepFound, s.SweepFound, n)
		gauge(c.overBudget, float64(s.OverBudget), n)
		counter(c.untracked, s.UntrackedReports, n)
		counter(c.syncfsPasses, s.SyncfsPasses, n)
		counter(c.syncfsErrors, s.SyncfsErrors, n)
	}
	for _, t := range c.src.Trees() {
		gauge(c.treeTracked, float64(t.Totals.Tracked), t.Root)
		gauge(c.treeDirty, bytes(t.Totals.DirtyPages), t.Root)
		gauge(c.treeOldest, t.OldestAge.Seconds(), t.Root)
		ch <- prometheus.MustNewConstMetric(c.treeWritten, prometheus.CounterValue, bytes(t.Totals.Written), t.Root)
		counter(c.treeErrors, t.Totals.Errors, t.Root)
		buckets := make(map[float64]uint64, len(bdi.ExposureBuckets))
		for i, b := range bdi.ExposureBuckets {
			if i < len(t.Exposure.Buckets) {
				buckets[b] = t.Exposure.Buckets[i]
			} else {
				buckets[b] = 0 // no observation
			}
		}
		ch <- prometheus.MustNewConstHistogram(c.treeExposure, t.Exposure.Count, t.Exposure.Sum, buckets, t.Root)
	}
	backend, w := c.src.Watch()
	if w == nil {
		return
	}
	counter(c.watchEvents, w.Events.Load())
	counter(c.watchOverflows, w.Overflows.Load())
	counter(c.watchRescans, w.Rescans.Load())
	gauge(c.watchUnwatched, float64(w.Unwatched.Load()))
	gauge(c.watchNested, float64(w.Nested.Load()))
	gauge(c.watchUnserved, float64(w.Unserved.Load()))
	counter(c.watchQuieted, w.Quieted.Load())
	gauge(c.watchBackend, 1, backend)
}

// NewRegistry returns a registry holding a Collector over src and the Go
// runtime and process collectors (go_*, process_*). Those are included
// because operators of Go daemons expect them, as node_exporter and most
// exporters serve them: memory, goroutines (one per device, plus the
// watcher), open file descriptors and CPU time of flusherd itself, next to
// the writeback it does. Both read their figures at scrape time as well.
func NewRegistry(src Source, pageSize int) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(src, pageSize),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Timeouts of the HTTP server. A scrape is small and quick; these bound
// what a slow or stuck client can hold.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 2 * time.Minute
	shutdownTimeout   = 5 * time.Second
	maxInFlight       = 4 // concurrent scrapes; more get 503
)

// Probes answers the health endpoints. Each returns nil when the daemon
// passes, else why not; a nil field leaves its endpoint out (404).
type Probes struct {
	Live  func() error // /healthz: every device's writeback goroutine is alive
	Ready func() error // /readyz: the initial scan is done
}

// Handler serves the metrics of g at /metrics, p's health endpoints at
// /healthz and /readyz (200 "ok", or 503 and the reason), and a short
// page naming them at /.
func Handler(g prometheus.Gatherer, p Probes, log *zap.Logger) http.Handler {
	if log == nil {
		log = zap.NewNop()
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorLog:            promLogger{log},
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: maxInFlight,
	}))
	probe(mux, "/healthz", p.Live)
	probe(mux, "/readyz", p.Ready)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("flusherd: metrics at /metrics, health at /healthz and /readyz\n"))
	})
	return mux
}

// probe serves check at path: 200 "ok" when it returns nil, else 503 and
// the error; GET and HEAD only.
func probe(mux *http.ServeMux, path string, check func() error) {
	if check == nil {
		return
	}
	mux.HandleFunc("GET "+path, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := check(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(err.Error() + "\n"))
			return
		}
		w.Write([]byte("ok\n"))
	})
}

// promLogger logs promhttp's errors (a failed collection or a write to a
// client that went away).
type promLogger struct{ log *zap.Logger }

func (l promLogger) Println(v ...any) {
	l.log.Sugar().Warnln(append([]any{"metrics:"}, v...)...)
}

// Serve serves Handler(g, p) on ln until ctx ends, then shuts the server down
// (waiting up to 5s for scrapes in progress) and returns nil. It closes
// ln. An error of the listener ends it early with that error.
func Serve(ctx context.Context, ln net.Listener, g prometheus.Gatherer, p Probes, log *zap.Logger) error {
	if log == nil {
		log = zap.NewNop()
	}
	errLog, _ := zap.NewStdLogAt(log, zapcore.WarnLevel) // the level is valid
	srv := &http.Server{
		Handler:           Handler(g, p, log),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          errLog,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if err != nil {
		srv.Close()
	}
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}
