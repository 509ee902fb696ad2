package service

import (
	"os"
	"syscall"
	"time"

	"go.uber.org/zap"

	"flusherd/policy"
)

// ServeSignals calls reload on each SIGHUP until SIGTERM or SIGINT, which
// it returns (SIGTERM when sigs is closed). SIGHUPs queued together make
// one reload, and none is made when a SIGTERM or SIGINT is queued behind
// them (a stop asked for during start-up). A reload cut short by a
// shortage (EMFILE, ENOMEM) is retried after pauses() (min_pause,
// max_pause, read after each reload), doubling, until one completes.
func ServeSignals(clock Clock, sigs <-chan os.Signal, reload func() (short bool), pauses func() (lo, hi time.Duration), log *zap.Logger) os.Signal {
	var retry <-chan time.Time
	var b policy.Backoff // its Pause is 0 while no retry is due
	for {
		select {
		case sig, ok := <-sigs:
			if !ok {
				return syscall.SIGTERM
			}
			if sig != syscall.SIGHUP {
				return sig
			}
			if stop, ok := queuedStop(sigs); ok {
				return stop
			}
		case <-retry:
			retry = nil
		}
		short := reload()
		switch {
		case short:
			lo, hi := pauses()
			if b.Pause == 0 {
				log.Warn("the reload could not be completed for want of resources; retrying with backoff until it completes",
					zap.Stringer("first_retry", lo))
			}
			b.Min, b.Max = lo, hi
			retry = clock.After(b.Next(false))
		case b.Pause > 0:
			log.Info("the reload retried after the resource shortage completed")
			b.Reset()
		}
	}
}

// queuedStop takes the signals already queued on sigs, without waiting,
// and returns the first SIGTERM or SIGINT among them (SIGTERM when sigs
// is closed); false when there are only SIGHUPs or none.
func queuedStop(sigs <-chan os.Signal) (os.Signal, bool) {
	for {
		select {
		case sig, ok := <-sigs:
			if !ok {
				return syscall.SIGTERM, true
			}
			if sig != syscall.SIGHUP {
				return sig, true
			}
		default:
			return nil, false
		}
	}
}
