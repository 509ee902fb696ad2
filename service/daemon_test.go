package service

import (
	"context"
	"testing"

	"go.uber.org/zap"

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
