// Package earlysig catches SIGTERM, SIGINT and SIGHUP for `flusherd run`
// as early as a Go program can: in its package initialisation, which Go
// runs (in import-path order, each package after its imports) before the
// heavier packages' (the metrics and logging libraries') and long before
// main. A signal that comes before any handler exists still takes its
// default action, which for all three is to end the process: this
// narrows that window to the Go runtime's own start (see signal(7) and
// os/signal). Other commands keep the default actions (Ctrl-C ends
// `flusherd sync`).
//
// It also ignores SIGPIPE for `run`: a write to standard error after its
// reader went away (a pipe to a log collector that exited) then fails
// with EPIPE instead of killing the daemon, whose trees would be left
// unprotected without a word (Go's default for fds 1 and 2).
package earlysig

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// Signals are the signals caught: SIGTERM, SIGINT and SIGHUP.
var Signals = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP}

var (
	mu    sync.Mutex
	early chan os.Signal
)

func init() {
	if len(os.Args) > 1 && os.Args[1] == "run" {
		early = make(chan os.Signal, 4)
		signal.Notify(early, Signals...)
		signal.Ignore(syscall.SIGPIPE)
	}
}

// Take returns the channel that has held Signals since the process's
// initialisation, once; nil when the process was not started as `run`,
// and on later calls. The caller owns it (signal.Stop when done).
func Take() chan os.Signal {
	mu.Lock()
	defer mu.Unlock()
	c := early
	early = nil
	return c
}
