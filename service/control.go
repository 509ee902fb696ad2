package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/blk"
	"flusherd/control"
	"flusherd/inode"
	"flusherd/policy"
	"flusherd/watch"
)

// ControlHandler serves the control socket's requests (see package
// control): sync (Sync), dirty, stats and status (StatusOf).
func ControlHandler(reg *bdi.Registry, wat watch.Backend) control.Handler {
	fresh := &freshReads{}
	return func(ctx context.Context, req control.Request) control.Response {
		switch req.Op {
		case "sync":
			paths := make([]string, len(req.Paths))
			for i, p := range req.Paths {
				paths[i] = string(p)
			}
			return Sync(ctx, reg, wat, paths)
		case "dirty":
			if req.Top < 0 {
				return control.Response{Error: "dirty: top must not be negative"}
			}
			under := make([]string, len(req.Paths))
			for i, p := range req.Paths {
				under[i] = string(p)
				if !filepath.IsAbs(under[i]) {
					return control.Response{Error: fmt.Sprintf("dirty: %q is not an absolute path", under[i])}
				}
			}
			fence(ctx, wat)
			files, total := dirtyFiles(reg, fresh, req.Top, under)
			var outside []control.Name
			for _, p := range under {
				if _, ok := wat.TreeOf(p); !ok && !holdsTree(wat, filepath.Clean(p)) {
					outside = append(outside, control.Name(p))
				}
			}
			return control.Response{OK: true, Dirty: files, DirtyTotal: total, Outside: outside}
		case "status":
			st := StatusOf(reg, wat)
			return control.Response{OK: true, Status: &st}
		case "stats":
			var out []control.DeviceStats
			for _, wb := range reg.Devices() {
				s := reg.Snapshot(wb)
				var buf bytes.Buffer
				s.Format(&buf, os.Getpagesize())
				out = append(out, control.DeviceStats{Bdi: wb.Name, Stats: buf.String()})
			}
			return control.Response{OK: true, Devices: out}
		}
		return control.Response{Error: fmt.Sprintf("unknown op %q (want sync, dirty, stats or status)", req.Op)}
	}
}

// fenceTimeout bounds how long a request waits for the events queued
// before it (fence).
const fenceTimeout = 2 * time.Second

// fence waits, for a sync or dirty request, until the events queued
// before it have been handled (watch.Backend.Fence): a file written just
// before the request is tracked by then. Past fenceTimeout (the watcher
// is held up) the request goes on with what is tracked.
func fence(ctx context.Context, wat watch.Backend) {
	ctx, cancel := context.WithTimeout(ctx, fenceTimeout)
	defer cancel()
	wat.Fence(ctx)
}

// pathSet is a set of absolute paths, compared as cleaned names without
// resolving links, for under: a lookup costs the depth of the path looked
// up, not the number of paths (a dirty request may name thousands).
type pathSet struct {
	all bool // "/" is one of them
	set map[string]bool
}

// newPathSet returns the set of paths (absolute).
func newPathSet(paths []string) pathSet {
	s := pathSet{set: make(map[string]bool, len(paths))}
	for _, p := range paths {
		p = filepath.Clean(p)
		if p == "/" {
			s.all = true
		}
		s.set[p] = true
	}
	return s
}

// under reports whether path (absolute, clean) is one of the set's paths
// or below one of them.
func (s pathSet) under(path string) bool {
	if s.all {
		return true
	}
	for p := path; ; {
		if s.set[p] {
			return true
		}
		i := strings.LastIndexByte(p, '/')
		if i <= 0 {
			return false
		}
		p = p[:i]
	}
}

// linkHint names the path in a watched tree that the symbolic links in p
// lead to, for the message that refuses p (a root configured through a
// symbolic link is watched under the name it resolves to); def when they
// lead nowhere in a tree. The links are only read (readlink), nothing is
// opened.
func linkHint(wat watch.Backend, p, def string) string {
	r, err := filepath.EvalSymlinks(p)
	if err != nil || r == p {
		return def
	}
	if _, ok := wat.TreeOf(r); !ok {
		return def
	}
	return "it is watched as " + strconv.Quote(r) + ": name it so"
}

// flatAbove returns the root of the tree without recursion (recursive =
// false) that p lies below, deeper than its own files, or "".
func flatAbove(wat watch.Backend, p string) string {
	for d := filepath.Dir(p); ; d = filepath.Dir(d) {
		if t, ok := wat.TreeOf(d); ok && !t.Recursive {
			return t.Root
		}
		if d == "/" || d == "." {
			return ""
		}
	}
}

// flatHint says why a path below a tree without recursion is not in it.
func flatHint(root string) string {
	return "the tree " + strconv.Quote(root) + " is watched with recursive = false: only the files directly in it are"
}

// reason is err's text for a result that names its file already: a
// *os.PathError's operation and cause without its path, which may not be
// printable (JSON turns invalid UTF-8 into U+FFFD) and is said, quoted,
// by the result.
func reason(err error) string {
	if pe, ok := errors.AsType[*os.PathError](err); ok {
		return pe.Op + ": " + pe.Err.Error()
	}
	return err.Error()
}

