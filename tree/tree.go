// Package tree is a watched directory tree: the [[watch]] entry that config
// decodes, the tree that watch serves and reports its files with, what bdi
// tracks each of those files under, and what a reload compares.
package tree

import "time"

// Mode is how a tree's files are written back: a [[watch]] entry's mode.
type Mode string

// Values of [Tree.Mode].
const (
	// ModeWriteback writes dirty data back without waiting for completion
	// (WB_SYNC_NONE semantics).
	ModeWriteback Mode = "writeback"
	// ModeIntegrity writes dirty data back and waits for it (WB_SYNC_ALL
	// semantics).
	ModeIntegrity Mode = "integrity"
)

// Tree is one watched directory tree and the settings its files take.
type Tree struct {
	// Root is the directory: absolute and cleaned as configured, and
	// symlink-free once resolved for watching.
	Root string
	// Recursive includes the whole tree below Root.
	Recursive bool
	// Mode is ModeWriteback or ModeIntegrity; "" is writeback.
	Mode Mode
	// Expire is the tree's dirty_expire_interval.
	Expire time.Duration
}

// Integrity reports whether the tree's files are written back with
// fdatasync(2) (ModeIntegrity) rather than sync_file_range(2).
func (t Tree) Integrity() bool { return t.Mode == ModeIntegrity }
