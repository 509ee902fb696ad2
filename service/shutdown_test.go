package service

import (
	"context"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"flusherd/bdi"
)

// stopRun is a Stop over fake steps that block until their context ends
// and record, in virtual time since start, when each step ended.
type stopRun struct {
	mu    sync.Mutex
	steps []string
	at    []time.Duration
	start time.Time
}

func (r *stopRun) record(step string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.steps = append(r.steps, step)
	r.at = append(r.at, time.Since(r.start).Round(time.Millisecond))
}

func (r *stopRun) stop(timeout time.Duration, sigs <-chan os.Signal, scanned chan struct{}, log *zap.Logger) *Stop {
	return &Stop{
		Timeout: timeout, Signals: sigs, Notify: NewNotifier(zap.NewNop(), SystemClock), Log: log,
		Scanned: scanned,
		StopScan: func() {
			r.record("stop scan")
			select {
			case <-scanned:
			default:
				close(scanned) // the scan, stopped
			}
		},
		Quiesce: func(ctx context.Context) { <-ctx.Done(); r.record("quiesce") },
		Settle:  func(ctx context.Context) error { r.record("settle"); return nil },
		Close:   func() { r.record("close") },
		Writeback: func(ctx context.Context) bdi.ShutdownReport {
			<-ctx.Done()
			r.record("writeback")
			return bdi.ShutdownReport{Left: map[string][]string{"7:0": {"/t/slow"}}}
		},
		Finish: func() { r.record("finish") },
	}
}

// TestStop: STOPPING=1 with EXTEND_TIMEOUT_USEC of the stop's budget
// (shutdown_timeout + 17 s); the queued events get QuiesceTimeout, the
// writeback shutdown_timeout after it, a SIGHUP meanwhile changes
// nothing, and the files left are blamed on the timeout. A second
// SIGTERM ends the writeback at once and is named instead. A scan the
// signal cut makes the last line say files may be untracked.
func TestStop(t *testing.T) {
	sd := newFakeSystemd(t)
	steps := []string{"stop scan", "quiesce", "settle", "close", "writeback", "finish"}
	t.Run("timeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := &stopRun{start: time.Now()}
			core, logs := observer.New(zap.InfoLevel)
			sigs := make(chan os.Signal, 1)
			scanned := make(chan struct{})
			close(scanned)
			s := r.stop(30*time.Second, sigs, scanned, zap.New(core))
			go func() { time.Sleep(10 * time.Second); sigs <- syscall.SIGHUP }()
			s.Run(syscall.SIGTERM)
			sd.expect(t, "stop", "STOPPING=1\nEXTEND_TIMEOUT_USEC=47000000")
			if !slices.Equal(r.steps, steps) {
				t.Fatalf("steps %q, want %q", r.steps, steps)
			}
			if want := []time.Duration{0, 2 * time.Second, 2 * time.Second, 2 * time.Second, 32 * time.Second, 32 * time.Second}; !slices.Equal(r.at, want) {
				t.Errorf("steps ended at %v, want %v", r.at, want)
			}
			if n := logs.FilterMessageSnippet("when shutdown_timeout (30s) ended").Len(); n != 1 {
				t.Errorf("%d lines blaming shutdown_timeout, want 1: %v", n, logs.All())
			}
			if n := logs.FilterMessageSnippet("second signal").Len() + logs.FilterMessageSnippet("initial scan").Len(); n != 0 {
				t.Errorf("a second signal or a cut scan logged: %v", logs.All())
			}
		})
	})
	t.Run("second signal", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := &stopRun{start: time.Now()}
			core, logs := observer.New(zap.InfoLevel)
			sigs := make(chan os.Signal, 1)
			scanned := make(chan struct{})
			close(scanned)
			s := r.stop(30*time.Second, sigs, scanned, zap.New(core))
			go func() { time.Sleep(5 * time.Second); sigs <- syscall.SIGTERM }()
			s.Run(syscall.SIGINT)
			sd.take(t)
			if i := slices.Index(r.steps, "writeback"); i < 0 || r.at[i] != 5*time.Second {
				t.Errorf("the writeback ended at %v, want 5s (the second signal): %q", r.at, r.steps)
			}
			if n := logs.FilterMessageSnippet("second signal: ending the writeback before exit now").FilterField(zap.String("signal", "terminated")).Len(); n != 1 {
				t.Errorf("%d lines taking the second signal, want 1: %v", n, logs.All())
			}
			last := logs.All()[logs.Len()-1]
			if last.Message != "exiting with files not written back" || last.ContextMap()["ended_by"] != "a second signal ended the shutdown" {
				t.Errorf("last line %q %v", last.Message, last.ContextMap())
			}
		})
	})
	t.Run("scan cut", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := &stopRun{start: time.Now()}
			core, logs := observer.New(zap.InfoLevel)
			s := r.stop(time.Second, make(chan os.Signal), make(chan struct{}), zap.New(core))
			s.Writeback = func(context.Context) bdi.ShutdownReport { return bdi.ShutdownReport{} }
			s.Run(syscall.SIGTERM)
			sd.expect(t, "stop", "STOPPING=1\nEXTEND_TIMEOUT_USEC=18000000")
			if n := logs.FilterMessageSnippet("signal received during the initial scan; stopping it").Len(); n != 1 {
				t.Errorf("%d lines about the cut scan, want 1", n)
			}
			last := logs.All()[logs.Len()-1]
			if last.Message != "exiting: the tracked files are clean, but files in the trees may be dirty and untracked" {
				t.Errorf("last line %q", last.Message)
			}
		})
	})
}
