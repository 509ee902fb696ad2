package bdi

import (
	"cmp"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"flusherd/inode"
)

// Request is one pending writeback request in a plug: a byte range of one
// open file, to start writeback of (sync_file_range WRITE) or to write and
// wait for (fdatasync, Integrity). Len 0 means "to the end of the file".
type Request struct {
	Dev, Ino  uint64
	Off, Len  int64
	Integrity bool
	// Merged counts the requests folded into this one by a flush.
	Merged int

	att   *attempt
	err   error
	state atomic.Int32 // reqRunning, reqDone, reqTimedOut or reqDetached
	// detachID is the id of a detached call in Writeback.offLoop.
	detachID uint64
	// startOnly: the first phase of an integrity request (see
	// startIntegrity).
	startOnly bool
	// synced: a syncfs made its data durable (syncfsIntegrity); the
	// second phase skips the fdatasync.
	synced bool

	// A whole-file request (see wholeFile) does the attempt's every
	// system call on a worker; these are its inputs and results, written
	// by the worker and read after it has reported.
	whole      bool
	path       string
	handle     inode.Handle
	f          inode.File
	before     [2]uint64 // dirty, writeback pages before
	after      [2]uint64 // and after the write
	wrote      bool
	afterKnown bool          // after was read (integrity: fdatasync waited)
	tooLarge   bool          // more dirty than write_chunk: left for the chunked path
	fsErrAt    time.Duration // see attempt.fsErrAt
	fsErrno    syscall.Errno // see attempt.fsErrno
}

func (r *Request) end() int64 {
	if r.Len == 0 {
		return 1<<63 - 1
	}
	return r.Off + r.Len
}

// Plug batches writeback requests the way block/blk-core.c's struct
// blk_plug does for bios: requests queue up while a plug is held, and the
// outermost Finish sorts, merges and submits them as one batch
// (blk_finish_plug; "blk-plug: don't flush nested plug lists": a nested
// Start/Finish only counts depth). Flush submits at once, for
// latency-sensitive work; Add flushes early when MaxPending requests are
// held (BLK_MAX_REQUEST_COUNT; PostgreSQL's writeback context does the same).
//
// A Plug is owned by one goroutine (the bdi's writeback goroutine) and is not
// safe for concurrent use.
type Plug struct {
	// Enabled false is the pre-series behaviour kept for comparison: every
	// request is submitted on its own, as soon as it is added.
	Enabled    bool
	MaxPending int
	// Submit runs a sorted, merged batch and returns when every request
	// in it has finished; it reports each request's error in place.
	Submit func(batch []*Request)

	depth   int
	pending []*Request

	// Requests counts requests added, Merges requests folded into
	// another by a flush, Batches flushes that submitted something.
	Requests, Merges, Batches uint64
	// Last is the result of the last flush.
	Last BatchResult
}

// Start begins a plug, or a nested one (blk_start_plug).
func (p *Plug) Start() { p.depth++ }

// Finish ends a plug; only the outermost Finish submits (blk_finish_plug).
func (p *Plug) Finish() {
	if p.depth == 0 {
		panic("bdi: Plug.Finish without Start")
	}
	p.depth--
	if p.depth == 0 {
		p.Flush()
	}
}

// Depth is the current nesting depth.
func (p *Plug) Depth() int { return p.depth }

// Pending is the number of requests held.
func (p *Plug) Pending() int { return len(p.pending) }

// Add queues a request. Without a plug held, or with the plug disabled, it
// is submitted at once; when MaxPending are held, all are flushed.
func (p *Plug) Add(r *Request) {
	p.Requests++
	p.pending = append(p.pending, r)
	if p.depth == 0 || !p.Enabled || (p.MaxPending > 0 && len(p.pending) >= p.MaxPending) {
		p.Flush()
	}
}

// Flush sorts, merges and submits the pending requests now, even inside a
// nested plug, and waits for them (blk_flush_plug).
func (p *Plug) Flush() {
	if len(p.pending) == 0 {
		return
	}
	batch := p.pending
	p.pending = nil
	batch = SortAndMerge(batch)
	for _, r := range batch {
		p.Merges += uint64(r.Merged)
	}
	p.Batches++
	p.Submit(batch)
	p.Last = Result(batch)
}

// BatchResult is what a flushed batch reports as a whole, like the
// bio-chaining of "submit discard bio in batches": the first error of each
// class, in submission order. Each request keeps its own error too, and
// each inode is requeued by its own outcome.
type BatchResult struct {
	Requests    int
	Unsupported error // EINVAL, ESPIPE, EOPNOTSUPP: the operation is not supported
	IOError     error // any other error
}

// Result summarises a submitted batch.
func Result(batch []*Request) BatchResult {
	res := BatchResult{Requests: len(batch)}
	for _, r := range batch {
		switch {
		case r.err == nil:
		case isUnsupported(r.err):
			if res.Unsupported == nil {
				res.Unsupported = r.err
			}
		default:
			if res.IOError == nil {
				res.IOError = r.err
			}
		}
	}
	return res
}

// SortAndMerge orders requests by (device, inode, offset) and folds
// adjacent or overlapping ranges of the same file and mode into one request
// (blk_mq_sort_plug_list, then the elevator's back-merge). The result reuses
// reqs' storage; a folded request's Merged counts what it absorbed.
func SortAndMerge(reqs []*Request) []*Request {
	slices.SortStableFunc(reqs, func(a, b *Request) int {
		return cmp.Or(
			cmp.Compare(a.Dev, b.Dev),
			cmp.Compare(a.Ino, b.Ino),
			cmp.Compare(a.Off, b.Off),
		)
	})
	out := reqs[:0]
	for _, r := range reqs {
		if n := len(out); n > 0 {
			last := out[n-1]
			if last.Dev == r.Dev && last.Ino == r.Ino && last.Integrity == r.Integrity && last.att == r.att && r.Off <= last.end() {
				if r.Len == 0 || last.Len == 0 {
					last.Len = 0
				} else if e := r.end(); e > last.end() {
					last.Len = e - last.Off
				}
				last.Merged += 1 + r.Merged
				continue
			}
		}
		out = append(out, r)
	}
	clear(reqs[len(out):])
	return out
}
