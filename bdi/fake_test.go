package bdi

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"flusherd/inode"
	"flusherd/lists"
	"flusherd/policy"
	"flusherd/tree"
)

// fakeFS is a fake inode.Opener: files with dirty and writeback page
// counts, scripted errors, and a record of every system call.
type fakeFS struct {
	mu    sync.Mutex
	files map[string]*fakeFile
	calls []call
	now   func() time.Duration
	// handles numbers the files' handles (handleFS).
	handles   int
	syncfsErr error
	// cursorOpenErr: while set, an error cursor does not open
	// (Files.DirCursor fails with it).
	cursorOpenErr error
	// cursorErr: the next check of an error cursor (ErrCursor.Check)
	// reports it, once (a writeback error since the cursor was sampled).
	cursorErr error
	// cursorDelay is how long a check of an error cursor takes (a
	// syncfs writing back the filesystem).
	cursorDelay time.Duration
	// cursors counts the cursors taken and not closed.
	cursors int
}

type call struct {
	at   time.Duration
	op   string
	path string
	off  int64
	n    int64
}

type fakeFile struct {
	fs        *fakeFS
	path      string
	key       inode.Key
	size      int64
	dirty     map[int64]bool // page index -> dirty
	writeback int            // pages under writeback; they complete at the next Cachestat, unless held
	// holdWriteback: its pages under writeback stay so until cleared (a
	// device that has not finished).
	holdWriteback bool
	openErr       error
	writeErr      error
	closeErr      error  // returned by the next Close (FUSE's flush of a failed writeback)
	sfrErr        error  // returned by StartWriteback only (sync_file_range unsupported)
	onWrite       func() // runs during StartWriteback/DataSync, without fs.mu
	onOpen        func() // runs during Open, without fs.mu
	// cachestatErrAt: the file's cachestat calls fail with EIO from the
	// cachestatErrAt'th (1-based) on; 0: never.
	cachestatErrAt int
	// cachestatErr: while set, the file's cachestat calls fail with it.
	cachestatErr error
	cachestats   int
	// keepDirty: writes leave the pages dirty (the filesystem skipped
	// them, as with locked pages).
	keepDirty bool
	// fastDevice: sync_file_range leaves no pages under writeback (the
	// device finished at once).
	fastDevice bool
	handle     inode.Handle // its handle for handleFS: "h<n>"
	checkErr   error        // an unseen error of an earlier writeback: DataSync returns it
}

func newFakeFS(now func() time.Duration) *fakeFS {
	return &fakeFS{files: map[string]*fakeFile{}, now: now}
}

const pg = 4096

// add makes a file of size bytes with pages [0, dirtyPages) dirty.
func (fs *fakeFS) add(path string, ino uint64, size int64, dirtyPages int) *fakeFile {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.handles++
	f := &fakeFile{fs: fs, path: path, key: inode.Key{Dev: 7, Ino: ino}, size: size, dirty: map[int64]bool{}, handle: inode.Handle(fmt.Sprintf("h%d", fs.handles))}
	for i := range dirtyPages {
		f.dirty[int64(i)] = true
	}
	fs.files[path] = f
	return f
}

func (fs *fakeFS) record(op, path string, off, n int64) {
	fs.calls = append(fs.calls, call{at: fs.now(), op: op, path: path, off: off, n: n})
}

// callsOf returns the calls of op ("": every op) on path ("": every
// path), in order.
func (fs *fakeFS) callsOf(op, path string) []call {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var out []call
	for _, c := range fs.calls {
		if (op == "" || c.op == op) && (path == "" || c.path == path) {
			out = append(out, c)
		}
	}
	return out
}

func (fs *fakeFS) Open(path string, key inode.Key) (inode.File, error) {
	fs.mu.Lock()
	if f := fs.files[path]; f != nil && f.onOpen != nil {
		hook := f.onOpen
		fs.mu.Unlock()
		hook()
		fs.mu.Lock()
	}
	defer fs.mu.Unlock()
	fs.record("open", path, 0, 0)
	f := fs.files[path]
	if f == nil {
		return nil, syscall.ENOENT
	}
	if f.openErr != nil {
		return nil, f.openErr
	}
	return &fakeHandle{f, f.size}, nil
}

// fakeHandle is an open fakeFile; size is st_size at open, as
// inode.File's Size is (taken under the fake's lock: a test may grow the
// file meanwhile).
type fakeHandle struct {
	f    *fakeFile
	size int64
}

func (h *fakeHandle) Size() (int64, error) { return h.size, nil }

