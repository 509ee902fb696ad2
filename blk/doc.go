// Package blk is the block layer's side of flusherd's writeback, as
// block/blk-core.c is the kernel's: a plug that batches writeback requests
// and sorts and merges them (plug.go), and a queue that runs their system
// calls on workers, at most a queue depth at a time, each bounded by a
// timeout and left to its worker once it has run long enough (queue.go).
//
// It knows nothing of inodes or lists: a request is a byte range of a file
// (device, inode number, offset, length) and an opaque owner of the
// submitter's (package bdi's attempt); the submitter's hooks make the
// calls and hear how each ended.
//
//	bdi: writebackSingleInode ─► Plug.Add ─► (outermost) Finish / Flush
//	blk: SortAndMerge ─► Plug.Submit (bdi) ─► Queue.Run ─► workers: Hooks.Do
//	     ─► in time, detached or timed out ─► Hooks ─► bdi requeues
//
// Locks: a Queue never takes a lock of its submitter's and calls no hook
// under a lock; a request's state changes by compare-and-swap, so a call
// that returns as Run gives up on it ends exactly one way.
package blk
