package watch

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// coalesce is how long Run (and the inotify reader) waits, after a batch
// that did not fill half its buffer, before it reads again: the events that
// come meanwhile are read in one batch (and fanotify merges repeated events
// on one file while they are queued), instead of one read and one wake-up
// of the daemon for every few events. Each wake-up costs more than its
// events (the Go scheduler's and sysmon's own wake-ups): beside a
// full-speed pgbench, 10 ms took the daemon from about 9 % of a core and
// 4,800 context switches a second to 2.5 % and 900, against 1 ms. At the
// default queue of 16,384 events, the queue could only overflow in that
// time at more than 1.6 million events a second. Idle, Run sleeps in
// poll(2) and nothing wakes it.
const coalesce = 10 * time.Millisecond

// Run implements Backend: it reads events until ctx ends or Close. It
// waits in poll(2) on the group and the stop eventfd, on a thread of its
// own, and reads the group when it is readable.
func (fa *Fanotify) Run(ctx context.Context) {
	fa.fdMu.Lock()
	if fa.closed || fa.running {
		fa.fdMu.Unlock()
		return
	}
	fa.running = true
	fa.fdMu.Unlock()
	defer func() {
		fa.fdMu.Lock()
		fa.running = false
		if fa.closed {
			fa.closeFDs()
		}
		fa.fdMu.Unlock()
	}()
	go fa.watchMounts(ctx)
	stop := context.AfterFunc(ctx, fa.wake)
	defer stop()
	fds := []unix.PollFd{{Fd: int32(fa.fd), Events: unix.POLLIN}, {Fd: int32(fa.stop), Events: unix.POLLIN}}
	for {
		if ctx.Err() != nil {
			return
		}
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			fa.log.Error("fanotify poll failed; no more events", zap.Error(err))
			return
		}
		if fds[1].Revents != 0 {
			return // Close, or ctx ended
		}
		n, err := fa.cursor.readQueue(fa.fd, fa.buf)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			fa.log.Error("fanotify read failed; no more events", zap.Error(err))
			return
		}
		fa.readBatches.Add(1)
		// A read that did not fill half the buffer emptied the queue:
		// an overflow read later happened after it.
		drained := n < len(fa.buf)/2
		var seq uint64
		if drained {
			seq = fa.removeSeqNow()
		}
		// The stats file is rewritten only for events that concern
		// the trees: the filesystem mark also reports everything
		// else on the filesystem, the daemon's own stats writes
		// included, which must not keep it awake.
		if fa.events(ctx, fa.buf[:n]) {
			fa.touched()
		}
		if drained {
			fa.forgetRemovedUpTo(seq)
		}
		fa.doneBatches.Add(1)
		fa.handledBytes.Add(uint64(n))
		if drained {
			time.Sleep(coalesce)
		}
	}
}

// queued returns the bytes of events waiting in the group (FIONREAD).
func (fa *Fanotify) queued() (int, error) {
	fa.fdMu.Lock()
	defer fa.fdMu.Unlock()
	if fa.fdsClosed {
		return 0, os.ErrClosed
	}
	return unix.IoctlGetInt(fa.fd, unix.TIOCINQ)
}

// Quiesce implements Backend: it waits until the fanotify queue is empty
// (FIONREAD) and every batch read from it has been handled, twice in a row
// a moment apart (Run may have just read a batch it has not yet counted).
func (fa *Fanotify) Quiesce(ctx context.Context) {
	quiet := 0
	for quiet < 2 && ctx.Err() == nil {
		n, err := fa.queued()
		if err != nil {
			return
		}
		if n == 0 && fa.readBatches.Load() == fa.doneBatches.Load() && !fa.rescanBusy() {
			quiet++
		} else {
			quiet = 0
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Fence implements Backend: it returns once every event queued in the
// group at its call has been read and handled by Run, or ctx's error.
func (fa *Fanotify) Fence(ctx context.Context) error {
	t, err := fa.cursor.target(ctx, fa.queued)
	if err != nil {
		return err
	}
	return waitUntil(ctx, func() bool { return fa.handledBytes.Load() >= t })
}

// event is one parsed fanotify event. Its byte slices point into the read
// buffer: handling an event for a known file allocates nothing.
type event struct {
	mask     uint64
	pid      int32  // the process that caused it
	dirFsid  []byte // 8 bytes
	dirType  []byte // 4 bytes, handle_type
	dir      []byte // f_handle of the parent directory (DFID_NAME)
	name     []byte
	fileFsid []byte
	fileType []byte
	file     []byte // f_handle of the object itself (FID)
}

// events parses and handles a buffer of events (fanotify_event_metadata
// followed by fanotify_event_info_fid records). It reports whether any
// concerned a tree (or was an overflow).
func (fa *Fanotify) events(ctx context.Context, b []byte) (relevant bool) {
	for len(b) >= unix.FAN_EVENT_METADATA_LEN {
		var ev event
		evLen, ok := parseEvent(b, &ev)
		if !ok {
			fa.log.Error("malformed fanotify event; rest of the buffer dropped", zap.Int("len", evLen))
			break
		}
		b = b[evLen:]
		fa.ctr.Events.Add(1)
		if ev.mask&unix.FAN_Q_OVERFLOW != 0 {
			fa.flushMarks()
			fa.ctr.Overflows.Add(1)
			fa.logOverflow("fanotify")
			fa.clearCaches()
			fa.overflowRescan(ctx, func() { fa.rescan(ctx, nil) })
			relevant = true
			continue
		}
		if fa.handle(ctx, &ev) {
			relevant = true
		}
	}
	fa.flushMarks()
	return relevant
}

// parseEvent parses the first event of b (fanotify_event_metadata followed
// by fanotify_event_info_fid records) into ev, a zero event; it returns
// the event's length (the metadata's event_len), and false if the
// metadata is malformed.
func parseEvent(b []byte, ev *event) (evLen int, ok bool) {
	evLen = int(binary.NativeEndian.Uint32(b[0:]))
	metaLen := int(binary.NativeEndian.Uint16(b[6:]))
	if evLen < metaLen || evLen > len(b) || metaLen < unix.FAN_EVENT_METADATA_LEN {
		return evLen, false
	}
	ev.mask = binary.NativeEndian.Uint64(b[8:])
	ev.pid = int32(binary.NativeEndian.Uint32(b[20:]))
	info := b[metaLen:evLen]
	for len(info) >= 4 {
		typ, recLen := info[0], int(binary.NativeEndian.Uint16(info[2:]))
		if recLen < 4 || recLen > len(info) {
			break
		}
		rec := info[4:recLen]
		info = info[recLen:]
		if len(rec) < 16 {
			continue
		}
		hBytes := int(binary.NativeEndian.Uint32(rec[8:]))
		if 16+hBytes > len(rec) {
			continue
		}
		switch typ {
		case unix.FAN_EVENT_INFO_TYPE_DFID_NAME:
			ev.dirFsid, ev.dirType, ev.dir = rec[:8], rec[12:16], rec[16:16+hBytes]
			name := rec[16+hBytes:]
			if i := indexNUL(name); i >= 0 {
				name = name[:i]
			}
			ev.name = name
		case unix.FAN_EVENT_INFO_TYPE_FID:
			ev.fileFsid, ev.fileType, ev.file = rec[:8], rec[12:16], rec[16:16+hBytes]
		}
	}
	return evLen, true
}

func indexNUL(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}
