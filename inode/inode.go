// Package inode is one tracked file: its identity, its writeback state, and
// the system calls that open it safely and write its dirty page-cache data
// back.
//
// An Inode models the part of the kernel's struct inode that fs/fs-writeback.c
// uses: i_state (I_DIRTY, I_SYNC), dirtied_when and i_io_list (the bdi list it
// is on). Identity is (st_dev, st_ino), so hard links are tracked once.
//
// The state fields are guarded by the owning bdi's list lock; this package
// does not lock.
package inode

import (
	"encoding/binary"
	"strings"
	"time"
	"unique"
	"unsafe"

	"flusherd/lists"
)

// Key identifies an inode: stat(2)'s st_dev and st_ino.
type Key struct {
	Dev uint64
	Ino uint64
}

// State is a set of flags, like i_state.
type State uint16

const (
	// Dirty: the inode has dirty data flusherd has not yet written (I_DIRTY_PAGES).
	Dirty State = 1 << iota
	// Sync: a writeback attempt for it is in flight (I_SYNC).
	Sync
	// Redirtied: it was marked dirty while Sync was set.
	Redirtied
	// Busy: a writeback system call for it exceeded the attempt timeout
	// and has not returned yet (it cannot be cancelled); no new attempt is
	// made until it does.
	Busy
	// Integrity: its tree is in "integrity" mode; writeback uses fdatasync.
	Integrity
	// Dropped: its tree went away while an attempt was in flight; the
	// attempt's completion forgets it.
	Dropped
	// hasHandle: the inode's alt (held in its names field) is its file
	// handle (else the other path).
	hasHandle
	// Leaving: its tree was removed from the configuration; it is written
	// back once more and then forgotten, whatever the outcome.
	Leaving
	// DataError: a writeback of its data failed with an I/O error
	// (policy.IOError: EIO, ENOSPC...) since it was last written. If it
	// is then found clean without flusherd writing anything, the kernel
	// dropped the pages: the data is lost, and it is reported as failed
	// until written again.
	DataError
	// Wrote: an attempt of flusherd's wrote its dirty pages (and saw no
	// error) since it became dirty. If a later attempt finds it clean,
	// flusherd wrote its data: nothing left the page cache behind its back.
	Wrote
	// Touched: it was marked dirty since the device's last background
	// check (bdi's wbCheckBackgroundFlush), which looks at such inodes.
	Touched
	// Streaming: it was marked dirty before the last background check
	// too: a file being written over time, whose range behind its tail
	// may be written back (range_bytes) once it is Streaming2 too.
	Streaming
	// Streaming2: it was Streaming at the last check and written since:
	// written across three consecutive checks, over 200 ms or more (a
	// one-off write that spans one check boundary is not streaming).
	Streaming2
	// Background: background work took it before it expired; kupdate
	// leaves it to background work until it expires (it is on b_io,
	// taken by a work that ended before its attempt, or on
	// b_more_io_wait or b_more_io for a reason of background work's: a
	// chunk written, a redirty during its attempt).
	Background
	// LostBefore: its data was lost (it was parked as failed) and it
	// was reported again. The loss stands until an attempt finds data
	// written since: the report may have been a close (FAN_CLOSE_WRITE,
	// inotify's IN_CLOSE_WRITE), which writes nothing, and an attempt
	// that finds it clean parks it as failed again.
	LostBefore
	// Unlinked: a deletion of one of its names, or of the inode, was
	// told (bdi's Writeback.Unlinked, NameUnlinked) since it was last
	// reported: a report of its number that comes without a handle
	// (inotify) asks for the file's handle, since a new file may have
	// taken the number (ext4 reuses numbers at once).
	Unlinked
)

// ErrnoOther is LastErr for an error that is not an errno.
const ErrnoOther = 255

