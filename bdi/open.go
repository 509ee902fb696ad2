package bdi

import (
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/blk"
	"flusherd/inode"
)

// openFile opens a tracked file: by handle when it has one and the opener
// can (a rename since it was dirtied does not matter then), else by path.
//
// (st_dev, st_ino) is not an identity over time: ext4 gives a freed inode
// number to the next file at once, and only the handle's generation tells
// the two apart. So when the handle names a deleted inode (ESTALE, or
// inode.ErrUnlinked) and a regular file with the same number is at path, it
// is a new file that took the number: it is opened by its own handle, which
// is returned as renewed for the inode to keep. renewed is "" otherwise.
func (wb *Writeback) openFile(path string, key inode.Key, h inode.Handle) (f inode.File, renewed inode.Handle, err error) {
	ho, ok := wb.open.(inode.HandleOpener)
	if h == "" || !ok {
		f, err = wb.open.Open(path, key)
		return f, "", err
	}
	f, err = ho.OpenHandle(h, key)
	if errors.Is(err, unix.EBADF) && path != "" {
		// No descriptor of the inode's filesystem is registered for
		// opens by handle: a filesystem inside a tree's (a btrfs
		// subvolume has its own st_dev, so does a mount): by path.
		f, err = wb.open.Open(path, key)
		return f, "", err
	}
	if err == nil || path == "" || !errors.Is(err, unix.ESTALE) {
		return f, "", err
	}
	nh, herr := ho.HandleOf(path, key)
	if herr != nil || nh == "" || nh == h {
		return nil, "", err
	}
	nf, nerr := ho.OpenHandle(nh, key)
	if nerr != nil {
		return nil, "", err
	}
	return nf, nh, nil
}

// openJob is an open handed to the opener goroutine.
type openJob struct {
	in    *inode.Inode
	path  string
	key   inode.Key
	h     inode.Handle
	state atomic.Int32 // blk.Running, blk.Done or blk.Detached
	// began is when the open was handed over (daemon clock); id is its
	// entry in Writeback.offLoop once detached.
	began time.Duration
	id    uint64
}

type openResult struct {
	f       inode.File
	renewed inode.Handle
	err     error
}

// opener is a goroutine that opens files for the writeback goroutine, so
// that an open that is slow or hangs (a frozen or unresponsive filesystem)
// can be left to it. It is replaced when one of its opens is detached.
type opener struct {
	jobs    chan *openJob
	results chan openResult
}

// startOpener starts an opener goroutine; it ends when jobs is closed or
// after a detached open returns.
func (wb *Writeback) startOpener() *opener {
	o := &opener{jobs: make(chan *openJob), results: make(chan openResult)}
	go func() {
		for j := range o.jobs {
			f, renewed, err := wb.openFile(j.path, j.key, j.h)
			wb.mu.Lock()
			inTime := j.state.CompareAndSwap(int32(blk.Running), int32(blk.Done))
			var took time.Duration
			overran := false
			if !inTime {
				// Detached: the attempt was completed without it and
				// another opener took over.
				took, overran = wb.returnedLocked(j.id)
				wb.unbusyLocked(j.in)
				wb.gen++
			}
			wb.mu.Unlock()
			if inTime {
				o.results <- openResult{f, renewed, err}
				continue
			}
			if f != nil {
				f.Close()
			}
			if overran {
				wb.errLog.Warn("an open returned after running past attempt_timeout (counted in stuck_calls while it ran)",
					zap.String("path", strconv.Quote(j.path)), zap.Duration("took", took), zap.Error(err))
			} else {
				wb.log.Debug("a detached open returned", zap.String("path", strconv.Quote(j.path)), zap.Error(err))
			}
			wb.kick()
			return
		}
	}()
	return o
}

// errOpenDetached is openTimed's answer for an open left to its opener.
var errOpenDetached = errors.New("open detached")

// openTimed opens the inode's file on the opener goroutine and waits for
// it for detachAfter at most: an open can be as slow as a write, or hang.
// An open still running then is detached (errOpenDetached): the inode is
// Busy until the open(2) returns, the open counts in stuck_calls once it
// runs past attempt_timeout, and the file it then yields is closed at once.
// The opens run on a long-lived opener goroutine, not one goroutine each: a
// blocked file is retried often.
func (wb *Writeback) openTimed(in *inode.Inode, path string, key inode.Key, h inode.Handle) (inode.File, inode.Handle, error) {
	if wb.opener == nil {
		wb.opener = wb.startOpener()
	}
	j := &openJob{in: in, path: path, key: key, h: h, began: wb.now()}
	wb.opener.jobs <- j
	tc := blk.ResetTimer(&wb.openTimer, detachAfter)
	defer wb.openTimer.Stop()
	select {
	case r := <-wb.opener.results:
		return r.f, r.renewed, r.err
	case <-tc:
	}
	wb.mu.Lock()
	if j.state.CompareAndSwap(int32(blk.Running), int32(blk.Detached)) {
		in.State |= inode.Busy
		j.id = wb.trackCallLocked(j.began)
		wb.detached++
		wb.mu.Unlock()
		// The detached opener ends when its open returns.
		close(wb.opener.jobs)
		wb.opener = nil
		return nil, "", errOpenDetached
	}
	wb.mu.Unlock()
	r := <-wb.opener.results
	return r.f, r.renewed, r.err
}

// unbusyLocked clears in's Busy once no call for it is stuck or detached
// (callers have counted theirs down), asks for b_more_io_wait to be
// retried now (the inode waits there for this call only), and wakes a sync
// request waiting for it. Preconditions: wb.mu held.
//
// +checklocks:wb.mu
func (wb *Writeback) unbusyLocked(in *inode.Inode) {
	in.State &^= inode.Busy
	wb.detachReturned = true
	if wb.unbusy != nil {
		close(wb.unbusy)
		wb.unbusy = nil
	}
}
