package service

import (
	"encoding/binary"
	"errors"
	"flusherd/internal/logpath"
	"flusherd/tree"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// TreeClaimDir is where the daemons of a host claim their trees, whatever
// their stats.dir: under the runtime directory of the systemd unit, which
// its sandbox lets the daemon write and every other root process sees.
const TreeClaimDir = "/run/flusherd/trees"

// ErrTreeClaimed is the error of a claim that another flusherd holds: the
// tree, a tree it serves with its subdirectories around it, or a tree
// inside it.
var ErrTreeClaimed = errors.New("another flusherd serves the tree")

// ClaimError is a refused claim on Root. Other is the other daemon's root
// when it is Root itself or a directory above it; "" when it lies inside
// Root. Pid is the other daemon's, or 0 when it is in another pid
// namespace.
type ClaimError struct {
	Root, Other string
	Pid         int
}

func (e *ClaimError) Error() string {
	who := fmt.Sprintf("another flusherd (pid %d)", e.Pid)
	if e.Pid <= 0 {
		who = "another flusherd (in another pid namespace)"
	}
	switch e.Other {
	case e.Root:
		return fmt.Sprintf("%s is served by %s; stop it first", strconv.Quote(e.Root), who)
	case "":
		return fmt.Sprintf("a tree inside %s is served by %s; stop it first", strconv.Quote(e.Root), who)
	}
	return fmt.Sprintf("%s is inside %s, which %s serves with its subdirectories; stop it first",
		strconv.Quote(e.Root), strconv.Quote(e.Other), who)
}

func (e *ClaimError) Unwrap() error { return ErrTreeClaimed }

// TreeClaims are a daemon's claims on its trees' roots, so that a second
// daemon over one of them is refused. Each directory has a claim file in
// the claim directory, named <major>:<minor>:<inode>-<hash of its file
// handle> (the handle tells a directory from a later one with its inode
// number; without handles, <major>:<minor>:<inode>), with POSIX record
// locks (fcntl F_SETLK, whose F_GETLK names the holder's pid):
//
//   - byte 0 is write-locked by the daemon whose tree root it is;
//   - byte 1 is write-locked by the daemon whose recursive tree root it
//     is, and read-locked by each daemon with a tree root below it;
//   - byte 2 is read-locked by each daemon that has the file open: the
//     last one out removes it, under a lock of the whole file.
//
// A tree inside another daemon's recursive tree, or around another
// daemon's tree, is refused by byte 1. The kernel drops the locks when
// the process ends, however it ends. Record locks belong to the process:
// one TreeClaims per process, on one goroutine. A nil *TreeClaims claims
// nothing.
type TreeClaims struct {
	// Swept is the number of stale claim files OpenTreeClaims removed.
	Swept int
	dir   string
	files map[dirKey]*claimFile
	roots map[string]heldRoot // by root path
}

// dirKey is a directory's identity: its device, inode number and a hash
// of its file handle (0 where the filesystem has no handles).
type dirKey struct{ dev, ino, handle uint64 }

// name is the claim file's name of k.
func (k dirKey) name() string {
	n := fmt.Sprintf("%d:%d:%d", unix.Major(k.dev), unix.Minor(k.dev), k.ino)
	if k.handle != 0 {
		n += fmt.Sprintf("-%016x", k.handle)
	}
	return n
}

// heldRoot is one root's claim: the claim files of the root (first) and
// of each directory above it.
type heldRoot struct {
	keys      []dirKey
	recursive bool
}

// claimFile is an open claim file and what this daemon holds of it.
type claimFile struct {
	fd   int
	name string
	// Of this daemon's roots: those that are this directory, those of
	// them that are recursive, and those below it.
	roots, recursive, below int
	held                    [2]int16 // the lock on bytes 0 and 1: F_UNLCK, F_RDLCK or F_WRLCK
}

// OpenTreeClaims makes dir (mode 0700) if needed and refuses it unless
// it is a directory of this user's that others may not write in. It
// removes the claim files no process holds (sweepStale): those a daemon
// that was killed left. Called once per process, before any claim.
func OpenTreeClaims(dir string) (*TreeClaims, error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return nil, &os.PathError{Op: "lstat", Path: dir, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		return nil, fmt.Errorf("%s is not a directory of uid %d that only it may write in", dir, os.Geteuid())
	}
	swept := sweepStale(dir)
	return &TreeClaims{dir: dir, files: map[dirKey]*claimFile{}, roots: map[string]heldRoot{}, Swept: swept}, nil
}

// sweepStale removes each claim file of dir that no process has open
// with a lock, as settle removes one its last holder lets go of: under a
// write lock of the whole file, taken without waiting. A daemon ended by
// SIGKILL (or the OOM killer) leaves its files, whose locks the kernel
// dropped. It reports how many it removed. This process must hold no
// claim in dir: closing a descriptor drops the process's record locks on
// the file.
func sweepStale(dir string) (removed int) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		name := filepath.Join(dir, e.Name())
		fd, err := unix.Open(name, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		whole := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
		if unix.FcntlFlock(uintptr(fd), unix.F_SETLK, &whole) == nil && sameFile(&claimFile{fd: fd, name: name}) {
			if unix.Unlink(name) == nil {
				removed++
			}
		}
		unix.Close(fd)
	}
	return removed
}

