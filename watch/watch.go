// Package watch finds the files of the configured trees that hold dirty
// data: it watches the trees with inotify (github.com/fsnotify/fsnotify),
// recursively, and reports every write or create to a Sink, the way the
// kernel calls __mark_inode_dirty; at start-up and after an event-queue
// overflow it scans the trees and reports every file that cachestat(2)
// shows dirty.
//
// Symlinks are never followed (filepath.WalkDir and lstat do not), and
// only regular files are reported; FIFOs, sockets and device nodes are
// skipped without being opened.
package watch

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/inode"
)

// Tree is one watched directory tree.
type Tree struct {
	Root      string // absolute, symlink-free directory
	Recursive bool
	bdi.Tree
}

// Sink receives dirty inodes (bdi.Registry).
type Sink interface {
	MarkInodeDirty(path string, key inode.Key, h inode.Handle, t bdi.Tree) error
}

// Watcher watches trees and feeds a Sink.
type Watcher struct {
	trees []Tree
	sink  Sink
	log   *zap.Logger
	w     *fsnotify.Watcher
	open  inode.Opener

	mu   sync.Mutex
	dirs map[string]struct{} // watched directories, for renames and removals

	// Counters, for statistics and tests.
	Events, Rescans, Overflows, Unwatched atomic.Uint64
	limitLogged                           atomic.Bool
}

// New returns a watcher for trees. Its inotify instance is made now; no
// watch is added until Start.
func New(trees []Tree, sink Sink, log *zap.Logger) (*Watcher, error) {
	if log == nil {
		log = zap.NewNop()
	}
	w, err := fsnotify.NewBufferedWatcher(4096)
	if err != nil {
		return nil, err
	}
	return &Watcher{trees: trees, sink: sink, log: log, w: w, open: inode.OS{}, dirs: map[string]struct{}{}}, nil
}

// add watches dir and records it.
func (w *Watcher) add(dir string) error {
	if err := w.w.Add(dir); err != nil {
		return err
	}
	w.mu.Lock()
	w.dirs[dir] = struct{}{}
	w.mu.Unlock()
	return nil
}

// forget drops the watches of dir and of every directory below it, if dir
// is a watched directory; a file's rename or removal costs a map look-up.
func (w *Watcher) forget(dir string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.dirs[dir]; !ok {
		return
	}
	for _, t := range w.trees {
		if t.Root == dir {
			w.log.Error("a watched tree's root was removed or renamed; that tree is no longer watched (restart flusherd once it is back)", Q(dir))
		}
	}
	prefix := dir + "/"
	for p := range w.dirs {
		if p == dir || strings.HasPrefix(p, prefix) {
			w.w.Remove(p)
			delete(w.dirs, p)
		}
	}
}

// isRoot reports whether dir is the root of a tree other than t.
func (w *Watcher) isRoot(dir string, t Tree) bool {
	for _, o := range w.trees {
		if o.Root == dir && o.Root != t.Root {
			return true
		}
	}
	return false
}

// Close stops watching. It is idempotent.
func (w *Watcher) Close() error { return w.w.Close() }

// Q quotes a file name for a log line losslessly: invalid UTF-8 and
// control characters become escapes (strconv.Quote).
func Q(path string) zap.Field { return zap.String("path", strconv.Quote(path)) }

// TreeOf returns the deepest tree whose root contains path.
func (w *Watcher) TreeOf(path string) (Tree, bool) {
	best := -1
	for i, t := range w.trees {
		if path == t.Root || strings.HasPrefix(path, t.Root+"/") || t.Root == "/" {
			if !t.Recursive && filepath.Dir(path) != t.Root && path != t.Root {
				continue
			}
			if best < 0 || len(t.Root) > len(w.trees[best].Root) {
				best = i
			}
		}
	}
	if best < 0 {
		return Tree{}, false
	}
	return w.trees[best], true
}

// Start adds a watch on every directory of every tree and scans the files
// with cachestat, reporting those with dirty or writeback pages. A
// directory is watched before its files are scanned, so a file written
// meanwhile is seen by one or the other. It returns an error only when a
// tree's root cannot be watched.
//
// Start stops scanning (not watching) when ctx ends, and returns nil then.
func (w *Watcher) Start(ctx context.Context) error {
	for _, t := range w.trees {
		if err := w.add(t.Root); err != nil {
			return w.addErr(t.Root, err)
		}
		w.scanDir(ctx, t, t.Root, true)
	}
	return nil
}

