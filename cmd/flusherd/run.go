package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/config"
	"flusherd/control"
	"flusherd/inode"
	"flusherd/internal/cli"
	"flusherd/internal/earlysig"
	"flusherd/service"
	"flusherd/sysfs"
	"flusherd/watch"
)

func cmdRun(args []string, stdout, stderr io.Writer) int {
	// From here on (from the package initialisation on, earlysig, when
	// the process was started as "flusherd run") a signal the unit or an
	// operator sends (TERM, INT, HUP) is never taken with its default
	// action (exit, for SIGHUP too): before run() is ready for them,
	// they wait in the channel.
	sigs := earlysig.Take()
	if sigs == nil {
		sigs = make(chan os.Signal, 4)
	}
	signal.Notify(sigs, earlysig.Signals...)
	defer signal.Stop(sigs)
	// Until the first file can be tracked, a SIGTERM or SIGINT ends the
	// process at once, even in a call that does not return; after that,
	// it stops the start-up and goes to the shutdown.
	guard := service.GuardStart(sigs, stderr, os.Exit)
	fset := cli.NewFlagSet("run", "run [--config FILE] [--watch DIR]... [--stats-dir DIR] [--log-level LEVEL] [--log-format FORMAT]\n\n"+
		"Watch the trees and write their dirty data back, in the foreground, logging to\n"+
		"stderr. SIGHUP reloads the configuration (an invalid one is logged and the running\n"+
		"one kept; stats.dir, watcher.*, metrics.listen and log.format wait for a restart). SIGTERM or\n"+
		"SIGINT writes every tracked file back, within writeback.shutdown_timeout, and exits\n"+
		"0; a second one ends that wait at once. Under systemd: systemctl reload|stop flusherd.",
		"flusherd run --watch ./demo-data --stats-dir ./demo-run", stdout, stderr)
	var c cli.ConfigFlags
	c.Register(fset)
	var watches cli.MultiFlag
	fset.Var(&watches, "watch", "`directory` tree to watch, recursively, in writeback mode (repeatable; added to the config's [[watch]] entries)")
	var lf logFlags
	lf.register(fset)
	if code, stop := cli.ParseFlags(fset, args); stop {
		return code
	}
	cfg, err := c.Load(watches)
	if err == nil {
		lf.apply(cfg)
		err = cfg.Validate()
	}
	if err == nil && len(cfg.Watch) == 0 && !c.ReadsFile() {
		// Without a configuration file, nothing to watch is a mistake;
		// a file that names no tree (as packaged) starts the daemon idle.
		err = errors.New("nothing to watch: give --watch DIR, or --config FILE with [[watch]] entries")
	}
	if err != nil {
		cli.PrintErr(stderr, "flusherd run", err)
		return cli.ExitUsage
	}
	if os.Getenv("GOGC") == "" {
		// Most of the heap is the tracked inodes, which live long: a
		// smaller collection headroom than Go's default 100% keeps the
		// RSS per tracked file down, for more GC work while files are
		// added (docs/benchmarks.md, memory per tracked file). GOGC in
		// the environment overrides it.
		debug.SetGCPercent(gcPercent)
	}
	level, err := zap.ParseAtomicLevel(cfg.Log.Level)
	if err != nil {
		fmt.Fprintf(stderr, "flusherd run: log.level: %v\n", err)
		return cli.ExitUsage
	}
	log := service.NewLogger(level, cfg.Log.Format, stderr)
	defer log.Sync()
	guard.SetLog(log)
	service.SetMemoryLimit(log)
	for _, n := range cfg.Notes() {
		log.Warn("configuration: " + n)
	}
	reload := func(keep func(root string, err error) bool) (*config.Config, error) {
		cfg, err := c.LoadKeeping(watches, keep)
		if err == nil {
			lf.apply(cfg)
			err = cfg.Validate()
		}
		return cfg, err
	}
	if err := run(cfg, log, level, reload, guard); err != nil {
		log.Error("flusherd failed", zap.Error(err))
		if errors.Is(err, watch.ErrBackendRefused) {
			return cli.ExitUsage // the configuration asks for what cannot be
		}
		return cli.ExitFailed
	}
	return cli.ExitOK
}

// logFlags are run's --log-level and --log-format: they override
// log.level and log.format, at start and at each reload.
type logFlags struct{ level, format string }

func (l *logFlags) register(fs *flag.FlagSet) {
	fs.Var(cli.OneOf{P: &l.level, Values: config.LogLevels}, "log-level",
		"lowest `level` logged: debug, info, warn or error; overrides log.level (default info)")
	fs.Var(cli.OneOf{P: &l.format, Values: config.LogFormats}, "log-format",
		"log line `format`: console (the fields as a JSON object after the message) or json (each line a JSON object); overrides log.format (default console)")
}

func (l logFlags) apply(cfg *config.Config) {
	if l.level != "" {
		cfg.Log.Level = l.level
	}
	if l.format != "" {
		cfg.Log.Format = l.format
	}
}

// gcPercent is the daemon's GOGC unless the environment sets one.
const gcPercent = 25

// resolveBdi names the bdi of st_dev dev, opening path O_PATH (no symlink
// followed, inode.OpenPath) for the filesystems (btrfs) whose name needs a
// descriptor.
func resolveBdi(sys sysfs.FS) func(dev uint64, path string) (string, error) {
	return func(dev uint64, path string) (string, error) {
		fd, err := inode.OpenPath(path)
		if err != nil {
			return sys.BdiName(dev, -1)
		}
		defer unix.Close(fd)
		return sys.BdiName(dev, fd)
	}
}