// Inode is one tracked file. Keep it small: a daemon may track millions.
// Its fields are ordered so that it has no padding: 64 bytes on 64-bit
// platforms, one allocation of Go's 64-byte size class (inode_test.go
// checks it), with one more for its name and handle or other path (see
// names). Make one with New.
type Inode struct {
	lists.Entry[*Inode]

	ino uint64
	// loc is the directory of the absolute path at which it was last seen
	// and its device (Key's Dev), interned: the files of one directory
	// share it. Its name is held in names: see Path.
	loc unique.Handle[location]
	// names points to one allocation that holds the inode's name and
	// its alt: the uvarint lengths of the two in bytes
	// (encoding/binary's encoding: 1 byte each below 128), then the name,
	// then alt. names is nil when both are empty. A pointer, not a
	// string, to save the string's length word: the bytes are never
	// written once made. alt is the inode's file handle when its
	// filesystem supports opens by handle (hasHandle is set; such an
	// inode is opened by handle, so a rename never loses it), else its
	// other path: the name it was seen under before (a hard link, or the
	// name before a rename), tried before the inode is dropped when its
	// path is gone. See Handle and OtherPath.
	names *byte

	// DirtiedWhen is when the inode went from clean to dirty, on the
	// daemon's monotonic clock (nanoseconds since its epoch). A re-dirty
	// never moves it (__mark_inode_dirty).
	DirtiedWhen time.Duration

	// DirtyPages and WritebackPages are cachestat(2)'s counts as last seen,
	// in pages, for statistics.
	DirtyPages, WritebackPages uint32
	// Retries counts attempts since the inode was last clean; Errors counts
	// failed ones.
	Retries, Errors uint16

	State State
	// Class is the index of its expire class in the bdi's b_dirty: the
	// class holds the dirty_expire_interval of the tree it belongs to.
	Class uint8
	// LastErr is the last error's errno (0 for none, ErrnoOther for an
	// error that is not an errno, or an errno above 254).
	LastErr uint8
}

// location is an inode's directory (see Inode.loc) and device.
type location struct {
	dir string // "" when it has no path
	dev uint64
}

// New returns an inode with Key k and no path.
func New(k Key) *Inode {
	return &Inode{ino: k.Ino, loc: unique.Make(location{dev: k.Dev})}
}

// Key returns the inode's Key.
func (in *Inode) Key() Key {
	if in.loc == (unique.Handle[location]{}) {
		return Key{Ino: in.ino} // (a zero Inode)
	}
	return Key{Dev: in.loc.Value().dev, Ino: in.ino}
}

// is reports whether the inode's Key is k (its number compared first).
func (in *Inode) is(k Key) bool { return in.ino == k.Ino && in.Key() == k }

// dir returns the directory of its path ("" for none).
func (in *Inode) dir() string {
	if in.loc == (unique.Handle[location]{}) {
		return ""
	}
	return in.loc.Value().dir
}

// setDir sets the directory of its path, keeping its device.
func (in *Inode) setDir(dir string) {
	in.loc = unique.Make(location{dir: dir, dev: in.Key().Dev})
}

// name returns the inode's name, the last element of its path ("" for
// none).
func (in *Inode) name() string {
	name, _ := in.split()
	return name
}

// alt returns the inode's handle or other path ("" for none): see names.
func (in *Inode) alt() string {
	_, alt := in.split()
	return alt
}

// split decodes names into the name and alt.
func (in *Inode) split() (name, alt string) {
	p := in.names
	if p == nil {
		return "", ""
	}
	i := uintptr(0)
	uvarint := func() int {
		var n uint64
		for shift := uint(0); ; shift += 7 {
			b := *(*byte)(unsafe.Add(unsafe.Pointer(p), i))
			i++
			n |= uint64(b&0x7f) << shift
			if b < 0x80 {
				return int(n)
			}
		}
	}
	nn := uvarint()
	na := uvarint()
	// (A pointer past the end of the allocation is never made.)
	if nn > 0 {
		name = unsafe.String((*byte)(unsafe.Add(unsafe.Pointer(p), i)), nn)
	}
	if na > 0 {
		alt = unsafe.String((*byte)(unsafe.Add(unsafe.Pointer(p), i+uintptr(nn))), na)
	}
	return name, alt
}

