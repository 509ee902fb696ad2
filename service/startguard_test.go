package service

import (
	"bytes"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
)

// exitRecorder is a StartGuard's exit that records its calls.
type exitRecorder struct {
	mu    sync.Mutex
	codes []int
	done  chan struct{}
}

func newExitRecorder() *exitRecorder { return &exitRecorder{done: make(chan struct{}, 4)} }

func (e *exitRecorder) exit(code int) {
	e.mu.Lock()
	e.codes = append(e.codes, code)
	e.mu.Unlock()
	e.done <- struct{}{}
}

func (e *exitRecorder) calls() []int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]int(nil), e.codes...)
}

func recv(t *testing.T, c <-chan os.Signal) os.Signal {
	t.Helper()
	select {
	case s := <-c:
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("no signal relayed within 5 s")
		return nil
	}
}

// TestStartGuardBeforeTrack: a SIGTERM before Track ends the process
// (exit 0, the message on stderr before SetLog), cancels Ctx, and Track
// then refuses; the signal is still relayed.
func TestStartGuardBeforeTrack(t *testing.T) {
	for _, sig := range []os.Signal{syscall.SIGTERM, syscall.SIGINT} {
		sigs := make(chan os.Signal, 4)
		var stderr bytes.Buffer
		ex := newExitRecorder()
		g := GuardStart(sigs, &stderr, ex.exit)
		sigs <- syscall.SIGHUP
		if got := recv(t, g.C); got != syscall.SIGHUP {
			t.Fatalf("relayed %v, want SIGHUP", got)
		}
		if g.Ctx().Err() != nil || len(ex.calls()) != 0 || g.Stopped() != nil {
			t.Fatal("a SIGHUP stopped the start-up")
		}
		sigs <- sig
		<-ex.done
		if got := recv(t, g.C); got != sig {
			t.Errorf("relayed %v, want %v", got, sig)
		}
		if c := ex.calls(); len(c) != 1 || c[0] != 0 {
			t.Errorf("%v before Track: exit calls %v, want [0]", sig, c)
		}
		if g.Ctx().Err() == nil {
			t.Errorf("%v: Ctx not ended", sig)
		}
		if !strings.Contains(stderr.String(), "before any file was tracked") {
			t.Errorf("stderr %q does not say why it exits", stderr.String())
		}
		if g.Track() {
			t.Errorf("Track after %v = true, want false", sig)
		}
		if g.Stopped() != sig {
			t.Errorf("Stopped = %v, want %v", g.Stopped(), sig)
		}
		close(sigs)
		if _, ok := <-g.C; ok {
			t.Error("C not closed after sigs")
		}
	}
}

// TestStartGuardAfterTrack: after Track a SIGTERM only ends Ctx (the
// start-up goes to the shutdown); a second one is relayed too, and
// nothing exits.
func TestStartGuardAfterTrack(t *testing.T) {
	sigs := make(chan os.Signal, 4)
	ex := newExitRecorder()
	g := GuardStart(sigs, &bytes.Buffer{}, ex.exit)
	g.SetLog(zap.NewNop())
	if !g.Track() {
		t.Fatal("Track = false with no signal")
	}
	sigs <- syscall.SIGTERM
	if got := recv(t, g.C); got != syscall.SIGTERM {
		t.Fatalf("relayed %v", got)
	}
	select {
	case <-g.Ctx().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Ctx not ended by SIGTERM")
	}
	sigs <- syscall.SIGINT
	if got := recv(t, g.C); got != syscall.SIGINT {
		t.Fatalf("relayed %v", got)
	}
	if c := ex.calls(); len(c) != 0 {
		t.Errorf("exit called %v after Track", c)
	}
	if g.Stopped() != syscall.SIGTERM {
		t.Errorf("Stopped = %v, want the first, SIGTERM", g.Stopped())
	}
	close(sigs)
}
