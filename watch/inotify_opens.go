package watch

import (
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/inode"
	"flusherd/policy"
	"flusherd/tree"
)

// openGrace is how long a name stays open before the inotify watcher
// reports it to the sweep (Sink.InodesOpened). inotify's events name no
// process, so the daemon's own opens (a scan's, an attempt's, a look of
// the sweep's) come as any other; they are closed within it and make no
// report.
const openGrace = 200 * time.Millisecond

// probeWait is how long the inotify watcher waits for a probe for a
// file's writers (inode.HeldForWrite) before it takes the outcome as
// unknown: an open on a stalled FUSE mount may not return.
const probeWait = 100 * time.Millisecond

// openCount is a name's opens less its closes (IN_OPEN, IN_CLOSE_WRITE,
// IN_CLOSE_NOWRITE), from when it rose from 0.
//
// inotify merges two like events in a row, so a count may be off: two
// closes merged (two readers) leave it above 0 for ever, two opens merged
// take it to 0 while a writer still holds the file. A close of a reported
// name that leaves the count above 0, or takes it to 0, is therefore
// checked by a probe for writers openGrace later
// (policy.OpenCountAfterProbe). The probe runs on the watcher's goroutine
// between two events, so an open after it comes as an event after it.
type openCount struct {
	n        int32
	since    time.Time
	tree     tree.Tree
	reported bool      // an open report was sent, with key
	key      inode.Key // the file's, once reported or probed
	// probeDue is when the count is checked by a probe (zero: not
	// due). settled: a probe found a writer, or could not tell, since
	// the last IN_CLOSE_WRITE: a close that leaves the count above 0
	// needs no probe (the probe's own open and close are such).
	probeDue time.Time
	settled  bool
}

// inotifyOpens is the inotify watcher's open counts, by name; only Run's
// goroutine uses it.
type inotifyOpens struct {
	names map[string]*openCount
	// moving holds the counts of a name renamed away (IN_MOVED_FROM),
	// by the rename's cookie, for its IN_MOVED_TO: under the new name
	// the file is still open. Let go (closed) at the end of the batch
	// after the IN_MOVED_FROM's if no IN_MOVED_TO came by then (moved
	// out of the trees; the reader may split the pair of events).
	moving map[uint32]*movingOpens
	timer  *time.Timer
	due    time.Time // when timer fires; zero: not armed
	// probe looks for the writers of a file (probeWriters; tests
	// replace it).
	probe func(path string, key inode.Key) policy.Writers
	// stuck is set while a probe that was given up on has not
	// returned: no other is made until it does.
	stuck atomic.Bool
	// refused holds the first error that refused a probe (no
	// CAP_LEASE on another user's file, a filesystem without leases),
	// until it is logged (refusalLogged).
	refused       atomic.Pointer[error]
	refusalLogged bool
}

// probeWriters is inotifyOpens.probe: inode.HeldForWrite, on a goroutine
// of its own, waited for probeWait at most.
func (o *inotifyOpens) probeWriters(path string, key inode.Key) policy.Writers {
	if o.stuck.Load() {
		return policy.WritersUnknown
	}
	out := make(chan policy.Writers, 1)
	go func() {
		held, err := inode.HeldForWrite(path, key)
		switch {
		case err != nil:
			if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EINVAL) {
				o.refused.CompareAndSwap(nil, &err)
			}
			out <- policy.WritersUnknown
		case held:
			out <- policy.WritersSome
		default:
			out <- policy.WritersNone
		}
		o.stuck.Store(false)
	}()
	t := time.NewTimer(probeWait)
	defer t.Stop()
	select {
	case w := <-out:
		return w
	case <-t.C:
		o.stuck.Store(true)
		return policy.WritersUnknown
	}
}

// movedOpen is a count taken from under a renamed name: rel is the
// name's path below the renamed entry ("" for the entry itself).
type movedOpen struct {
	rel string
	c   *openCount
}

// C is the channel of the timer for the next report due (nil: none).
func (o *inotifyOpens) C() <-chan time.Time {
	if o.timer == nil || o.due.IsZero() {
		return nil
	}
	return o.timer.C
}

