package watch

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// inotifyOp is what an inotify event says happened to its name.
type inotifyOp uint8

const (
	opCreate     inotifyOp = 1 << iota // IN_CREATE, IN_MOVED_TO
	opWrite                            // IN_MODIFY
	opRemove                           // IN_DELETE, IN_DELETE_SELF
	opRename                           // IN_MOVED_FROM, IN_MOVE_SELF
	opChmod                            // IN_ATTRIB
	opOpen                             // IN_OPEN (with opens)
	opClose                            // IN_CLOSE_WRITE, IN_CLOSE_NOWRITE (with opens)
	opCloseWrite                       // IN_CLOSE_WRITE (with opClose)
)

// inotifyEvent is one event: the path of the watched directory, joined
// with the entry's name when the event is of an entry.
type inotifyEvent struct {
	Name string
	Op   inotifyOp
	// Cookie ties an IN_MOVED_FROM to its IN_MOVED_TO (0: neither), and
	// Dir says the entry is a directory.
	Cookie uint32
	Dir    bool
}

// Has reports whether e has op.
func (e inotifyEvent) Has(op inotifyOp) bool { return e.Op&op != 0 }

// errEventOverflow is sent on inotifyFD.Errors when the kernel's queue
// overflowed (IN_Q_OVERFLOW): events were lost.
var errEventOverflow = errors.New("inotify: event queue overflow")

// errNoWatch is inotifyFD.Remove's error for a path it does not watch.
var errNoWatch = errors.New("inotify: no watch on this path")

// inotifyMask is every watch's mask. IN_ONLYDIR is added to each call,
// and inotifyOpenMask with opens.
const (
	inotifyMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_DELETE_SELF |
		unix.IN_MOVED_TO | unix.IN_MOVED_FROM | unix.IN_MOVE_SELF | unix.IN_ATTRIB
	inotifyOpenMask = unix.IN_OPEN | unix.IN_CLOSE_WRITE | unix.IN_CLOSE_NOWRITE
)

// inotifyFD is an inotify(7) instance whose watches are added on open
// directory descriptors, never by a path that the kernel resolves: the
// directory watched is the one the caller opened (without following a
// symlink), whatever its name leads to by the time of the call.
// github.com/fsnotify/fsnotify names its watches by the path it passes to
// inotify_add_watch(2), with no IN_DONT_FOLLOW or IN_ONLYDIR, so a
// directory swapped for a symlink (renameat2(RENAME_EXCHANGE)) while it is
// added gets the symlink's target watched.
//
// Each watch has one path, the name its directory was last added under;
// an event is named by it. A reader goroutine turns the queue into Events
// (buffered) and Errors (errEventOverflow; read failures).
type inotifyFD struct {
	Events chan inotifyEvent
	Errors chan error

	file  *os.File      // the instance, read through the runtime's poller
	opens bool          // inotifyOpenMask is to be asked for (EnableOpens)
	reads atomic.Uint64 // reads of the queue that returned events
	// cursor counts the bytes read from the queue; sentBytes, those
	// whose events are on Events (or were dropped), and sent the events
	// sent (Watcher.Fence).
	cursor    queueCursor
	sentBytes atomic.Uint64
	sent      atomic.Uint64
	done      chan struct{}
	exit      chan struct{} // closed when the reader has returned

	mu sync.Mutex
	// mask is every new watch's: inotifyMask, and inotifyOpenMask once
	// EnableOpens has run.
	mask   uint32           // +checklocks:mu
	fd     int              // +checklocks:mu
	closed bool             // +checklocks:mu
	wds    map[int32]string // +checklocks:mu
	paths  map[string]int32 // +checklocks:mu
}

// newInotifyFD makes an inotify instance (inotify_init1(2)) whose Events
// hold up to buffered events, and starts its reader. With opens its
// watches also report the opens and closes of the directories' files
// once EnableOpens has run.
func newInotifyFD(buffered int, opens bool) (*inotifyFD, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("couldn't initialize inotify: %w", err)
	}
	in := &inotifyFD{
		Events: make(chan inotifyEvent, buffered),
		Errors: make(chan error),
		file:   os.NewFile(uintptr(fd), "inotify"),
		mask:   inotifyMask,
		done:   make(chan struct{}),
		exit:   make(chan struct{}),
		fd:     fd,
		wds:    map[int32]string{},
		paths:  map[string]int32{},
	}
	in.opens = opens
	go in.read()
	return in, nil
}

