package watch

import (
	"strings"

	"flusherd/inode"
)

// maxKeys bounds Watcher.keys: about 1.5 MiB of paths and keys.
const maxKeys = 16384

// cacheKey records in keys that path names the regular file key, emptying
// keys first when it holds maxKeys entries.
func (w *Watcher) cacheKey(path string, key inode.Key) {
	if len(w.keys) >= maxKeys {
		clear(w.keys)
	}
	w.keys[path] = key
}

// forgetKey drops what keys knows of path, after an event that says the
// name may lead elsewhere now: its entry, or the entries below it when
// path is a watched directory (moved or removed: the paths below it
// change). A name made again is not gone any more.
func (w *Watcher) forgetKey(path string) {
	delete(w.gone, path)
	if _, ok := w.keys[path]; ok {
		delete(w.keys, path)
		return
	}
	w.dmu.Lock()
	_, dir := w.dirs[path]
	w.dmu.Unlock()
	if dir {
		w.forgetKeysUnder(path)
	}
}

// forgetKeysUnder drops the entries of keys below the directory dir: a
// walk of the cache (at most maxKeys entries), as emptying it is.
func (w *Watcher) forgetKeysUnder(dir string) {
	prefix := dir + "/"
	for p := range w.keys {
		if strings.HasPrefix(p, prefix) {
			delete(w.keys, p)
		}
	}
	for p := range w.gone {
		if strings.HasPrefix(p, prefix) {
			delete(w.gone, p)
		}
	}
}

// noteGone records that the name path, removed, led to the file key.
func (w *Watcher) noteGone(path string, key inode.Key) {
	if len(w.gone) >= maxKeys {
		clear(w.gone)
	}
	w.gone[path] = key
}

// goneWrite handles a Write reported under a removed name that led to a
// file (gone): a writer holds the file open by that name. When the file
// has another name the cache knows, and that name still leads to it
// (fstatat), the write is reported under it, in its own tree (none: the
// file is outside the trees now, and not reported); a file with no other
// name known is left as a file deleted while open is (not tracked). It
// reports whether path was a gone name.
func (w *Watcher) goneWrite(path string) bool {
	key, ok := w.gone[path]
	if !ok {
		return false
	}
	if w.goneMissed[path] {
		return true
	}
	for name, k := range w.keys {
		if k != key || name == path {
			continue
		}
		if now, regular, err := inode.Stat(name); err != nil || !regular || now != key {
			continue
		}
		if t, ok := w.TreeOf(name); ok {
			w.report(t, name, key, false)
		}
		return true
	}
	w.goneMissed[path] = true
	return true
}

// scannedName is a name a scan left tracked, and its file.
type scannedName struct {
	path string
	key  inode.Key
}

// noteScanned records, for Run's goroutine (takeScanned, which it
// wakes), that a scan left the file key tracked under path. Safe for
// concurrent use.
func (w *Watcher) noteScanned(path string, key inode.Key) {
	w.smu.Lock()
	if len(w.scannedNames) < maxKeys {
		w.scannedNames = append(w.scannedNames, scannedName{path, key})
	}
	w.smu.Unlock()
	w.scannedAny.Store(true)
	select {
	case w.scanKick <- struct{}{}:
	default:
	}
}

// takeScanned caches the names noteScanned recorded, so that the Remove
// of one is told to the sink: those the cache knows nothing of (an event
// read since may have said more), and only where the name still leads to
// the file (fstatat): a name replaced between the scan's look and this one
// must not be cached with the file it led to before (a name deleted
// before this look stays unknown: its file is forgotten at its attempt).
// Run's goroutine only.
func (w *Watcher) takeScanned() {
	w.smu.Lock()
	names := w.scannedNames
	w.scannedNames = nil
	w.scannedAny.Store(false)
	w.smu.Unlock()
	for _, n := range names {
		if _, ok := w.keys[n.path]; ok {
			continue
		}
		if _, ok := w.gone[n.path]; ok {
			continue
		}
		if k, regular, err := inode.Stat(n.path); err == nil && regular && k == n.key {
			w.cacheKey(n.path, n.key)
		}
	}
	w.scannedTaken.Add(1)
}

// unlinked tells the sink that the file key lost the name path.
func (w *Watcher) unlinked(key inode.Key, path string) { w.sink.NameUnlinked(key, path) }
