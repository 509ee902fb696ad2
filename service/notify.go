package service

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"go.uber.org/zap"
)

// UnderSystemd reports whether flusherd runs as a systemd service
// ($INVOCATION_ID, set for each unit's processes: systemd.exec(5)).
func UnderSystemd() bool { return os.Getenv("INVOCATION_ID") != "" }

// Notifier sends sd_notify(3) messages to $NOTIFY_SOCKET (go-systemd's
// SdNotify: nothing when it is unset) and logs the first failure only.
type Notifier struct {
	log    *zap.Logger
	clock  Clock
	failed sync.Once
}

// NewNotifier returns a Notifier that logs to log; clock times its
// periodic messages (ExtendWhile, Progress, Watchdog).
func NewNotifier(log *zap.Logger, clock Clock) *Notifier {
	return &Notifier{log: log, clock: clock}
}

// Send sends state, one or more "KEY=value" lines.
func (n *Notifier) Send(state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		n.failed.Do(func() { n.log.Warn("sd_notify failed", zap.Error(err)) })
	}
}

// ExtendWhile sends EXTEND_TIMEOUT_USEC=extend with STATUS=status() every
// `every` when progress() moved (the first always goes), until stop
// (idempotent): TimeoutStartSec= still ends a start-up that hangs.
func (n *Notifier) ExtendWhile(every, extend time.Duration, status func() string, progress func() int64) (stop func()) {
	done := make(chan struct{})
	tick, stopTick := n.clock.Tick(every)
	go func() {
		defer stopTick()
		last := int64(-1)
		for {
			select {
			case <-done:
				return
			case <-tick:
			}
			p := progress()
			if p == last && last >= 0 {
				continue
			}
			last = p
			n.Send(fmt.Sprintf("EXTEND_TIMEOUT_USEC=%d\nSTATUS=%s", extend.Microseconds(), status()))
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done) }) }
}

// Progress sends status() every `every` until done is closed.
func (n *Notifier) Progress(done <-chan struct{}, every time.Duration, status func() string) {
	tick, stop := n.clock.Tick(every)
	defer stop()
	for {
		select {
		case <-done:
			return
		case <-tick:
			n.Send(status())
		}
	}
}

// Startup counts start-up's steps for EXTEND_TIMEOUT_USEC: each tree set
// up (its root opened for opens by handle and error checks) and each
// offered to the watcher (opened again for the fanotify mark).
type Startup struct {
	trees          int
	setUp, offered atomic.Int64
	stop           func()
}

// Start-up's extension: every StartupEvery, EXTEND_TIMEOUT_USEC of
// StartupExtend, while a step was made.
const (
	StartupEvery  = 2 * time.Second
	StartupExtend = 6 * time.Second
)

// StartProgress begins extending systemd's TimeoutStartSec while the start-up
// of trees trees makes progress; Stop ends it (READY=1 is next).
func StartProgress(n *Notifier, trees int) *Startup {
	s := &Startup{trees: trees}
	s.stop = n.ExtendWhile(StartupEvery, StartupExtend, s.Status, func() int64 { return s.setUp.Load() + s.offered.Load() })
	return s
}

// SetUp counts a tree set up.
func (s *Startup) SetUp() { s.setUp.Add(1) }

// Offered counts a tree offered to the watcher (watch.Options.Progress).
func (s *Startup) Offered() { s.offered.Add(1) }

// Status is the STATUS= text of the extensions.
func (s *Startup) Status() string {
	st := fmt.Sprintf("starting: %d of %s set up", s.setUp.Load(), Plural(s.trees, "tree", "trees"))
	if o := s.offered.Load(); o > 0 {
		st += fmt.Sprintf(", %d of %d offered to the watcher", o, s.trees)
	}
	return st
}

// Stop ends the extensions; idempotent.
func (s *Startup) Stop() { s.stop() }

// Plural is "1 one" for n = 1, "n many" otherwise (STATUS= lines).
func Plural[N int | uint64](n N, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", one)
	}
	return fmt.Sprintf("%d %s", n, many)
}
