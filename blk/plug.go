package blk

import (
	"cmp"
	"errors"
	"slices"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Request is one pending writeback request: a byte range of one file, to
// start writeback of (sync_file_range WRITE) or to write and wait for
// (fdatasync, Integrity). Len 0 means "to the end of the file". O is the
// submitter's owner type (a pointer); requests of different owners are
// never merged. The submitter owns a request until it adds it to a Plug;
// the Plug's goroutine then owns it, and hands it to Submit, whose
// Queue.Run hands it to a worker; a call that is detached or times out
// keeps it on its worker until Hooks.Finished.
type Request[O comparable] struct {
	Dev, Ino  uint64
	Off, Len  int64
	Integrity bool
	// Merged counts the requests folded into this one by a flush.
	Merged int
	// Owner is the submitter's (bdi: the attempt the request is part of).
	Owner O
	// Err is the request's error: its call's, or the submitter's.
	Err error
	// Tag is free for the submitter (bdi: the id of a detached call).
	Tag uint64

	state atomic.Int32 // a State
}

// End is the end offset of the request's range (MaxInt64 for Len 0).
func (r *Request[O]) End() int64 {
	if r.Len == 0 {
		return 1<<63 - 1
	}
	return r.Off + r.Len
}

// State is how a request's call stands.
type State int32

const (
	Running  State = iota // not run yet, or running and waited for
	Done                  // returned in time; Err is its error
	TimedOut              // given up on after the queue's Timeout; still running
	Detached              // left to finish on its worker (see Queue.DetachAfter)
)

// State returns how the request's call stands.
func (r *Request[O]) State() State { return State(r.state.Load()) }

// Rearm makes a request that has run ready to run again (a second phase).
func (r *Request[O]) Rearm() { r.state.Store(int32(Running)) }

// Plug batches writeback requests the way block/blk-core.c's struct
// blk_plug does for bios: requests queue up while a plug is held, and the
// outermost Finish sorts, merges and submits them as one batch
// (blk_finish_plug; "blk-plug: don't flush nested plug lists": a nested
// Start/Finish only counts depth). Flush submits at once, for
// latency-sensitive work; Add flushes early when MaxPending requests are
// held (BLK_MAX_REQUEST_COUNT; PostgreSQL's writeback context does the same).
//
// A Plug is owned by one goroutine (a bdi's writeback goroutine) and is not
// safe for concurrent use.
type Plug[O comparable] struct {
	// Enabled false is the pre-series behaviour kept for comparison: every
	// request is submitted on its own, as soon as it is added.
	Enabled    bool
	MaxPending int
	// Submit runs a sorted, merged batch and returns when every request
	// in it has finished; it reports each request's error in place.
	Submit func(batch []*Request[O])

	depth   int
	pending []*Request[O]

	// Requests counts requests added, Merges requests folded into
	// another by a flush, Batches flushes that submitted something.
	Requests, Merges, Batches uint64
	// Last is the result of the last flush.
	Last BatchResult
}

// Start begins a plug, or a nested one (blk_start_plug).
func (p *Plug[O]) Start() { p.depth++ }

// Finish ends a plug; only the outermost Finish submits (blk_finish_plug).
// Finish without Start panics.
func (p *Plug[O]) Finish() {
	if p.depth == 0 {
		panic("blk: Plug.Finish without Start")
	}
	p.depth--
	if p.depth == 0 {
		p.Flush()
	}
}

// Depth is the current nesting depth.
func (p *Plug[O]) Depth() int { return p.depth }

// Pending is the number of requests held.
func (p *Plug[O]) Pending() int { return len(p.pending) }

// Add queues a request. Without a plug held, or with the plug disabled, it
// is submitted at once; when MaxPending are held, all are flushed.
func (p *Plug[O]) Add(r *Request[O]) {
	p.Requests++
	p.pending = append(p.pending, r)
	if p.depth == 0 || !p.Enabled || (p.MaxPending > 0 && len(p.pending) >= p.MaxPending) {
		p.Flush()
	}
}

// Flush sorts, merges and submits the pending requests now, even inside a
// nested plug, and waits for them (blk_flush_plug).
func (p *Plug[O]) Flush() {
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
	Unsupported error // EINVAL, ESPIPE, EOPNOTSUPP: the operation is not supported (IsUnsupported)
	IOError     error // any other error
}

// Result summarises a submitted batch.
func Result[O comparable](batch []*Request[O]) BatchResult {
	res := BatchResult{Requests: len(batch)}
	for _, r := range batch {
		switch {
		case r.Err == nil:
		case IsUnsupported(r.Err):
			if res.Unsupported == nil {
				res.Unsupported = r.Err
			}
		default:
			if res.IOError == nil {
				res.IOError = r.Err
			}
		}
	}
	return res
}

// IsUnsupported reports whether err says the file's filesystem does not
// support the call (sync_file_range(2): EINVAL, ESPIPE; EOPNOTSUPP).
func IsUnsupported(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ESPIPE) || errors.Is(err, unix.EOPNOTSUPP)
}

// SortAndMerge orders requests by (device, inode, offset) and folds
// adjacent or overlapping ranges of the same file, mode and owner into one
// request (blk_mq_sort_plug_list, then the elevator's back-merge). The
// result reuses reqs' storage; a folded request's Merged counts what it
// absorbed.
func SortAndMerge[O comparable](reqs []*Request[O]) []*Request[O] {
	slices.SortStableFunc(reqs, func(a, b *Request[O]) int {
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
			if last.Dev == r.Dev && last.Ino == r.Ino && last.Integrity == r.Integrity && last.Owner == r.Owner && r.Off <= last.End() {
				if r.Len == 0 || last.Len == 0 {
					last.Len = 0
				} else if e := r.End(); e > last.End() {
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
