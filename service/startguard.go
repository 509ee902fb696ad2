package service

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"

	"go.uber.org/zap"
)

// StartGuard serves SIGTERM and SIGINT during start-up, before Serve reads
// the signals. Every signal is relayed to C, in order, for Serve and the
// stop. The first SIGTERM or SIGINT cancels Ctx, so that the start-up
// stops between two roots (watch.Backend.WatchRoots), and, while no file
// can have been tracked yet (Track not called), it ends the process at
// once with status 0: nothing has been promised, and the kernel's
// flusher still writes back what is dirty. That covers a start-up held in
// a call that does not return (a root on a FUSE filesystem that does not
// answer).
type StartGuard struct {
	C      chan os.Signal
	ctx    context.Context
	cancel context.CancelFunc
	exit   func(code int)
	stderr io.Writer

	mu       sync.Mutex
	log      *zap.Logger // nil until SetLog: stderr
	tracking bool        // Track was called
	sig      os.Signal   // the first SIGTERM or SIGINT; nil: none yet
}

// GuardStart relays sigs (until it is closed) to the returned guard's C.
// exit ends the process (os.Exit; a test passes its own); until SetLog,
// the guard's one message goes to stderr.
func GuardStart(sigs <-chan os.Signal, stderr io.Writer, exit func(code int)) *StartGuard {
	ctx, cancel := context.WithCancel(context.Background())
	g := &StartGuard{C: make(chan os.Signal, 16), ctx: ctx, cancel: cancel, exit: exit, stderr: stderr}
	go g.relay(sigs)
	return g
}

// SetLog sends the guard's message to log from now on.
func (g *StartGuard) SetLog(log *zap.Logger) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.log = log
}

func (g *StartGuard) relay(sigs <-chan os.Signal) {
	defer close(g.C)
	for sig := range sigs {
		if sig != syscall.SIGHUP {
			g.stop(sig)
		}
		select {
		case g.C <- sig:
		default:
			// 16 signals not yet read: Serve is not reading. A
			// SIGHUP more changes nothing; a SIGTERM is already
			// held (stop).
		}
	}
}

// stop records the first SIGTERM or SIGINT and cancels Ctx; before Track,
// it ends the process.
func (g *StartGuard) stop(sig os.Signal) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.sig != nil {
		return
	}
	g.sig = sig
	g.cancel()
	if !g.tracking {
		const msg = "signal received during start-up, before any file was tracked; exiting (the kernel's flusher writes back what is dirty)"
		if g.log != nil {
			g.log.Info(msg, zap.String("signal", sig.String()))
			_ = g.log.Sync()
		} else {
			fmt.Fprintf(g.stderr, "flusherd run: %s: %s\n", sig, msg)
		}
		g.exit(0)
	}
}

// Ctx ends at the first SIGTERM or SIGINT.
func (g *StartGuard) Ctx() context.Context { return g.ctx }

// Track is called before the first file can be tracked (the watcher's
// events are read): from then on a signal no longer ends the process but
// only Ctx, and the stop writes back what is tracked. It reports false,
// having changed nothing, when a signal came first (the process is
// ending).
func (g *StartGuard) Track() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.sig != nil {
		return false
	}
	g.tracking = true
	return true
}

// Stopped is the SIGTERM or SIGINT received, or nil.
func (g *StartGuard) Stopped() os.Signal {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.sig
}