// run is the daemon: it starts watching, tells systemd it is ready once
// every root is watched (the initial cachestat scan goes on after that),
// serves the control socket and the metrics, pings the watchdog while the
// writeback goroutines are healthy, reloads the configuration on SIGHUP
// (reload returns the new one, validated), and on SIGTERM or SIGINT writes
// everything back within shutdown_timeout (service.Daemon). The signals
// come through guard, which serves one during start-up.
func run(cfg *config.Config, log *zap.Logger, level zap.AtomicLevel, reload func(keep func(string, error) bool) (*config.Config, error), guard *service.StartGuard) error {
	n := service.NewNotifier(log, service.SystemClock)
	if err := service.CheckCachestat(); err != nil {
		return err
	}
	unlock, err := service.ClaimStatsDir(cfg.Stats.Dir, log)
	if err != nil {
		return err
	}
	defer unlock()
	claims := service.OpenClaims(service.TreeClaimDir, log)
	defer claims.Close()
	// Until READY=1, systemd's TimeoutStartSec runs: while start-up makes
	// progress, extend it.
	start := service.StartProgress(n, len(cfg.Watch))
	defer start.Stop()
	d := &service.Daemon{Config: cfg, Load: reload, Level: level, Notify: n, Log: log, Clock: service.SystemClock,
		Handles: inode.NewHandles(), Errs: bdi.NewErrWatch(), Claims: claims, Socket: control.SocketPath(cfg.Stats.Dir)}
	defer d.Handles.Close()
	defer d.Errs.Close()
	if err := wire(d, start); err != nil {
		return err
	}
	if !guard.Track() {
		return nil // a signal came: the guard is ending the process
	}
	ctx, err := d.Start(guard.Ctx())
	if err != nil {
		return err
	}
	start.Stop()
	sigs := guard.C
	if guard.Stopped() != nil {
		// A signal during start-up: write back what was tracked
		// meanwhile (Serve returns the signal at once).
		d.Shutdown(d.Serve(sigs), sigs)
		return nil
	}

	service.WriteWatchStats(cfg.Stats.Dir, d.Wat, log)
	if ctl := listenControl(cfg.Stats.Dir, d, log); ctl != nil {
		go ctl.Serve(ctx)
		defer ctl.Close()
	}
	waitMetrics := service.StartMetrics(ctx, cfg, d.Reg, d.Wat, d.Readiness, log)
	defer waitMetrics()
	d.Ready(ctx)
	service.StartWatchdog(ctx, d.Reg, cfg.Writeback.AttemptTimeout, n, log)
	d.Shutdown(d.Serve(sigs), sigs)
	return nil
}

// wire builds the rest of d's parts for d.Config: the trees, claimed
// (another daemon's tree is an error before anything else is made), the
// device registry, the trees set up, the watcher.
func wire(d *service.Daemon, start *service.Startup) error {
	cfg, log, sys := d.Config, d.Log, sysfs.Default()
	var err error
	if d.Trees, err = service.TreesOf(cfg); err != nil {
		return err
	}
	if err := d.ClaimTrees(); err != nil {
		return err
	}
	d.Reg = bdi.NewRegistry(bdi.Options{
		Config:      service.BdiConfig(cfg),
		StatsDir:    cfg.Stats.Dir,
		StatsEvery:  min(time.Second, cfg.Writeback.DirtyWritebackInterval),
		Resolve:     resolveBdi(sys),
		Thresholds:  sys.DirtyThresholds,
		NrDirty:     sys.NrDirty,
		DiskWritten: sys.DiskWritten,
		Opener:      d.Handles,
		Handles:     d.Handles,
		Log:         log,
		Errs:        d.Errs,
		MaxTracked:  service.MaxTracked(cfg, service.GoMemoryLimit()),
	})
	if n, budget := d.Reg.TrackedInodes(); budget > 0 {
		log.Info("tracked-inode budget (writeback.max_tracked_inodes): past it, new files are not tracked and whole-filesystem passes (syncfs) write them back",
			zap.Int64("max_tracked_inodes", budget), zap.Int64("go_memory_limit", service.GoMemoryLimit()), zap.Int64("tracked", n))
	}
	service.SetUpTrees(d.Trees, d.Handles, d.Errs, start, log)
	d.Wat, err = watch.New(d.Trees, d.Reg, watch.Options{Backend: cfg.Watcher.Backend, Opener: d.Handles, Handles: d.Handles,
		RescanInterval: cfg.Watcher.RescanInterval, RetryMin: cfg.Writeback.MinPause, RetryMax: cfg.Writeback.MaxPause,
		StatsDir: cfg.Stats.Dir, Log: log, Progress: start.Offered, Opens: service.SweepInterval(cfg) != 0})
	if err != nil {
		return err
	}
	d.Reg.Observe(d.Wat.Observer())
	return nil
}

// listenControl opens the control socket in dir (nil, logged, when it
// cannot: the daemon runs on without it).
func listenControl(dir string, d *service.Daemon, log *zap.Logger) *control.Server {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		log.Error("cannot create the stats directory; flusherd sync will not reach this daemon", zap.Error(err))
		return nil
	}
	ctl, err := control.Listen(control.SocketPath(dir), service.ControlHandler(d.Reg, d.Wat), log)
	if err != nil {
		log.Error("cannot create the control socket; flusherd sync will not reach this daemon", zap.Error(err))
		return nil
	}
	return ctl
}