// AddFD watches the directory open as dirfd (any descriptor of it, O_PATH
// too) under the name path: inotify_add_watch(2) of /proc/self/fd/dirfd,
// with IN_ONLYDIR. The directory was watched already under another name
// (moved): it takes this one. The name led to another watched directory:
// that one's watch is removed, as its events could be named by no path.
// Errors are the errno (ENOSPC: out of watches).
func (in *inotifyFD) AddFD(path string, dirfd int) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return os.ErrClosed
	}
	wd, err := unix.InotifyAddWatch(in.fd, "/proc/self/fd/"+strconv.Itoa(dirfd), in.mask|unix.IN_ONLYDIR)
	if err != nil {
		return err
	}
	w := int32(wd)
	if old, ok := in.wds[w]; ok && old != path {
		delete(in.paths, old)
	}
	if ow, ok := in.paths[path]; ok && ow != w {
		delete(in.wds, ow)
		unix.InotifyRmWatch(in.fd, uint32(ow))
	}
	in.wds[w], in.paths[path] = path, w
	return nil
}

// EnableOpens adds inotifyOpenMask to every watch and to those added
// from now on, if the instance was made with opens: called once the
// initial scan is done, whose own opens (one per file) would otherwise
// cost two events each. Each watched directory is opened again by its
// name (open, no symlink in any component) for inotify_add_watch(2) with
// IN_MASK_ADD; a name that now leads to a directory not watched gets no
// watch. It returns how many watches could not be updated (their
// directories' opens and closes are not reported until they are watched
// again).
func (in *inotifyFD) EnableOpens(open func(path string) (int, error)) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	if !in.opens || in.closed || in.mask&inotifyOpenMask != 0 {
		return 0
	}
	in.mask |= inotifyOpenMask
	missed := 0
	for path, w := range in.paths {
		fd, err := open(path)
		if err != nil {
			missed++
			continue
		}
		wd, err := unix.InotifyAddWatch(in.fd, "/proc/self/fd/"+strconv.Itoa(fd), in.mask|unix.IN_MASK_ADD|unix.IN_ONLYDIR)
		unix.Close(fd)
		switch {
		case err != nil:
			missed++
		case int32(wd) != w:
			missed++
			if _, ours := in.wds[int32(wd)]; !ours {
				unix.InotifyRmWatch(in.fd, uint32(wd)) // another directory now
			}
		}
	}
	return missed
}

// Remove removes the watch named path (inotify_rm_watch(2)): errNoWatch
// when there is none, the errno when the kernel had dropped it already.
func (in *inotifyFD) Remove(path string) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	w, ok := in.paths[path]
	if !ok || in.closed {
		return fmt.Errorf("%w: %s", errNoWatch, path)
	}
	delete(in.paths, path)
	delete(in.wds, w)
	_, err := unix.InotifyRmWatch(in.fd, uint32(w))
	return err
}

// Close closes the instance and waits for the reader; Events and Errors
// are closed. Later calls do nothing.
func (in *inotifyFD) Close() error {
	in.mu.Lock()
	if in.closed {
		in.mu.Unlock()
		return nil
	}
	in.closed = true
	close(in.done)
	err := in.file.Close()
	in.mu.Unlock()
	<-in.exit
	return err
}

// read reads the queue until Close, sending each event on Events.
func (in *inotifyFD) read() {
	defer func() {
		close(in.exit)
		close(in.Errors)
		close(in.Events)
	}()
	buf := make([]byte, unix.SizeofInotifyEvent*4096)
	rc, err := in.file.SyscallConn()
	if err != nil {
		in.sendError(err)
		return
	}
	for {
		// Each read(2) through the runtime's poller, counted (cursor).
		var n int
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			for {
				n, rerr = in.cursor.readQueue(int(fd), buf)
				if !errors.Is(rerr, unix.EINTR) {
					return !errors.Is(rerr, unix.EAGAIN)
				}
			}
		})
		if err == nil {
			err = rerr
		}
		select {
		case <-in.done:
			return // closed
		default:
		}
		if err == nil && n < unix.SizeofInotifyEvent {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			if !in.sendError(err) {
				return
			}
			continue
		}
		in.reads.Add(1)
		if !in.events(buf[:n]) {
			return
		}
		in.sentBytes.Add(uint64(n))
		if n < len(buf)/2 {
			time.Sleep(coalesce) // as Fanotify.Run
		}
	}
}