// holdsTree reports whether a served tree's root is below dir.
func holdsTree(wat watch.Backend, dir string) bool {
	for _, t := range wat.Trees() {
		if t.Served && (dir == "/" || strings.HasPrefix(t.Root, dir+"/")) {
			return true
		}
	}
	return false
}

// Sync writes back, with WB_SYNC_ALL work of reason "sync" on each
// device's goroutine: each named regular file in a watched tree, the
// tracked files under each named directory, or every tracked file when no
// path is named. A file deleted before its writeback is reported Gone, not
// failed.
func Sync(ctx context.Context, reg *bdi.Registry, wat watch.Backend, paths []string) control.Response {
	fence(ctx, wat)
	sp := &syncPlan{reg: reg, wat: wat, works: map[*bdi.Writeback]*syncWork{}, named: map[inode.Key]bool{}}
	if len(paths) == 0 {
		sp.addUnder("")
	}
	for _, p := range paths {
		sp.addPath(p)
	}
	return sp.run(ctx)
}

// syncPlan is a sync request's files, gathered per device.
type syncPlan struct {
	reg   *bdi.Registry
	wat   watch.Backend
	files []control.FileResult
	works map[*bdi.Writeback]*syncWork
	named map[inode.Key]bool // a file named twice (DIR and DIR/file) is written and counted once
}

// syncWork is one device's work, and where each of its files stands in
// the plan's results.
type syncWork struct {
	work  *bdi.Work
	index []int
}

// add puts ref on wb's work, once.
func (sp *syncPlan) add(wb *bdi.Writeback, ref bdi.FileRef) {
	if sp.named[ref.Key] {
		return
	}
	sp.named[ref.Key] = true
	s := sp.works[wb]
	if s == nil {
		s = &syncWork{work: &bdi.Work{SyncMode: bdi.SyncAll, Reason: "sync"}}
		sp.works[wb] = s
	}
	s.work.Files = append(s.work.Files, ref)
	s.index = append(s.index, len(sp.files))
	sp.files = append(sp.files, control.FileResult{Path: control.Name(ref.Path)})
}

// addUnder adds every tracked file under dir ("": every one).
func (sp *syncPlan) addUnder(dir string) {
	for _, wb := range sp.reg.Devices() {
		for _, ref := range wb.Refs(dir) {
			sp.add(wb, ref)
		}
	}
}

func (sp *syncPlan) fail(p, msg string) {
	sp.files = append(sp.files, control.FileResult{Path: control.Name(p), Error: msg})
}

// refuse records a path named that is no file sync can write (a bad
// argument), with the reason.
func (sp *syncPlan) refuse(p, msg string) {
	sp.files = append(sp.files, control.FileResult{Path: control.Name(p), Error: msg, Refused: true})
}

// addPath adds what a named path asks for: a regular file in a tree, the
// tracked files under a directory of a tree or above trees; anything else
// is a failure with its reason.
func (sp *syncPlan) addPath(p string) {
	if !filepath.IsAbs(p) {
		sp.refuse(p, "not an absolute path")
		return
	}
	p = filepath.Clean(p)
	// No component may be a symlink (a sync request must not reach
	// outside the trees through one), and nothing is opened for I/O.
	st, err := inode.StatPath(p)
	if errors.Is(err, unix.ELOOP) {
		sp.refuse(p, "a directory in the path is a symbolic link, which is not followed ("+linkHint(sp.wat, p, "give the path without it")+")")
		return
	}
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ENAMETOOLONG) {
			sp.refuse(p, reason(err))
		} else {
			sp.fail(p, reason(err))
		}
		return
	}
	isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
	tree, ok := sp.wat.TreeOf(p)
	switch {
	case !ok && isDir && holdsTree(sp.wat, p):
		// A directory above trees: their tracked files under it.
		sp.addUnder(p)
		return
	case !ok:
		msg := "not in a watched tree"
		if h := linkHint(sp.wat, p, ""); h != "" {
			msg += " as named (" + h + ")"
		} else if root := flatAbove(sp.wat, p); root != "" {
			msg += " (" + flatHint(root) + ")"
		}
		sp.refuse(p, msg)
		return
	case isDir && !tree.Recursive && p != tree.Root && !holdsTree(sp.wat, p):
		// A subdirectory of a tree without recursion: none of the
		// files below it is the tree's.
		sp.refuse(p, "not in a watched tree ("+flatHint(tree.Root)+")")
		return
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		sp.addUnder(p)
	case unix.S_IFREG:
		if kind, ok := watch.NoWriteback(filepath.Dir(p)); ok {
			// (No device is made for it: nothing there is tracked.)
			sp.refuse(p, "on "+kind+", a filesystem without writeback: nothing to write back")
			return
		}
		key := inode.Key{Dev: st.Dev, Ino: st.Ino}
		wb, err := sp.reg.Device(key.Dev, p)
		if err != nil {
			sp.fail(p, err.Error())
			return
		}
		sp.add(wb, bdi.FileRef{Key: key, Path: p, Tree: tree})
	case unix.S_IFLNK:
		sp.refuse(p, "a symbolic link: not followed (name the file it points to)")
	default:
		sp.refuse(p, "not a regular file or directory")
	}
}