// Close records the close, so that tests can match every open with one.
func (h *fakeHandle) Close() error {
	h.f.fs.mu.Lock()
	defer h.f.fs.mu.Unlock()
	h.f.fs.record("close", h.f.path, 0, 0)
	err := h.f.closeErr
	h.f.closeErr = nil // reported once, as filemap_check_errors does
	return err
}

// dirCursor is an error cursor of the fake filesystem, opened on a
// directory (Files.DirCursor).
func (fs *fakeFS) dirCursor(string, uint64) (inode.ErrCursor, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.record("cursor_open", "", 0, 0)
	if fs.cursorOpenErr != nil {
		return nil, fs.cursorOpenErr
	}
	fs.cursors++
	return fakeCursor{fs}, nil
}

type fakeCursor struct{ fs *fakeFS }

func (c fakeCursor) Check() error {
	c.fs.mu.Lock()
	d := c.fs.cursorDelay
	c.fs.mu.Unlock()
	time.Sleep(d)
	c.fs.mu.Lock()
	defer c.fs.mu.Unlock()
	c.fs.record("cursor_check", "", 0, 0)
	err := c.fs.cursorErr
	c.fs.cursorErr = nil
	return err
}

func (c fakeCursor) Close() error {
	c.fs.mu.Lock()
	defer c.fs.mu.Unlock()
	c.fs.cursors--
	return nil
}

// Syncfs records a syncfs(2) of the file's filesystem: every file of the
// fake is written back (and its writeback completed).
func (h *fakeHandle) Syncfs() error {
	fs := h.f.fs
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.record("syncfs", h.f.path, 0, 0)
	if fs.syncfsErr != nil {
		return fs.syncfsErr
	}
	for _, f := range fs.files {
		if !f.keepDirty {
			clear(f.dirty)
			f.writeback = 0
		}
	}
	return nil
}

func (h *fakeHandle) Cachestat(off, n int64) (uint64, uint64, error) {
	f := h.f
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	f.cachestats++
	if f.cachestatErrAt > 0 && f.cachestats >= f.cachestatErrAt {
		return 0, 0, syscall.EIO
	}
	if f.cachestatErr != nil {
		return 0, 0, f.cachestatErr
	}
	end := int64(1 << 62)
	if n > 0 {
		end = off + n
	}
	var d uint64
	for p := range f.dirty {
		if p*pg >= off && p*pg < end {
			d++
		}
	}
	wb := uint64(f.writeback)
	if n == 0 && off == 0 && !f.holdWriteback {
		f.writeback = 0 // the device completes what was in flight
	}
	return d, wb, nil
}

func (h *fakeHandle) write(op string, off, n int64) error {
	f := h.f
	f.fs.mu.Lock()
	f.fs.record(op, f.path, off, n)
	hook, err := f.onWrite, f.writeErr
	if op == "sync_file_range" && f.sfrErr != nil {
		err = f.sfrErr
	}
	f.fs.mu.Unlock()
	if hook != nil {
		hook()
	}
	if err != nil {
		return err
	}
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if op == "fdatasync" {
		f.writeback = 0 // it waits for the writeback in flight
	}
	if f.keepDirty {
		return nil
	}
	end := int64(1 << 62)
	if n > 0 {
		end = off + n
	}
	for p := range f.dirty {
		if p*pg >= off && p*pg < end {
			delete(f.dirty, p)
			if op == "sync_file_range" && !f.fastDevice {
				f.writeback++
			}
		}
	}
	return nil
}

func (h *fakeHandle) StartWriteback(off, n int64) error { return h.write("sync_file_range", off, n) }

// DataSync is fdatasync(2): it writes the file and waits, and reports an
// unseen error of an earlier writeback (checkErr) as fdatasync does.
func (h *fakeHandle) DataSync() error {
	if err := h.write("fdatasync", 0, 0); err != nil {
		return err
	}
	h.f.fs.mu.Lock()
	defer h.f.fs.mu.Unlock()
	return h.f.checkErr
}

// handleFS is a fakeFS that also opens by handle (an inode.HandleOpener),
// as inode.Handles does: a handle names one file for good, so the handle of
// a file that was replaced (remove then add under the same path and key: a
// reused inode number) is stale (inode.ErrUnlinked); with ebadf set, no
// filesystem is registered for handles (EBADF).
type handleFS struct {
	*fakeFS
	ebadf bool
}

// RemoveMount implements Handles: there is no mount to let go.
func (fs *handleFS) RemoveMount(uint64) {}

func (fs *handleFS) HandleOf(path string, key inode.Key) (inode.Handle, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.record("handle_of", path, 0, 0)
	if f := fs.files[path]; f != nil {
		return f.handle, nil
	}
	return "", syscall.ENOENT
}