// setNames stores name and alt in names, in one new allocation.
func (in *Inode) setNames(name, alt string) {
	if name == "" && alt == "" {
		in.names = nil
		return
	}
	var pre [2 * binary.MaxVarintLen64]byte
	k := binary.PutUvarint(pre[:], uint64(len(name)))
	k += binary.PutUvarint(pre[k:], uint64(len(alt)))
	b := make([]byte, 0, k+len(name)+len(alt))
	b = append(b, pre[:k]...)
	b = append(b, name...)
	b = append(b, alt...)
	in.names = &b[0]
}

// Path returns the absolute path at which the inode was last seen.
func (in *Inode) Path() string { return in.PathRef().String() }

// PathRef is the inode's path as Path would return it now, not yet built:
// taking it allocates nothing, so a caller that may not need the path
// (a log line at a level that is off) builds it only when it does.
func (in *Inode) PathRef() PathRef { return PathRef{loc: in.loc, name: in.name()} }

// PathRef is a path taken by Inode.PathRef; its zero value is "".
type PathRef struct {
	loc  unique.Handle[location]
	name string
}

// String builds the path.
func (r PathRef) String() string {
	if r.name == "" {
		return ""
	}
	d := r.loc.Value().dir
	if d == "/" {
		return "/" + r.name
	}
	return d + "/" + r.name
}

// HasPath reports whether path is the inode's path, without building it.
func (in *Inode) HasPath(path string) bool {
	i := strings.LastIndexByte(path, '/')
	if i < 0 || path[i+1:] != in.name() {
		return false
	}
	d := path[:i]
	if d == "" {
		d = "/"
	}
	return in.dir() == d
}

// SetPath records path, an absolute path, as where the inode was last seen.
func (in *Inode) SetPath(path string) {
	i := strings.LastIndexByte(path, '/')
	if i < 0 {
		in.setDir("")
		in.setNames(path, in.alt())
		return
	}
	d := path[:i]
	if d == "" {
		d = "/"
	}
	in.setDir(d)
	in.setNames(path[i+1:], in.alt())
}

// Dir returns the directory of the inode's path ("" when it has none),
// without building the path.
func (in *Inode) Dir() string { return in.dir() }

// Name returns the last component of the inode's path ("" when it has
// none), without building the path.
func (in *Inode) Name() string { return in.name() }

// InDir reports whether the inode's path is below the directory dir (an
// absolute path without a trailing slash), without building the path.
func (in *Inode) InDir(dir string) bool {
	d := in.dir()
	return d == dir || strings.HasPrefix(d, dir+"/") || (dir == "/" && in.name() != "")
}

// Handle returns the inode's file handle, or "" when it has none.
func (in *Inode) Handle() Handle {
	if in.State&hasHandle != 0 {
		return Handle(in.alt())
	}
	return ""
}

// SetHandle records the inode's file handle; it replaces the other path.
func (in *Inode) SetHandle(h Handle) {
	if h != "" {
		in.setNames(in.name(), string(h))
		in.State |= hasHandle
	}
}

// OtherPath returns the path it was seen under before Path, if it has no
// handle (else "").
func (in *Inode) OtherPath() string {
	if in.State&hasHandle != 0 {
		return ""
	}
	return in.alt()
}

// SetOtherPath records p as the other path, unless the inode has a handle.
func (in *Inode) SetOtherPath(p string) {
	if in.State&hasHandle == 0 {
		in.setNames(in.name(), p)
	}
}

// Link returns the list entry (lists.Linker).
func (in *Inode) Link() *lists.Entry[*Inode] { return &in.Entry }

// Has reports whether all of flags are set.
func (in *Inode) Has(flags State) bool { return in.State&flags == flags }