// arm makes the timer fire at at, or sooner if it is armed sooner.
func (o *inotifyOpens) arm(at time.Time) {
	if !o.due.IsZero() && !at.Before(o.due) {
		return
	}
	o.due = at
	d := max(time.Until(at), time.Millisecond)
	if o.timer == nil {
		o.timer = time.NewTimer(d)
		return
	}
	o.timer.Reset(d)
}

// stop stops the timer.
func (o *inotifyOpens) stop() {
	if o.timer != nil {
		o.timer.Stop()
	}
}

// openEvent counts an open or a close of the file ev names, in tree t. A
// close that takes a reported name's count to 0 reports it closed; a
// close with no open counted (its open was before the watch, or lost) is
// ignored.
func (w *Watcher) openEvent(t tree.Tree, ev inotifyEvent) {
	if w.opens.names == nil {
		w.opens.names = map[string]*openCount{}
	}
	c := w.opens.names[ev.Name]
	if ev.Has(opOpen) {
		if c == nil {
			c = &openCount{since: time.Now(), tree: t}
			w.opens.names[ev.Name] = c
			w.opens.arm(c.since.Add(openGrace))
		}
		c.n++
	}
	if ev.Has(opClose) && c != nil {
		c.n--
		if ev.Has(opCloseWrite) {
			c.settled = false
		}
		switch {
		case c.n <= 0 && !c.reported:
			w.dropOpen(ev.Name, c)
		case c.n <= 0 || !c.settled:
			// A reported name closed, or an unreported one whose
			// count may be high: checked by a probe.
			c.n = max(c.n, 0)
			if c.probeDue.IsZero() {
				c.probeDue = time.Now().Add(openGrace)
				w.opens.arm(c.probeDue)
			}
		}
	}
}

// probeOpen checks the count c of name with a probe for its writers
// (policy.OpenCountAfterProbe), and lets it go if the probe says so. It
// reports whether the count is kept.
func (w *Watcher) probeOpen(name string, c *openCount) bool {
	c.probeDue = time.Time{}
	key := c.key
	if !c.reported {
		k, regular, err := inode.Stat(name)
		if err != nil || !regular {
			delete(w.opens.names, name)
			return false
		}
		key = k
		c.key = k // (reported by the caller at once: its grace is over)
	}
	probe := w.opens.probe
	if probe == nil {
		probe = w.opens.probeWriters
	}
	keep, n, settled := policy.OpenCountAfterProbe(c.n, probe(name, key))
	if err := w.opens.refused.Load(); err != nil && !w.opens.refusalLogged {
		w.opens.refusalLogged = true
		w.log.Info("the probe for writers of files kept open (a read lease) is refused; their open counts are believed, and a file whose closes inotify merged stays a sweep candidate until it is deleted. "+
			"The daemon needs to own the files or to have CAP_LEASE", zap.Error(*err))
	}
	if !keep {
		w.dropOpen(name, c)
		return false
	}
	c.n, c.settled = n, settled
	return true
}

// dropOpen forgets name's count c, and reports it closed if it was
// reported open: the report asks the candidate to linger until a sweep
// finds it clean, since inotify merges two like events in a row (two
// opens of one file), so a count may be low.
func (w *Watcher) dropOpen(name string, c *openCount) {
	if w.opens.names[name] == c {
		delete(w.opens.names, name)
	}
	if c.reported {
		w.sink.InodesOpened([]bdi.Open{{Path: name, Key: c.key, Tree: c.tree, Closes: 1, Linger: true}})
	}
}

// openNameGone forgets the count of a name removed: its closes come
// under the old name, if at all.
func (w *Watcher) openNameGone(name string) {
	if c := w.opens.names[name]; c != nil {
		w.dropOpen(name, c)
	}
}