func (w *Watcher) addErr(dir string, err error) error {
	if errors.Is(err, unix.ENOSPC) {
		w.Unwatched.Add(1)
		if !w.limitLogged.Swap(true) {
			max, _ := os.ReadFile("/proc/sys/fs/inotify/max_user_watches")
			w.log.Error("out of inotify watches: raise fs.inotify.max_user_watches; directories beyond the limit are not watched",
				zap.String("max_user_watches", strings.TrimSpace(string(max))), Q(dir))
		}
	}
	return &fs.PathError{Op: "inotify_add_watch", Path: dir, Err: err}
}

// scanDir walks dir (the whole subtree when the tree is recursive): it
// watches each subdirectory as it reaches it, then reports its regular
// files. With onlyDirty, only files cachestat shows dirty are reported
// (start-up, overflow); otherwise every file is (a directory that just
// appeared: its files may have been written before the watch existed).
func (w *Watcher) scanDir(ctx context.Context, t Tree, dir string, onlyDirty bool) {
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if ctx.Err() != nil {
			return fs.SkipAll
		}
		if err != nil {
			if path != dir && !errors.Is(err, fs.ErrNotExist) {
				w.log.Warn("cannot read directory", Q(path), zap.Error(err))
			}
			return nil
		}
		if d.IsDir() {
			if path == dir {
				return nil
			}
			if !t.Recursive || w.isRoot(path, t) {
				// Another tree's root is scanned with its own
				// settings (expire, mode).
				return fs.SkipDir
			}
			if err := w.add(path); err != nil {
				if !errors.Is(err, unix.ENOSPC) && !errors.Is(err, fs.ErrNotExist) {
					w.log.Warn("cannot watch directory", Q(path), zap.Error(err))
				} else {
					w.addErr(path, err)
				}
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		w.report(t, path, onlyDirty)
		return nil
	})
}

// report hands a regular file at path to the sink; with onlyDirty only if
// cachestat shows dirty or writeback pages.
func (w *Watcher) report(t Tree, path string, onlyDirty bool) {
	key, regular, err := inode.Stat(path)
	if err != nil || !regular {
		return
	}
	if onlyDirty {
		f, err := w.open.Open(path, key)
		if err != nil {
			return
		}
		dirty, wb, err := f.Cachestat(0, 0)
		f.Close()
		if err != nil || dirty+wb == 0 {
			return
		}
	}
	if err := w.sink.MarkInodeDirty(path, key, "", t.Tree); err != nil {
		w.log.Warn("cannot track file", Q(path), zap.Error(err))
	}
}

// Rescan scans every tree again with cachestat (after an overflow). Files
// already tracked keep their dirtiedWhen.
func (w *Watcher) Rescan() {
	w.Rescans.Add(1)
	for _, t := range w.trees {
		w.scanDir(context.Background(), t, t.Root, true)
	}
}

// Run handles events until ctx ends or the watcher is closed.
func (w *Watcher) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.w.Events:
			if !ok {
				return
			}
			w.Events.Add(1)
			w.handle(ev)
		case err, ok := <-w.w.Errors:
			if !ok {
				return
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				w.Overflows.Add(1)
				w.log.Warn("inotify event queue overflowed; rescanning the trees with cachestat")
				w.Rescan()
				continue
			}
			w.log.Warn("watch error", zap.Error(err))
		}
	}
}

func (w *Watcher) handle(ev fsnotify.Event) {
	t, ok := w.TreeOf(ev.Name)
	if !ok {
		return
	}
	switch {
	case ev.Has(fsnotify.Create):
		var st unix.Stat_t
		if err := unix.Lstat(ev.Name, &st); err != nil {
			return
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if !t.Recursive {
				return
			}
			if err := w.add(ev.Name); err != nil {
				w.addErr(ev.Name, err)
			}
			// Files made in it before the watch existed sent no event.
			w.scanDir(context.Background(), t, ev.Name, false)
		case unix.S_IFREG:
			w.report(t, ev.Name, false)
		}
	case ev.Has(fsnotify.Write):
		w.report(t, ev.Name, false)
	case ev.Has(fsnotify.Rename), ev.Has(fsnotify.Remove):
		// A directory renamed away keeps its watch under the old name:
		// drop the watches below it; its new name, if in a tree, comes
		// as a Create.
		w.forget(ev.Name)
	}
}
