package service

import (
	"bytes"
	"context"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"flusherd/bdi"
	"flusherd/config"
	"flusherd/watch"
)

// scanWatcher is a watch.Backend whose Scan returns when release is
// closed or its context ends.
type scanWatcher struct {
	watch.Backend
	release chan struct{}
}

func (w *scanWatcher) Name() string              { return "fanotify" }
func (w *scanWatcher) ScannedDirs() uint64       { return 0 }
func (w *scanWatcher) Counters() *watch.Counters { return &watch.Counters{} }
func (w *scanWatcher) Trees() []watch.TreeUse    { return nil }
func (w *scanWatcher) OnDevice(uint64) bool      { return false }
func (w *scanWatcher) Scan(ctx context.Context) {
	select {
	case <-w.release:
	case <-ctx.Done():
	}
}

// TestReadiness: /readyz fails until the initial scan has gone through
// every tree, and stays failing when the scan is cut short.
func TestReadiness(t *testing.T) {
	for _, cut := range []bool{false, true} {
		reg := bdi.NewRegistry(bdi.Options{Resolve: func(uint64, string) (string, error) { return "test", nil }})
		defer reg.Stop()
		cfg := config.Default()
		cfg.Stats.Dir = t.TempDir()
		w := &scanWatcher{release: make(chan struct{})}
		d := &Daemon{Config: cfg, Reg: reg, Wat: w, Log: zap.NewNop(), Notify: NewNotifier(zap.NewNop(), SystemClock)}
		if err := d.Readiness(); err == nil {
			t.Fatal("ready before the scan started")
		}
		ctx, cancel := context.WithCancel(context.Background())
		d.Ready(ctx)
		if err := d.Readiness(); err == nil {
			t.Error("ready while the scan runs")
		}
		if cut {
			cancel()
		} else {
			close(w.release)
		}
		<-d.scanned
		if err := d.Readiness(); (err == nil) == cut {
			t.Errorf("scan cut %v: Readiness after the scan = %v", cut, err)
		}
		cancel()
	}
}

// rootsWatcher is a watch.Backend whose WatchRoots waits for its context
// (a start-up held until a signal), and whose Run waits until Close.
type rootsWatcher struct {
	scanWatcher
	closed chan struct{}
	once   sync.Once
}

func (w *rootsWatcher) WatchRoots(ctx context.Context) error { <-ctx.Done(); return nil }
func (w *rootsWatcher) Run(ctx context.Context)              { <-w.closed }
func (w *rootsWatcher) Quiesce(context.Context)              {}
func (w *rootsWatcher) Settle(context.Context) error         { return nil }
func (w *rootsWatcher) Close() error                         { w.once.Do(func() { close(w.closed) }); return nil }

// TestStopDuringStart: a signal while the roots are being watched (after
// Track) stops the start-up between two roots; the shutdown then runs
// without the initial scan, and its last line says that files dirtied
// before the start may be untracked, not that all is clean.
func TestStopDuringStart(t *testing.T) {
	reg := bdi.NewRegistry(bdi.Options{Resolve: func(uint64, string) (string, error) { return "test", nil }})
	defer reg.Stop()
	cfg := config.Default()
	cfg.Stats.Dir = t.TempDir()
	core, logs := observer.New(zap.InfoLevel)
	w := &rootsWatcher{closed: make(chan struct{})}
	d := &Daemon{Config: cfg, Reg: reg, Wat: w, Log: zap.New(core), Notify: NewNotifier(zap.NewNop(), SystemClock)}
	sigs := make(chan os.Signal, 4)
	g := GuardStart(sigs, &bytes.Buffer{}, func(int) { t.Error("exit called after Track") })
	g.SetLog(d.Log)
	if !g.Track() {
		t.Fatal("Track = false")
	}
	started := make(chan error, 1)
	go func() { _, err := d.Start(g.Ctx()); started <- err }()
	select {
	case err := <-started:
		t.Fatalf("Start returned (%v) before the signal", err)
	case <-time.After(100 * time.Millisecond):
	}
	sigs <- syscall.SIGTERM
	select {
	case err := <-started:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Start did not return within 5 s of SIGTERM")
	}
	if g.Stopped() != syscall.SIGTERM {
		t.Fatalf("Stopped = %v", g.Stopped())
	}
	d.Shutdown(d.Serve(g.C), g.C)
	if logs.FilterMessage("signal received during start-up; stopping").Len() != 1 {
		t.Error("no log line for the signal during start-up")
	}
	last := logs.All()[logs.Len()-1]
	if last.Message != "exiting: the tracked files are clean, but files in the trees may be dirty and untracked" {
		t.Errorf("last line %q: want the one that does not say all is clean", last.Message)
	}
	close(sigs)
}