// Claim claims root, with its subdirectories when recursive; claimed
// already, it takes the new recursive setting. A conflict is a
// *ClaimError (ErrTreeClaimed); anything else is an error of the claim
// files. On error the claims held before are unchanged. A root whose
// directory is another now (removed and made again) is claimed anew.
func (c *TreeClaims) Claim(root string, recursive bool) error {
	if c == nil {
		return nil
	}
	keys, paths, err := dirKeys(root)
	if err != nil {
		return err
	}
	old, had := c.roots[root]
	if had && old.recursive == recursive && slices.Equal(old.keys, keys) {
		return nil
	}
	h := heldRoot{keys: keys, recursive: recursive}
	for i, k := range keys {
		f, err := c.file(k)
		if err == nil {
			f.count(i, recursive, 1)
			err = c.apply(f)
		}
		if err == nil {
			continue
		}
		if f != nil {
			f.count(i, recursive, -1)
			c.settle(k, f)
		}
		c.drop(heldRoot{keys: keys[:i], recursive: recursive})
		var cf *conflict
		if !errors.As(err, &cf) {
			return fmt.Errorf("claiming %s: %w", strconv.Quote(root), err)
		}
		e := &ClaimError{Root: root, Other: paths[i], Pid: cf.pid}
		if i == 0 && cf.byte == 1 {
			e.Other = "" // a tree inside root
		}
		return e
	}
	if had {
		c.drop(old)
	}
	c.roots[root] = h
	return nil
}

// Release gives up the claim on root, if any.
func (c *TreeClaims) Release(root string) {
	if c == nil {
		return
	}
	if h, ok := c.roots[root]; ok {
		delete(c.roots, root)
		c.drop(h)
	}
}

// Close gives up every claim.
func (c *TreeClaims) Close() {
	if c == nil {
		return
	}
	for root := range c.roots {
		c.Release(root)
	}
}

// drop takes h's counts off its files.
func (c *TreeClaims) drop(h heldRoot) {
	for i, k := range h.keys {
		if f := c.files[k]; f != nil {
			f.count(i, h.recursive, -1)
			c.settle(k, f)
		}
	}
}

// count adds n to f's counts for a root at position i of its keys (0:
// the root's own directory).
func (f *claimFile) count(i int, recursive bool, n int) {
	switch {
	case i > 0:
		f.below += n
	case recursive:
		f.roots += n
		f.recursive += n
	default:
		f.roots += n
	}
}

// settle applies f's counts after a decrease (which only lowers locks,
// and cannot conflict), and closes f when it holds nothing; the file is
// removed if no other process holds a lock on it.
func (c *TreeClaims) settle(k dirKey, f *claimFile) {
	c.apply(f)
	if f.roots+f.below > 0 {
		return
	}
	delete(c.files, k)
	whole := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
	if unix.FcntlFlock(uintptr(f.fd), unix.F_SETLK, &whole) == nil && sameFile(f) {
		// No other daemon has it open; one that opened it and waits
		// for byte 2 finds it unlinked (file) and makes a new one.
		unix.Unlink(f.name)
	}
	unix.Close(f.fd)
}

// want is the lock f's counts ask for on byte b.
func (f *claimFile) want(b int) int16 {
	switch {
	case b == 0 && f.roots > 0, b == 1 && f.recursive > 0:
		return unix.F_WRLCK
	case b == 1 && f.below > 0:
		return unix.F_RDLCK
	}
	return unix.F_UNLCK
}

// apply sets f's locks to what its counts ask for. A lock another
// process holds is a *conflict.
func (c *TreeClaims) apply(f *claimFile) error {
	for b := range 2 {
		if w := f.want(b); f.held[b] != w {
			if err := setlk(f.fd, b, w); err != nil {
				return err
			}
			f.held[b] = w
		}
	}
	return nil
}

// file returns the open claim file of k, with byte 2 read-locked. One
// that another daemon's settle removed while it was opened is opened
// again.
func (c *TreeClaims) file(k dirKey) (*claimFile, error) {
	if f := c.files[k]; f != nil {
		return f, nil
	}
	name := filepath.Join(c.dir, k.name())
	for range 8 {
		fd, err := unix.Open(name, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: name, Err: err}
		}
		// Waits only for a settle that holds the whole file, briefly.
		lk := unix.Flock_t{Type: unix.F_RDLCK, Whence: io.SeekStart, Start: 2, Len: 1}
		if err := unix.FcntlFlock(uintptr(fd), unix.F_SETLKW, &lk); err != nil {
			unix.Close(fd)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return nil, &os.PathError{Op: "fcntl F_SETLKW", Path: name, Err: err}
		}
		f := &claimFile{fd: fd, name: name, held: [2]int16{unix.F_UNLCK, unix.F_UNLCK}}
		if !sameFile(f) {
			unix.Close(fd) // removed meanwhile
			continue
		}
		c.files[k] = f
		return f, nil
	}
	return nil, fmt.Errorf("%s: removed again and again while opened", name)
}

