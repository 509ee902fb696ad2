package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/config"
	"flusherd/control"
	"flusherd/inode"
	"flusherd/policy"
	"flusherd/sysfs"
	"flusherd/watch"
)

func cmdRun(args []string, stdout, stderr io.Writer) int {
	fset := newFlagSet("run", "run [--config FILE] [--watch DIR]... [--stats-dir DIR]",
		"flusherd run --watch ./demo-data --stats-dir ./demo-run", stderr)
	var c commonFlags
	c.register(fset)
	var watches multiFlag
	fset.Var(&watches, "watch", "directory tree to watch, recursively, in writeback mode (repeatable; added to the config's [[watch]] entries)")
	if code, stop := parseFlags(fset, args); stop {
		return code
	}
	cfg, err := loadConfig(c, watches)
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		fmt.Fprintf(stderr, "flusherd run: %v\n", err)
		return exitUsage
	}
	log, err := newLogger(cfg.Log.Level, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "flusherd run: %v\n", err)
		return exitUsage
	}
	defer log.Sync()
	if err := run(cfg, log); err != nil {
		log.Error("flusherd failed", zap.Error(err))
		return exitFailed
	}
	return exitOK
}

// newLogger logs to w at level. Under systemd (JOURNAL_STREAM set) it
// writes no timestamp, since the journal adds its own, and starts each line
// with the sd-daemon(3) priority prefix ("<3>" error, "<4>" warning, "<6>"
// info, "<7>" debug), which the journal maps to the entry's priority.
func newLogger(level string, w io.Writer) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("log.level: %w", err)
	}
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	ec.EncodeLevel = zapcore.CapitalLevelEncoder
	if os.Getenv("JOURNAL_STREAM") != "" {
		ec.TimeKey = ""
		ec.EncodeLevel = journalLevel
	}
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(ec), zapcore.Lock(zapcore.AddSync(w)), lvl)
	return zap.New(core), nil
}

// journalLevel writes the level with its sd-daemon(3) prefix.
func journalLevel(l zapcore.Level, enc zapcore.PrimitiveArrayEncoder) {
	prio := 6 // SD_INFO
	switch {
	case l >= zapcore.ErrorLevel:
		prio = 3 // SD_ERR
	case l == zapcore.WarnLevel:
		prio = 4 // SD_WARNING
	case l <= zapcore.DebugLevel:
		prio = 7 // SD_DEBUG
	}
	enc.AppendString(fmt.Sprintf("<%d>%s", prio, l.CapitalString()))
}

// bdiConfig maps the [writeback] and [plug] tables to a device's tunables.
func bdiConfig(cfg *config.Config) bdi.Config {
	req := policy.IOWait
	if cfg.Writeback.RequeueBlocked == config.RequeueRedirtyTail {
		req = policy.LegacyRedirtyTail
	}
	return bdi.Config{
		DirtyWritebackInterval: cfg.Writeback.DirtyWritebackInterval,
		MinPause:               cfg.Writeback.MinPause,
		MaxPause:               cfg.Writeback.MaxPause,
		WriteChunk:             cfg.Writeback.WriteChunk,
		Requeue:                req,
		PlugEnabled:            cfg.Plug.Enabled,
		MaxPending:             cfg.Plug.MaxPending,
		QueueDepth:             cfg.Plug.QueueDepth,
		IntegritySyncfs:        cfg.Plug.IntegritySyncfs,
		AttemptTimeout:         cfg.Writeback.AttemptTimeout,
	}
}

// resolveBdi names the bdi of st_dev dev, opening path O_PATH for the
// filesystems (btrfs) whose name needs a descriptor.
func resolveBdi(sys sysfs.FS) func(dev uint64, path string) (string, error) {
	return func(dev uint64, path string) (string, error) {
		fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return sys.BdiName(dev, -1)
		}
		defer unix.Close(fd)
		return sys.BdiName(dev, fd)
	}
}

