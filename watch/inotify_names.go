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
		w.clearKeys()
	}
	if old, ok := w.keys[path]; ok {
		if old == key {
			return
		}
		w.countKey(old, -1)
	}
	w.keys[path] = key
	w.countKey(key, 1)
}

// dropKey drops keys' entry of path, if any.
func (w *Watcher) dropKey(path string) {
	if k, ok := w.keys[path]; ok {
		delete(w.keys, path)
		w.countKey(k, -1)
	}
}

// clearKeys empties keys.
func (w *Watcher) clearKeys() {
	clear(w.keys)
	clear(w.keyNames)
}

// countKey adds d to the number of keys' names of key.
func (w *Watcher) countKey(key inode.Key, d int32) {
	if n := w.keyNames[key] + d; n > 0 {
		w.keyNames[key] = n
	} else {
		delete(w.keyNames, key)
	}
}

// forgetKey drops what keys knows of path, after an event that says the
// name may lead elsewhere now: its entry, or the entries below it when
// path is a watched directory (moved or removed: the paths below it
// change). A gone name made again (made) is one again, but stays gone for
// the file that lost it, if another name of that file is known: its
// writer's events still name it.
func (w *Watcher) forgetKey(path string, made bool) {
	if g := w.gone[path]; g != nil {
		switch {
		case !made:
			g.reborn = false
		case w.keyNames[g.key] > 0:
			g.reborn = true
		default:
			delete(w.gone, path)
		}
	}
	if _, ok := w.keys[path]; ok {
		w.dropKey(path)
		return
	}
	w.dmu.Lock()
	_, dir := w.dirs[path]
	w.dmu.Unlock()
	if dir {
		w.forgetKeysUnder(path)
	}
}

// forgetKeysUnder drops the entries of keys and gone below the directory
// dir: a walk of each (at most maxKeys entries), as emptying it is.
func (w *Watcher) forgetKeysUnder(dir string) {
	prefix := dir + "/"
	for p := range w.keys {
		if strings.HasPrefix(p, prefix) {
			w.dropKey(p)
		}
	}
	for p := range w.gone {
		if strings.HasPrefix(p, prefix) {
			delete(w.gone, p)
		}
	}
}

// goneName is an entry of Watcher.gone: the file key that lost the name,
// the other name found to lead to it (alias, "" until looked for), and
// whether the name leads to a file again (reborn).
type goneName struct {
	key    inode.Key
	alias  string
	reborn bool
}

// movedGone is a gone name below a directory being renamed, relative to
// it.
type movedGone struct {
	rel string
	g   *goneName
}

// movingGone is the gone names of a directory's rename, waiting for its
// IN_MOVED_TO; aged: a batch has ended since its IN_MOVED_FROM.
type movingGone struct {
	names []movedGone
	batchAge
}

// noteGone records that the name path no longer leads to the file key.
func (w *Watcher) noteGone(path string, key inode.Key) {
	if len(w.gone) >= maxKeys {
		clear(w.gone)
	}
	w.gone[path] = &goneName{key: key}
}

// goneMovedFrom keeps the gone names below directory dir, renamed (the
// IN_MOVED_FROM of the rename cookie), for goneMovedTo.
func (w *Watcher) goneMovedFrom(dir string, cookie uint32) {
	prefix := dir + "/"
	for p, g := range w.gone {
		if rel, ok := strings.CutPrefix(p, prefix); ok {
			if w.goneMoving == nil {
				w.goneMoving = map[uint32]*movingGone{}
			}
			m := w.goneMoving[cookie]
			if m == nil {
				m = &movingGone{}
				w.goneMoving[cookie] = m
			}
			m.names = append(m.names, movedGone{rel, g})
		}
	}
}

// endGoneMoves ends a batch for goneMoving: the renames whose IN_MOVED_TO
// has not come by the end of the batch after their IN_MOVED_FROM's went
// out of the trees, and their gone names go.
func (w *Watcher) endGoneMoves() { endPairs(w.goneMoving, nil) }

// goneMovedTo puts the gone names goneMovedFrom kept for cookie below
// dir, the directory's new name: its writers' events name them there.
func (w *Watcher) goneMovedTo(dir string, cookie uint32) {
	if m := w.goneMoving[cookie]; m != nil {
		for _, n := range m.names {
			w.gone[joinPath(dir, n.rel)] = n.g
		}
		delete(w.goneMoving, cookie)
	}
}

// movingKeys are the cached names of a rename: the file renamed, or those
// below the directory renamed, with the old name and each name relative
// to it ("": the file itself); aged: a batch has ended since its
// IN_MOVED_FROM.
type movingKeys struct {
	from  string
	names []movedKey
	batchAge
}

type movedKey struct {
	rel string
	key inode.Key
}

// at is the name of n below (or, rel "", as) name.
func (n movedKey) at(name string) string {
	if n.rel == "" {
		return name
	}
	return joinPath(name, n.rel)
}

