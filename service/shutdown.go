package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"go.uber.org/zap"

	"flusherd/bdi"
	"flusherd/internal/logpath"
	"flusherd/policy"
)

// QuiesceTimeout bounds the handling of the events queued at the stop.
const QuiesceTimeout = 2 * time.Second

// StopBudget is how long a stop may take with shutdown_timeout d: the
// quiesce, d, and 15 s for the rest. It extends systemd's TimeoutStopSec=
// (EXTEND_TIMEOUT_USEC= with STOPPING=1, sd_notify(3)).
func StopBudget(d time.Duration) time.Duration { return d + QuiesceTimeout + 15*time.Second }

// Stop is the daemon's stop sequence (SIGTERM, SIGINT): the steps it
// drives are passed in, so that it runs without a watcher or devices.
type Stop struct {
	Timeout time.Duration    // writeback.shutdown_timeout
	Signals <-chan os.Signal // a second SIGTERM or SIGINT cuts the writeback
	Notify  *Notifier
	Log     *zap.Logger

	Scanned  <-chan struct{} // closed when the initial scan ended
	StopScan func()          // stops the initial scan
	// Cut, when not nil, says why the trees were not all scanned: the
	// stop came during start-up, before the initial scan (Scanned is
	// then closed).
	Cut     error
	Quiesce func(context.Context)       // watch.Backend.Quiesce
	Settle  func(context.Context) error // watch.Backend.Settle
	Close   func()                      // ends the watcher and what serves the daemon
	// Writeback writes every tracked file back until ctx ends
	// (bdi.Registry.Shutdown).
	Writeback func(context.Context) bdi.ShutdownReport
	Finish    func() // after the writeback (the watch stats file)
}

// Run stops for sig: STOPPING=1 with StopBudget, the queued events
// handled (QuiesceTimeout at most), then lost events rescanned and every
// tracked file written back within Timeout or until a second signal;
// LogShutdown reports.
func (s *Stop) Run(sig os.Signal) {
	// scanCut: the initial scan stopped before it reached every
	// directory, so a dirty file there is not tracked, and the last line
	// must not say that all is clean.
	scanCut := s.Cut
	select {
	case <-s.Scanned:
	default:
		s.Log.Info("signal received during the initial scan; stopping it", zap.String("signal", sig.String()))
		scanCut = errors.New("the initial scan was stopped by the signal before it had finished: files it had not reached may be dirty and are not tracked")
	}
	s.StopScan()
	<-s.Scanned
	s.Log.Info("writing back every tracked file before exit",
		zap.String("signal", sig.String()), zap.Stringer("timeout", s.Timeout))
	s.Notify.Send(fmt.Sprintf("%s\nEXTEND_TIMEOUT_USEC=%d", daemon.SdNotifyStopping, StopBudget(s.Timeout).Microseconds()))
	cutCtx, cut := context.WithCancel(context.Background())
	defer cut()
	var cutBySignal atomic.Bool
	go s.secondSignal(cutCtx, func() { cutBySignal.Store(true); cut() })
	// Files written just before the signal have their events still
	// queued: handle them, so that they are written back too.
	qctx, qcancel := context.WithTimeout(cutCtx, QuiesceTimeout)
	s.Quiesce(qctx)
	qcancel()
	sctx, scancel := context.WithTimeout(cutCtx, s.Timeout)
	defer scancel()
	// Events lost to a shortage: their files are found by the rescan
	// that makes up for them, now rather than after its delay.
	unsettled := errors.Join(scanCut, s.Settle(sctx))
	s.Close()
	rep := s.Writeback(sctx)
	s.Finish()
	end := fmt.Sprintf("shutdown_timeout (%v) ended", s.Timeout)
	if cutBySignal.Load() {
		end = "a second signal ended the shutdown"
	}
	LogShutdown(s.Log, rep, end, unsettled)
}

// secondSignal calls cut on a second SIGINT or SIGTERM (an operator's
// second Ctrl-C); SIGHUP is ignored. It returns when ctx ends.
func (s *Stop) secondSignal(ctx context.Context, cut func()) {
	for {
		select {
		case sig, ok := <-s.Signals:
			if !ok {
				return
			}
			if sig == syscall.SIGHUP {
				continue
			}
			s.Log.Warn("second signal: ending the writeback before exit now; what is not written back is left to the kernel's flusher",
				zap.String("signal", sig.String()))
			cut()
			return
		case <-ctx.Done():
			return
		}
	}
}

