package watch

import (
	"encoding/binary"
	"errors"
	"slices"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/inode"
	"flusherd/policy"
)

// dirCacheMax and fileCacheMax bound the directory and file caches
// (entries); a full cache is emptied and refilled. A file's entry (about
// 180 bytes with its key, handle and path) serves the events of a file
// written again soon; the file cache is the smaller, since a burst of new
// files fills it with entries no event looks up again.
const (
	dirCacheMax  = 1 << 16
	fileCacheMax = 1 << 14
)

// fanotifyDir is an entry of the directory cache (dirOf).
type fanotifyDir struct {
	path   string
	prefix string       // path with a trailing slash
	tree   *watchedTree // the tree whose files it holds, or nil
}

// fanotifyTarget is an entry of the file cache (target).
type fanotifyTarget struct {
	key     inode.Key
	regular bool
	handle  inode.Handle
	path    string // as last reported
	// pathGen is the directory cache's generation (dirGen) when path was
	// last known to lead to the file.
	pathGen uint64
	// alt is another name the file was reported under, before path (a
	// link written through, or made), "" if none.
	alt string
	// gone holds the names the file lost while the entry lived (deleted:
	// FAN_DELETE; or found leading elsewhere), the latest last, at most
	// goneMax: a writer that opened the file by one writes on through it,
	// and its events are reported under path (namedBy).
	gone   []string
	events int // reported since it was last quieted (Run's goroutine only)
}

// goneMax bounds fanotifyTarget.gone.
const goneMax = 4

// lost records that the file no longer has the name p.
func (tg *fanotifyTarget) lost(p string) {
	if slices.Contains(tg.gone, p) {
		return
	}
	if len(tg.gone) == goneMax {
		tg.gone = slices.Delete(tg.gone, 0, 1)
	}
	tg.gone = append(tg.gone, p)
}

// clearCaches empties the directory and file caches.
func (fa *Fanotify) clearCaches() {
	fa.cmu.Lock()
	fa.clearDirsLocked()
	clear(fa.files)
	fa.cmu.Unlock()
}

// clearDirsLocked empties the directory cache (and so invalidates
// lastDir). Preconditions: fa.cmu held.
func (fa *Fanotify) clearDirsLocked() {
	clear(fa.dirs)
	fa.dirGen.Add(1)
}

// cacheKey builds fsid+handle_type+f_handle in fa.kbuf; m[string(key)]
// look-ups with it do not allocate.
func (fa *Fanotify) cacheKey(fsid, typ, h []byte) []byte {
	fa.kbuf = append(append(append(fa.kbuf[:0], fsid...), typ...), h...)
	return fa.kbuf
}

// dirOf returns the cached path and tree of the event's parent directory.
func (fa *Fanotify) dirOf(ev *event) (*fanotifyDir, bool) {
	d, ok, _ := fa.dirOfErr(ev)
	return d, ok
}

// dirOfErr is dirOf, with the error that kept the directory's path from
// being found (nil: its filesystem is not marked, or it is deleted).
func (fa *Fanotify) dirOfErr(ev *event) (*fanotifyDir, bool, error) {
	dev, ok := fa.devOf(ev.dirFsid)
	if !ok {
		return nil, false, nil
	}
	k := fa.cacheKey(ev.dirFsid, ev.dirType, ev.dir)
	gen := fa.dirGen.Load()
	if fa.lastDir != nil && fa.lastDirGen == gen && string(k) == string(fa.lastDirKey) {
		return fa.lastDir, fa.lastDir.path != "", nil
	}
	fa.cmu.Lock()
	d, hit := fa.dirs[string(k)]
	fa.cmu.Unlock()
	if hit {
		fa.setLastDir(d, k, gen)
		return d, d.path != "", nil
	}
	h := inode.MakeHandle(int32(binary.NativeEndian.Uint32(ev.dirType)), ev.dir)
	p, ok, err := fa.handles.PathOfHandle(dev, h)
	if err != nil {
		fa.lost(err)
	}
	if err != nil || !ok {
		// Deleted meanwhile, or its filesystem is going: not cached.
		return nil, false, err
	}
	d = &fanotifyDir{path: p, prefix: strings.TrimSuffix(p, "/") + "/", tree: fa.treeOfDir(p)}
	fa.cmu.Lock()
	if len(fa.dirs) >= dirCacheMax {
		fa.clearDirsLocked()
	}
	fa.dirs[string(k)] = d
	fa.setLastDir(d, k, fa.dirGen.Load())
	fa.cmu.Unlock()
	return d, true, nil
}

// setLastDir makes d, under cache key k (copied), the last directory,
// valid while the directory cache's generation is gen.
func (fa *Fanotify) setLastDir(d *fanotifyDir, k []byte, gen uint64) {
	fa.lastDir, fa.lastDirKey, fa.lastDirGen = d, append(fa.lastDirKey[:0], k...), gen
}

// treeOfDir returns the deepest listed tree that holds the files of
// directory dir, or nil.
func (fa *Fanotify) treeOfDir(dir string) *watchedTree {
	fa.mu.Lock()
	defer fa.mu.Unlock()
	return fa.idx.deepest(dir, func(t *watchedTree, self bool) bool { return self || t.Recursive })
}

// target identifies the event's file, cached by handle.
func (fa *Fanotify) target(ev *event) (*fanotifyTarget, bool) {
	dev, ok := fa.devOf(ev.fileFsid)
	if !ok {
		return nil, false
	}
	k := fa.cacheKey(ev.fileFsid, ev.fileType, ev.file)
	fa.cmu.Lock()
	t, hit := fa.files[string(k)]
	fa.cmu.Unlock()
	if hit {
		return t, true
	}
	h := inode.MakeHandle(int32(binary.NativeEndian.Uint32(ev.fileType)), ev.file)
	key, regular, err := fa.handles.Identify(dev, h)
	if err != nil {
		fa.lost(err)
		return nil, false
	}
	t = &fanotifyTarget{key: key, regular: regular, handle: h}
	fa.cmu.Lock()
	if len(fa.files) >= fileCacheMax {
		clear(fa.files)
	}
	fa.files[string(k)] = t
	fa.cmu.Unlock()
	return t, true
}

// lost handles an event that could not be resolved: gone files and
// directories are nothing to worry about, but an event lost for want of
// resources (out of file descriptors or memory) may have been a write, so
// the trees are rescanned with cachestat, with backoff until a rescan
// completes (scanIncomplete).
func (fa *Fanotify) lost(err error) {
	if errors.Is(err, unix.ENAMETOOLONG) {
		if !fa.longWarned.Swap(true) {
			fa.log.Warn("fanotify: a write on a marked filesystem was in a directory whose path is longer than PATH_MAX (maybe outside the trees: the mark covers the whole filesystem); writes in such directories are not tracked (logged once)", zap.Error(err))
		}
		return
	}
	if !policy.Shortage(err) {
		return
	}
	fa.scanIncomplete(err)
}
