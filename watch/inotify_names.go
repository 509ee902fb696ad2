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
// change).
func (w *Watcher) forgetKey(path string) {
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
}

// unlinked tells the sink that the file key lost the name path.
func (w *Watcher) unlinked(key inode.Key, path string) { w.sink.NameUnlinked(key, path) }