// LogShutdown logs the files the shutdown could not write by device and
// cause (rep; the first 20 names), and a last line counting them; end
// names what cut the writeback short. unsettled (events lost, a cut scan)
// turns "every tracked file is clean" into an error.
func LogShutdown(log *zap.Logger, rep bdi.ShutdownReport, end string, unsettled error) {
	lost := logByError(log, rep.Lost, func(error) string {
		return "shutdown: files whose data was lost to a failed writeback, or may have been (a writeback error on their filesystem since flusherd wrote them, which does not say which file failed); flusherd dirty listed them as failed, counted in failed_files"
	})
	given := logByError(log, rep.GivenUp, func(err error) string {
		if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) {
			return "shutdown: files given up, the daemon may not open or inspect them (whatever dirty data they hold is left to the kernel's flusher)"
		}
		if policy.OpenFailed(err) {
			return "shutdown: files given up, their filesystem refuses to open them (EIO: shut down or failing; EUCLEAN, EBADMSG: corrupted): their dirty data may not reach the disk"
		}
		return "shutdown: files given up, their filesystem cannot be written (their dirty data cannot reach the disk)"
	})
	for dev, u := range rep.Unverified {
		slices.Sort(u.Paths)
		log.Warn("shutdown: files whose writeback flusherd started without waiting for it (writeback mode, or a range writeback) and whose outcome is not known: clean, but no read of the filesystem's writeback error cursor (a syncfs, which would write files flusherd does not manage) has covered their writes since",
			zap.String("bdi", dev), zap.Int("files", u.Files), logpath.Strings("first", u.Paths[:min(len(u.Paths), 20)]))
	}
	left := 0
	for dev, paths := range rep.Left {
		left += len(paths)
		log.Error("shutdown: files still dirty or under writeback when "+end+" (the kernel's flusher writes back what it can)",
			zap.String("bdi", dev), zap.Int("files", len(paths)), logpath.Strings("first", paths[:min(len(paths), 20)]))
	}
	switch {
	case lost == 0 && given == 0 && left == 0 && unsettled != nil:
		log.Error("exiting: the tracked files are clean, but files in the trees may be dirty and untracked", zap.Error(unsettled))
	case lost == 0 && given == 0 && left == 0:
		log.Info("every tracked file is clean; exiting")
	default:
		fields := []zap.Field{zap.Int("data_lost", lost), zap.Int("given_up", given), zap.Int("still_dirty", left)}
		if left > 0 {
			fields = append(fields, zap.String("ended_by", end))
		}
		if unsettled != nil {
			fields = append(fields, zap.NamedError("untracked", unsettled))
		}
		log.Error("exiting with files not written back", fields...)
	}
}

// logByError logs files by device and error, one line each, with the
// message msg gives for the error; it returns how many files. Errors are
// grouped by their errno where they have one (the text of an open by
// handle names the handle, which differs file by file); the line gives
// the errno's text and the first file's whole error.
func logByError(log *zap.Logger, files map[string][]bdi.GivenUp, msg func(error) string) int {
	n := 0
	for dev, g := range files {
		n += len(g)
		paths := map[string][]string{}
		first := map[string]error{}
		var order []string
		for _, f := range g {
			e := f.Err.Error()
			var errno syscall.Errno
			if errors.As(f.Err, &errno) {
				e = errno.Error()
			}
			if first[e] == nil {
				first[e] = f.Err
				order = append(order, e)
			}
			paths[e] = append(paths[e], f.Path)
		}
		for _, e := range order {
			ps := paths[e]
			fields := []zap.Field{zap.String("bdi", dev), zap.String("error", e), zap.Int("files", len(ps)), logpath.Strings("first", ps[:min(len(ps), 20)])}
			if full := first[e].Error(); full != e {
				fields = append(fields, zap.String("first_error", full))
			}
			log.Error(msg(first[e]), fields...)
		}
	}
	return n
}