func run(cfg *config.Config, log *zap.Logger) error {
	sys := sysfs.Default()
	handles := inode.NewHandles()
	defer handles.Close()
	reg := bdi.NewRegistry(bdi.Options{
		Config:     bdiConfig(cfg),
		StatsDir:   cfg.Stats.Dir,
		StatsEvery: min(time.Second, cfg.Writeback.DirtyWritebackInterval),
		Resolve:    resolveBdi(sys),
		Thresholds: sys.DirtyThresholds,
		Opener:     handles,
		Log:        log,
	})
	trees := make([]watch.Tree, 0, len(cfg.Watch))
	for _, w := range cfg.Watch {
		root, err := filepath.EvalSymlinks(w.Path)
		if err != nil {
			return fmt.Errorf("watch %s: %w", w.Path, err)
		}
		trees = append(trees, watch.Tree{Root: root, Recursive: w.Recursive,
			Tree: bdi.Tree{Expire: w.Expire, Integrity: w.Mode == config.ModeIntegrity}})
		log.Info("watching", zap.String("root", strconv.Quote(root)), zap.Bool("recursive", w.Recursive),
			zap.String("mode", w.Mode), zap.Stringer("expire", w.Expire))
		if _, err := handles.AddMount(root); err != nil {
			log.Info("files of this tree are opened by path, not by file handle", zap.String("root", strconv.Quote(root)), zap.Error(err))
		}
	}
	wat, err := watch.New(trees, reg, watch.Options{Backend: cfg.Watcher.Backend, Opener: handles,
		RescanInterval: cfg.Watcher.RescanInterval, StatsDir: cfg.Stats.Dir, Log: log})
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	// Events are read while the initial scan runs, so the queue cannot
	// overflow during a long scan.
	go func() { defer close(done); wat.Run(ctx) }()
	// The start-up scan can take long on a big tree: a SIGTERM during it
	// stops the scan and goes straight to the shutdown writeback.
	started := make(chan error, 1)
	go func() { started <- wat.Start(ctx) }()
	var stopSig os.Signal
wait:
	for {
		select {
		case err := <-started:
			if err != nil {
				cancel()
				wat.Close()
				<-done
				reg.Stop()
				return err
			}
			break wait
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				log.Info("SIGHUP during the start-up scan: ignored")
				continue
			}
			log.Info("signal received during the start-up scan; stopping it", zap.String("signal", sig.String()))
			stopSig = sig
			cancel()
			<-started
			break wait
		}
	}
	if stopSig == nil {
		if err := watch.WriteStats(cfg.Stats.Dir, wat.Name(), wat.Counters()); err != nil {
			log.Warn("cannot write the watch stats file", zap.Error(err))
		}
		sock := socketPath(cfg.Stats.Dir)
		var ctl *control.Server
		if err := os.MkdirAll(cfg.Stats.Dir, 0o755); err != nil {
			log.Error("cannot create the stats directory; flusherd sync will not reach this daemon", zap.Error(err))
		} else if ctl, err = control.Listen(sock, controlHandler(reg, wat), log); err != nil {
			log.Error("cannot create the control socket; flusherd sync will not reach this daemon", zap.Error(err))
		} else {
			go ctl.Serve(ctx)
			defer ctl.Close()
		}
		waitMetrics := startMetrics(ctx, cfg, reg, wat, log)
		defer waitMetrics()
		log.Info("initial scan done; ready", zap.Int("devices", len(reg.Devices())), zap.String("socket", sock))
		if _, err := daemon.SdNotify(false, daemon.SdNotifyReady); err != nil {
			log.Warn("sd_notify READY failed", zap.Error(err))
		}
		for sig := range sigs {
			if sig == syscall.SIGHUP {
				log.Info("SIGHUP: configuration reload is not implemented yet; the running configuration is unchanged")
				continue
			}
			stopSig = sig
			break
		}
	}
	log.Info("writing back every tracked file before exit",
		zap.String("signal", stopSig.String()), zap.Stringer("timeout", cfg.Writeback.ShutdownTimeout))
	daemon.SdNotify(false, daemon.SdNotifyStopping)
	cancel()
	wat.Close()
	<-done
	sctx, scancel := context.WithTimeout(context.Background(), cfg.Writeback.ShutdownTimeout)
	defer scancel()
	left := reg.Shutdown(sctx)
	if len(left) == 0 {
		log.Info("every tracked file is clean; exiting")
		return nil
	}
	for dev, paths := range left {
		shown := make([]string, 0, 20)
		for _, p := range paths[:min(len(paths), 20)] {
			shown = append(shown, strconv.Quote(p))
		}
		log.Error("shutdown timeout: files still dirty or under writeback (the kernel will still write them)",
			zap.String("bdi", dev), zap.Int("files", len(paths)), zap.Strings("first", shown))
	}
	return nil
}