// keysMovedFrom keeps the cached name of name, renamed (the IN_MOVED_FROM
// of the rename cookie), and with dir those below it, for keysMovedTo: the
// cache drops them, and the look at the new name (created) finds those
// still there.
func (w *Watcher) keysMovedFrom(name string, dir bool, cookie uint32) {
	var names []movedKey
	if key, ok := w.keys[name]; ok {
		names = append(names, movedKey{"", key})
	}
	if dir {
		prefix := name + "/"
		for p, key := range w.keys {
			if rel, ok := strings.CutPrefix(p, prefix); ok {
				names = append(names, movedKey{rel, key})
			}
		}
	}
	if len(names) == 0 {
		return
	}
	if w.keysMoving == nil {
		w.keysMoving = map[uint32]*movingKeys{}
	}
	w.keysMoving[cookie] = &movingKeys{from: name, names: names}
}

// keysMovedTo ends the rename cookie of a file or directory now named
// name, whose IN_MOVED_TO has been handled (created looked at name and
// walked a directory): a file not found under its new name (renamed
// again, deleted, or the look failed) is told to the sink as unlinked
// under its old name, which the sink may still list it by (a file found
// is listed under its new name, and the sink leaves it alone). Its next
// pass looks at it.
func (w *Watcher) keysMovedTo(name string, cookie uint32) {
	m := w.keysMoving[cookie]
	if m == nil {
		return
	}
	delete(w.keysMoving, cookie)
	for _, n := range m.names {
		if w.keys[n.at(name)] != n.key {
			w.unlinked(n.key, n.at(m.from))
		}
	}
}

// endKeyMoves ends a batch for keysMoving: a rename whose IN_MOVED_TO has
// not come by the end of the batch after its IN_MOVED_FROM's took its
// directory out of the trees, and its names are dropped, as those of a
// file renamed out of the trees are (the sink keeps the files under
// their old names until their attempts).
func (w *Watcher) endKeyMoves() { endPairs(w.keysMoving, nil) }

// batchAge is the age of a rename's IN_MOVED_FROM, kept by its cookie
// until its IN_MOVED_TO: aged once a batch has ended since (the reader may
// split the pair across two batches, not more).
type batchAge struct{ aged bool }

// ended ends a batch for it: true when one had ended before (the rename
// took its name out of the trees), else it is aged now.
func (a *batchAge) ended() bool {
	if a.aged {
		return true
	}
	a.aged = true
	return false
}

// endPairs ends a batch for the renames waiting for their IN_MOVED_TO in
// m, by cookie: each whose batch had ended before is deleted, and handed
// to gone (if not nil).
func endPairs[T interface{ ended() bool }](m map[uint32]T, gone func(T)) {
	for cookie, v := range m {
		if v.ended() {
			delete(m, cookie)
			if gone != nil {
				gone(v)
			}
		}
	}
}

// goneWrite handles a Write reported under gone name path, once a batch:
// a writer holds the file g.key open by that name. When the file has
// another name that leads to it (fstatat), the one found before or one
// the cache knows, the write is reported under it, in its own tree (none:
// the file is outside the trees now, and not reported). A file with no
// other name known is left as a file deleted while open is (not tracked);
// a name that leads to a file again then stops being looked at.
func (w *Watcher) goneWrite(path string, g *goneName) {
	if w.goneLooked[path] {
		return
	}
	w.goneLooked[path] = true
	if g.alias == "" || !namesFile(g.alias, g.key) {
		g.alias = ""
		if w.keyNames[g.key] == 0 {
			// No other name known: left as a file deleted while
			// open is; a name that leads to a file again stops
			// being looked at.
			if g.reborn {
				delete(w.gone, path)
			}
			return
		}
		for name, k := range w.keys {
			if k == g.key && name != path && namesFile(name, g.key) {
				g.alias = name
				break
			}
		}
	}
	if g.alias == "" {
		if g.reborn {
			delete(w.gone, path)
		}
		return
	}
	if t, ok := w.TreeOf(g.alias); ok {
		w.report(t, g.alias, g.key, false)
	}
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
// must not be cached with the file it led to before. A name that no
// longer leads to its file is told to the sink as unlinked: the file is
// looked at in its next pass (forgotten if gone, written back if
// renamed), not left listed under that name until its expiry.
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
		if namesFile(n.path, n.key) {
			w.cacheKey(n.path, n.key)
		} else {
			// The name lost the file since the scan (deleted,
			// renamed, or a directory above it renamed, maybe
			// again before the new one's scan): its event may be
			// read already, or name the file where the cache does
			// not know it. The sink looks at the file at its next
			// pass if it is tracked under this name.
			w.unlinked(n.key, n.path)
		}
	}
	w.scannedTaken.Add(1)
}

// unlinked tells the sink that the file key lost the name path.
func (w *Watcher) unlinked(key inode.Key, path string) { w.sink.NameUnlinked(key, path) }