// events sends the events of one read on Events; false when Close came
// meanwhile or a send of an overflow found nobody to take it.
func (in *inotifyFD) events(buf []byte) bool {
	n := len(buf)
	for off := 0; off+unix.SizeofInotifyEvent <= n; {
		raw := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
		name := direntName(buf[off+unix.SizeofInotifyEvent : min(n, off+unix.SizeofInotifyEvent+int(raw.Len))])
		off += unix.SizeofInotifyEvent + int(raw.Len)
		if raw.Mask&unix.IN_Q_OVERFLOW != 0 {
			if !in.sendError(errEventOverflow) {
				return false
			}
			continue
		}
		ev, ok := in.event(raw.Wd, raw.Mask, name)
		if ok && raw.Mask&(unix.IN_MOVED_FROM|unix.IN_MOVED_TO) != 0 {
			ev.Cookie = raw.Cookie
		}
		if !ok {
			continue
		}
		select {
		case in.Events <- ev:
			in.sent.Add(1)
		case <-in.done:
			return false
		}
	}
	return true
}

// queued returns the bytes of events waiting in the queue (FIONREAD).
func (in *inotifyFD) queued() (int, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return 0, os.ErrClosed
	}
	return unix.IoctlGetInt(in.fd, unix.TIOCINQ) // FIONREAD
}

// event turns a queued event of watch wd into an inotifyEvent; false for
// one that says nothing to report (a watch removed, a watch's own
// deletion that its parent's watch reports too, an unknown watch).
func (in *inotifyFD) event(wd int32, mask uint32, name string) (inotifyEvent, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	path, ok := in.wds[wd]
	if !ok {
		return inotifyEvent{}, false
	}
	if mask&(unix.IN_IGNORED|unix.IN_UNMOUNT) != 0 {
		in.drop(wd, path)
		return inotifyEvent{}, false
	}
	if mask&unix.IN_DELETE_SELF != 0 {
		in.drop(wd, path) // the kernel removes the watch
		if _, parent := in.paths[filepath.Dir(path)]; parent {
			return inotifyEvent{}, false // its IN_DELETE says it
		}
	}
	if name == "" && mask&^uint32(inotifyOpenMask|unix.IN_ISDIR) == 0 {
		return inotifyEvent{}, false // an open or close of the directory itself
	}
	ev := inotifyEvent{Name: path, Dir: mask&unix.IN_ISDIR != 0}
	if name != "" {
		ev.Name = joinPath(path, name)
	}
	if mask&unix.IN_ISDIR == 0 {
		if mask&unix.IN_OPEN != 0 {
			ev.Op |= opOpen
		}
		if mask&(unix.IN_CLOSE_WRITE|unix.IN_CLOSE_NOWRITE) != 0 {
			ev.Op |= opClose
		}
		if mask&unix.IN_CLOSE_WRITE != 0 {
			ev.Op |= opCloseWrite
		}
	}
	if mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
		ev.Op |= opCreate
	}
	if mask&(unix.IN_DELETE|unix.IN_DELETE_SELF) != 0 {
		ev.Op |= opRemove
	}
	if mask&unix.IN_MODIFY != 0 {
		ev.Op |= opWrite
	}
	if mask&(unix.IN_MOVED_FROM|unix.IN_MOVE_SELF) != 0 {
		ev.Op |= opRename
	}
	if mask&unix.IN_ATTRIB != 0 {
		ev.Op |= opChmod
	}
	return ev, ev.Op != 0 // (0: an open or close of a subdirectory)
}

// drop forgets watch wd, named path.
//
// +checklocks:in.mu
func (in *inotifyFD) drop(wd int32, path string) {
	delete(in.wds, wd)
	if in.paths[path] == wd {
		delete(in.paths, path)
	}
}

// sendError sends err on Errors; false once the instance is closed.
func (in *inotifyFD) sendError(err error) bool {
	select {
	case in.Errors <- err:
		return true
	case <-in.done:
		return false
	}
}