func (fs *handleFS) OpenHandle(h inode.Handle, key inode.Key) (inode.File, error) {
	fs.mu.Lock()
	for _, f := range fs.files {
		if f.handle == h && f.onOpen != nil {
			hook := f.onOpen
			fs.mu.Unlock()
			hook()
			fs.mu.Lock()
			break
		}
	}
	defer fs.mu.Unlock()
	fs.record("open_by_handle", string(h), 0, 0)
	if fs.ebadf {
		return nil, syscall.EBADF
	}
	for _, f := range fs.files {
		if f.handle == h {
			if f.openErr != nil {
				return nil, f.openErr
			}
			return &fakeHandle{f, f.size}, nil
		}
	}
	return nil, inode.ErrUnlinked
}

// remove deletes the file at path.
func (fs *fakeFS) remove(path string) {
	fs.mu.Lock()
	delete(fs.files, path)
	fs.mu.Unlock()
}

// set changes the file's script under the fake's lock.
func (f *fakeFile) set(change func(f *fakeFile)) {
	f.fs.mu.Lock()
	change(f)
	f.fs.mu.Unlock()
}

// redirty marks page p dirty again (a new write).
func (f *fakeFile) redirty(p int64) {
	f.fs.mu.Lock()
	f.dirty[p] = true
	f.fs.mu.Unlock()
}

func testConfig() Config {
	return Config{
		DirtyWritebackInterval: 5 * time.Second,
		MinPause:               10 * time.Millisecond,
		MaxPause:               time.Second,
		WriteChunk:             4 << 20,
		Requeue:                policy.IOWait,
		PlugEnabled:            true,
		MaxPending:             256,
		QueueDepth:             4,
	}
}

// harness runs one Writeback over a fakeFS inside a synctest bubble.
type harness struct {
	t     *testing.T
	wb    *Writeback
	fs    *fakeFS
	epoch time.Time
}

func (h *harness) now() time.Duration { return time.Since(h.epoch) }

// withWB runs f in a synctest bubble with a running Writeback; each setup
// function runs before its goroutine starts (to set a logger, a Trace hook,
// another opener).
func withWB(t *testing.T, cfg Config, f func(h *harness), setup ...func(h *harness)) {
	synctest.Test(t, func(t *testing.T) {
		h := &harness{t: t, epoch: time.Now()}
		h.fs = newFakeFS(h.now)
		h.wb = New("7:0", cfg, h.now, Files{Opener: h.fs, DirCursor: h.fs.dirCursor}, nil, nil)
		for _, s := range setup {
			s(h)
		}
		ctx, cancel := context.WithCancel(context.Background())
		go h.wb.Run(ctx)
		t.Cleanup(func() { cancel(); <-h.wb.Stopped() })
		f(h)
	})
}

func (h *harness) mark(f *fakeFile, expire time.Duration) {
	h.wb.MarkInodeDirty(f.key, f.path, "", tree.Tree{Expire: expire})
}

// afterSample lets the background check after the files just marked count
// them (one open each: backgroundCheckInterval), and returns the opens of
// path so far, for tests that count the attempts' opens or script them.
func (h *harness) afterSample(path string) int {
	time.Sleep(backgroundCheckInterval + 10*time.Millisecond)
	synctest.Wait()
	n := len(h.fs.callsOf("open", path))
	if n == 0 {
		h.t.Errorf("the background check did not open %s", path)
	}
	return n
}

// afterSample is harness.afterSample for a Registry's device over fs,
// whose files are opened by handle (handleFS).
func afterSample(t *testing.T, fs *fakeFS, f *fakeFile) {
	t.Helper()
	time.Sleep(backgroundCheckInterval + 10*time.Millisecond)
	synctest.Wait()
	if len(fs.callsOf("open_by_handle", string(f.handle))) == 0 {
		t.Errorf("the background check did not open %s", f.path)
	}
}

// lists returns the list each tracked inode is on, by path.
func (h *harness) lists() map[string]string {
	wb := h.wb
	wb.mu.Lock()
	defer wb.mu.Unlock()
	out := map[string]string{}
	for _, c := range wb.bDirty.classes {
		for in := range c.list.All {
			out[in.Path()] = "b_dirty"
		}
	}
	for name, l := range map[string]*listT{"b_io": &wb.BIO, "b_more_io": &wb.BMoreIO, "b_more_io_wait": &wb.BMoreIOWait, "inflight": &wb.inflight} {
		for in := range l.All {
			out[in.Path()] = name
		}
	}
	return out
}

func (h *harness) inode(path string) *inode.Inode {
	h.wb.mu.Lock()
	defer h.wb.mu.Unlock()
	for in := range h.wb.inodes.All {
		if in.Path() == path {
			c := *in
			return &c
		}
	}
	return nil
}

type listT = lists.List[*inode.Inode]