// run queues each device's work, waits for all of it (or for ctx: the
// daemon shutting down), and returns the response.
func (sp *syncPlan) run(ctx context.Context) control.Response {
	for wb, s := range sp.works {
		wb.Queue(s.work)
	}
	for _, s := range sp.works {
		select {
		case <-s.work.Done():
		case <-ctx.Done():
			return control.Response{Error: "daemon shutting down"}
		}
		for j, i := range s.index {
			switch err := s.work.Errs[j]; {
			case err == nil:
			case policy.ClassifyErr(err) == policy.Gone:
				// Deleted since it was tracked or named: nothing
				// of it is left to write (as fsync(2) of a
				// deleted file succeeds).
				sp.files[i].Gone = true
			default:
				sp.files[i].Error = reason(err)
			}
		}
	}
	ok := true // no writeback failed (a path refused is not one)
	for _, f := range sp.files {
		if f.Error != "" && !f.Refused {
			ok = false
		}
	}
	return control.Response{OK: ok, Files: sp.files}
}

// freshReads bounds the fresh cachestat reads of the dirty listings: at
// most one runs per device, so that listings polled while a filesystem
// hangs (each read stuck in open or cachestat, on a thread of its own)
// do not pile up threads; while one is stuck, its device's files show
// their counts as last seen.
type freshReads struct {
	mu sync.Mutex
	// +checklocks:mu
	running map[*bdi.Writeback]bool
}

// read opens a tracked file and reads cachestat, giving up after a second
// (a hung filesystem): the open and the call go on in the background, the
// file is closed when they return, and until then no other read of that
// device starts (ok false).
func (fr *freshReads) read(wb *bdi.Writeback, in bdi.InodeInfo) (dirty, wbp uint64, ok bool) {
	fr.mu.Lock()
	if fr.running[wb] {
		fr.mu.Unlock()
		return 0, 0, false
	}
	if fr.running == nil {
		fr.running = map[*bdi.Writeback]bool{}
	}
	fr.running[wb] = true
	fr.mu.Unlock()
	done := func() {
		fr.mu.Lock()
		delete(fr.running, wb)
		fr.mu.Unlock()
	}
	counts, err, inTime := blk.Timed(time.Second, func() ([2]uint64, error) {
		f, err := wb.OpenInode(in)
		if err != nil {
			return [2]uint64{}, err
		}
		defer f.Close()
		d, w, err := f.Cachestat(0, 0)
		return [2]uint64{d, w}, err
	}, func([2]uint64, error) { done() })
	if inTime {
		done()
	}
	if !inTime || err != nil {
		return 0, 0, false
	}
	return counts[0], counts[1], true
}

// dirtyFiles lists the tracked files (those under one of the paths under,
// if any are given), oldest dirty data first, at most top of them (0: all),
// with a fresh cachestat of each listed file, and the number of tracked
// files they were chosen from.
func dirtyFiles(reg *bdi.Registry, fresh *freshReads, top int, under []string) (files []control.DirtyFile, total int) {
	type entry struct {
		wb *bdi.Writeback
		in bdi.InodeInfo
	}
	var all []entry
	set := newPathSet(under)
	for _, wb := range reg.Devices() {
		for _, in := range wb.Inodes() {
			if len(under) == 0 || set.under(in.Path) {
				all = append(all, entry{wb, in})
			}
		}
	}
	slices.SortFunc(all, func(a, b entry) int {
		if c := int64(a.in.DirtiedWhen - b.in.DirtiedWhen); c != 0 {
			if c < 0 {
				return -1
			}
			return 1
		}
		return strings.Compare(a.in.Path, b.in.Path)
	})
	total = len(all)
	if top > 0 && len(all) > top {
		all = all[:top]
	}
	now := reg.Now()
	// Fresh cachestat for at most 5s in all; after that (a hung
	// filesystem), the values last seen.
	deadline := time.Now().Add(5 * time.Second)
	out := make([]control.DirtyFile, 0, len(all))
	for _, e := range all {
		d := control.DirtyFile{Path: control.Name(e.in.Path), Bdi: e.wb.Name, List: e.in.List,
			DirtyPages: uint64(e.in.DirtyPages), WritebackPages: uint64(e.in.WBPages),
			AgeSeconds: (now - e.in.DirtiedWhen).Seconds(), Retries: int(e.in.Retries),
			Errors: int(e.in.Errors), Busy: e.in.Busy, Probing: e.in.Probing}
		if e.in.LastErr != 0 {
			d.LastError = unix.ErrnoName(unix.Errno(e.in.LastErr))
			if d.LastError == "" {
				d.LastError = fmt.Sprintf("errno %d", e.in.LastErr)
			}
		}
		read := false
		if !e.in.Busy && time.Now().Before(deadline) {
			var dp, wp uint64
			if dp, wp, read = fresh.read(e.wb, e.in); read {
				d.DirtyPages, d.WritebackPages = dp, wp
			}
		}
		d.PagesUnknown = !read && d.DirtyPages == 0 && d.WritebackPages == 0
		out = append(out, d)
	}
	return out, total
}