// sameFile reports whether f's descriptor is the file at its name.
func sameFile(f *claimFile) bool {
	var a, b unix.Stat_t
	return unix.Fstat(f.fd, &a) == nil && unix.Stat(f.name, &b) == nil && a.Nlink > 0 && a.Dev == b.Dev && a.Ino == b.Ino
}

// conflict is a lock on byte of a claim file held by the process pid.
type conflict struct {
	byte int
	pid  int
}

func (c *conflict) Error() string { return fmt.Sprintf("byte %d locked by pid %d", c.byte, c.pid) }

// setlk sets the lock typ on byte b of fd (F_SETLK, without waiting). A
// lock held by another process is a *conflict naming it (F_GETLK).
func setlk(fd, b int, typ int16) error {
	for range 8 {
		lk := unix.Flock_t{Type: typ, Whence: io.SeekStart, Start: int64(b), Len: 1}
		err := unix.FcntlFlock(uintptr(fd), unix.F_SETLK, &lk)
		if err == nil || (!errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EACCES)) {
			return err
		}
		q := unix.Flock_t{Type: typ, Whence: io.SeekStart, Start: int64(b), Len: 1}
		if err := unix.FcntlFlock(uintptr(fd), unix.F_GETLK, &q); err != nil {
			return err
		}
		if q.Type != unix.F_UNLCK {
			return &conflict{byte: b, pid: int(q.Pid)}
		}
		// Released in between: try again.
	}
	return &conflict{byte: b}
}

// dirKeys returns the identities and paths of root and of each directory
// above it, root first. One above it that cannot be looked at is left
// out.
func dirKeys(root string) ([]dirKey, []string, error) {
	var keys []dirKey
	var paths []string
	for p := filepath.Clean(root); ; p = filepath.Dir(p) {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			if len(keys) == 0 {
				return nil, nil, &os.PathError{Op: "stat", Path: p, Err: err}
			}
		} else {
			keys, paths = append(keys, dirKey{st.Dev, st.Ino, handleHash(p)}), append(paths, p)
		}
		if p == "/" || p == "." {
			return keys, paths, nil
		}
	}
}

// handleHash is a hash of the file handle of the directory p and of its
// filesystem's id (statfs f_fsid, from the superblock's UUID where it has
// one), or 0 when it has no handle (name_to_handle_at(2) refused). The
// fsid tells the root of a new filesystem, mounted on a device number that
// another one had (every ext4 root is inode 2 with the same handle), from
// the old one's, which a daemon may still hold claimed.
func handleHash(p string) uint64 {
	fh, _, err := unix.NameToHandleAt(unix.AT_FDCWD, p, unix.AT_SYMLINK_FOLLOW)
	if err != nil {
		return 0
	}
	h := fnv.New64a()
	binary.Write(h, binary.LittleEndian, fh.Type())
	h.Write(fh.Bytes())
	var sfs unix.Statfs_t
	if unix.Statfs(p, &sfs) == nil {
		binary.Write(h, binary.LittleEndian, sfs.Fsid.Val)
	}
	return h.Sum64()
}

// OpenClaims opens the host's tree claims in dir (OpenTreeClaims). When
// it cannot, the daemon runs without them (nil), and says so: a warning
// for root, whom the unit and a root shell let write there.
func OpenClaims(dir string, log *zap.Logger) *TreeClaims {
	c, err := OpenTreeClaims(dir)
	if err != nil {
		lvl := zap.InfoLevel
		if os.Geteuid() == 0 {
			lvl = zap.WarnLevel
		}
		log.Log(lvl, "the trees are not claimed: another flusherd started over them would not be refused", logpath.String("dir", dir), zap.Error(err))
	} else if c.Swept > 0 {
		log.Info("removed the tree claim files of daemons that were killed", logpath.String("dir", dir), zap.Int("files", c.Swept))
	}
	return c
}

// ClaimTrees claims the root of each of d's trees (TreeClaims.Claim).
// Another daemon's claim is an error (ErrTreeClaimed); a tree the claim
// files cannot record is logged and served unclaimed.
func (d *Daemon) ClaimTrees() error {
	for _, t := range d.Trees {
		if err := d.claim(t); err != nil {
			return err
		}
	}
	return nil
}

// claim claims t's root; only another daemon's claim is an error.
func (d *Daemon) claim(t tree.Tree) error {
	err := d.Claims.Claim(t.Root, t.Recursive)
	if err != nil && !errors.Is(err, ErrTreeClaimed) {
		d.Log.Warn("cannot claim the tree: another flusherd started over it would not be refused", logpath.String("root", t.Root), zap.Error(err))
		return nil
	}
	return err
}