// openMovedFrom takes the counts of a name renamed away (ev, an
// IN_MOVED_FROM with its cookie), and of every name below it if it is a
// directory, for its IN_MOVED_TO (openMovedTo): the files are still open
// under their new names.
func (w *Watcher) openMovedFrom(ev inotifyEvent) {
	var moved []movedOpen
	if c := w.opens.names[ev.Name]; c != nil {
		moved = append(moved, movedOpen{"", c})
		delete(w.opens.names, ev.Name)
	}
	if ev.Dir {
		prefix := ev.Name + "/"
		for name, c := range w.opens.names {
			if rel, ok := strings.CutPrefix(name, prefix); ok {
				moved = append(moved, movedOpen{rel, c})
				delete(w.opens.names, name)
			}
		}
	}
	if len(moved) == 0 {
		return
	}
	if ev.Cookie == 0 {
		for _, m := range moved {
			w.dropOpen(ev.Name, m.c)
		}
		return
	}
	if w.opens.moving == nil {
		w.opens.moving = map[uint32]*movingOpens{}
	}
	m := w.opens.moving[ev.Cookie]
	if m == nil {
		m = &movingOpens{}
		w.opens.moving[ev.Cookie] = m
	}
	m.moved = append(m.moved, moved...)
}

// movingOpens is the counts of a rename waiting for its IN_MOVED_TO;
// aged: a batch has ended since its IN_MOVED_FROM.
type movingOpens struct {
	moved []movedOpen
	batchAge
}

// openMovedTo puts the counts a rename took (openMovedFrom, by ev's
// cookie) under the new name ev (in tree t), and tells the sink the new
// path of those reported (a report that neither opens nor closes).
func (w *Watcher) openMovedTo(t tree.Tree, ev inotifyEvent) {
	mv, ok := w.opens.moving[ev.Cookie]
	if !ok || ev.Cookie == 0 {
		return
	}
	delete(w.opens.moving, ev.Cookie)
	var reports []bdi.Open
	for _, m := range mv.moved {
		name := ev.Name
		if m.rel != "" {
			name = ev.Name + "/" + m.rel
		}
		if old := w.opens.names[name]; old != nil {
			w.dropOpen(name, old)
		}
		m.c.tree = t
		w.opens.names[name] = m.c
		if m.c.reported {
			reports = append(reports, bdi.Open{Path: name, Key: m.c.key, Tree: t})
		}
	}
	if len(reports) > 0 {
		w.sink.InodesOpened(reports)
	}
}

// endMoves ends a batch for the renames: it lets go of the counts of
// names renamed out of the trees (no IN_MOVED_TO came by the end of the
// batch after their IN_MOVED_FROM's), reported closed.
func (w *Watcher) endMoves() {
	endPairs(w.opens.moving, func(mv *movingOpens) {
		for _, m := range mv.moved {
			w.dropOpen(m.rel, m.c)
		}
	})
}

// dropOpens drops every count (events were lost): a name not reported
// yet is forgotten; a reported one is checked by a probe for writers at
// once, which keeps it if a writer holds the file and lets it go
// otherwise (policy.OpenCountAfterProbe at a count of 0).
func (w *Watcher) dropOpens() {
	now := time.Now()
	for name, c := range w.opens.names {
		if !c.reported {
			w.dropOpen(name, c)
			continue
		}
		c.n, c.settled, c.probeDue = 0, false, now
	}
	w.opens.arm(now)
}

// reportOpens reports the names open for openGrace by now as open (a
// regular file, looked at without following a symlink), and arms the
// timer for the next one due.
func (w *Watcher) reportOpens(now time.Time) {
	w.opens.due = time.Time{}
	var next time.Time
	var reports []bdi.Open
	for name, c := range w.opens.names {
		if !c.probeDue.IsZero() {
			if c.probeDue.After(now) {
				if next.IsZero() || c.probeDue.Before(next) {
					next = c.probeDue
				}
			} else if !w.probeOpen(name, c) {
				continue
			}
		}
		if c.reported {
			continue
		}
		if at := c.since.Add(openGrace); at.After(now) {
			if next.IsZero() || at.Before(next) {
				next = at
			}
			continue
		}
		key := c.key // (looked at by a probe just now)
		if key == (inode.Key{}) {
			k, regular, err := inode.Stat(name)
			if err != nil || !regular {
				delete(w.opens.names, name)
				continue
			}
			key = k
		}
		c.reported, c.key = true, key
		reports = append(reports, bdi.Open{Path: name, Key: key, Tree: c.tree, Open: true, Linger: true})
	}
	if len(reports) > 0 {
		w.sink.InodesOpened(reports)
	}
	if !next.IsZero() {
		w.opens.arm(next)
	}
}
