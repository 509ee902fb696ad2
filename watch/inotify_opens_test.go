package watch

import (
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"flusherd/bdi"
	"flusherd/inode"
	"flusherd/tree"
)

// TestInotifyOpens: the inotify watcher reports a name to the sweep only
// once it has stayed open for openGrace: an open closed within it (the
// daemon's own, whose events name no process) makes no report, and a
// later close reports it closed, asking the candidate to linger; a name
// opened twice is closed by its second close; a rename or removal of the
// name ends its count; a close with no open counted, and a directory,
// make none.
func TestInotifyOpens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		tr := tree.Tree{Root: dir, Recursive: true, Expire: time.Minute}
		s := &openSink{}
		w := &Watcher{dirs: map[string]inode.Key{}, unwatched: map[string]tree.Tree{}, keys: map[string]inode.Key{}, looked: map[string]bool{}}
		w.init([]tree.Tree{tr}, sinkOf(s), Options{Opens: true})
		file := func(name string) string {
			p := filepath.Join(dir, name)
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			return p
		}
		short, held, twice, moved, sub := file("short"), file("held"), file("twice"), file("moved"), filepath.Join(dir, "sub")
		if err := os.Mkdir(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		ev := func(name string, op inotifyOp) { w.handle(inotifyEvent{Name: name, Op: op}) }
		ev(short, opOpen)
		ev(held, opOpen)
		ev(twice, opOpen)
		ev(twice, opOpen)
		ev(moved, opOpen)
		ev(sub, opOpen)
		ev(file("never"), opClose)
		time.Sleep(openGrace / 2)
		ev(short, opClose)
		time.Sleep(openGrace)
		w.reportOpens(time.Now())
		got := map[string]bdi.Open{}
		for _, o := range s.opens {
			got[o.Path] = o
		}
		heldKey, _, err := inode.Stat(held)
		if err != nil {
			t.Fatal(err)
		}
		if o, ok := got[held]; !ok || !o.Open || o.Closed || !o.Linger || o.Key != heldKey || o.Tree.Root != dir {
			t.Errorf("held open past the grace: report %+v (ok %v), want an open with its key, tree and Linger", o, ok)
		}
		for _, p := range []string{short, sub, filepath.Join(dir, "never")} {
			if o, ok := got[p]; ok {
				t.Errorf("%s reported: %+v", p, o)
			}
		}
		if len(s.opens) != 3 {
			t.Errorf("%d reports, want 3 (held, twice, moved): %+v", len(s.opens), s.opens)
		}
		s.opens = nil
		ev(held, opClose)
		ev(twice, opClose)
		closed := map[string]bool{}
		for _, o := range s.opens {
			if !o.Closed || o.Open || !o.Linger {
				t.Errorf("report %+v, want a close that lingers", o)
			}
			closed[o.Path] = true
		}
		if !closed[held] || closed[twice] || len(s.opens) != 1 {
			t.Errorf("closes reported %v, want held only (twice is open once more)", closed)
		}
		s.opens = nil
		ev(twice, opClose)
		if len(s.opens) != 1 || s.opens[0].Path != twice || !s.opens[0].Closed {
			t.Errorf("after the second close of twice: %+v", s.opens)
		}
		// (Last: a rename's other handling looks at the tree's root,
		// which this watcher, never started, does not know.)
		s.opens = nil
		ev(moved, opRename)
		if len(s.opens) != 1 || s.opens[0].Path != moved || !s.opens[0].Closed || !s.opens[0].Linger {
			t.Errorf("after a rename of an open name: %+v, want it closed", s.opens)
		}
	})
}

// TestInotifyOpensRenamed: a file renamed while open keeps its count
// under its new name (IN_MOVED_FROM and IN_MOVED_TO by their cookie),
// and the sink is told its new path; so do the files below a renamed
// directory; a file renamed out of the trees (no IN_MOVED_TO) is reported
// closed at the end of the batch.
func TestInotifyOpensRenamed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		tr := tree.Tree{Root: dir, Recursive: true, Expire: time.Minute}
		s := &openSink{}
		w := &Watcher{dirs: map[string]inode.Key{}, unwatched: map[string]tree.Tree{}, keys: map[string]inode.Key{}, looked: map[string]bool{}}
		w.init([]tree.Tree{tr}, sinkOf(s), Options{Opens: true})
		sub := filepath.Join(dir, "sub")
		if err := os.Mkdir(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		a, b, out := filepath.Join(dir, "a"), filepath.Join(sub, "b"), filepath.Join(dir, "out")
		for _, p := range []string{a, b, out} {
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []string{a, b, out} {
			w.openEvent(tr, inotifyEvent{Name: p, Op: opOpen})
		}
		time.Sleep(openGrace + time.Millisecond)
		w.reportOpens(time.Now())
		s.opens = nil
		a2, sub2 := filepath.Join(dir, "a2"), filepath.Join(dir, "sub2")
		w.openMovedFrom(inotifyEvent{Name: a, Op: opRename, Cookie: 1})
		w.openMovedTo(tr, inotifyEvent{Name: a2, Op: opCreate, Cookie: 1})
		w.openMovedFrom(inotifyEvent{Name: sub, Op: opRename, Cookie: 2, Dir: true})
		w.openMovedTo(tr, inotifyEvent{Name: sub2, Op: opCreate, Cookie: 2, Dir: true})
		w.openMovedFrom(inotifyEvent{Name: out, Op: opRename, Cookie: 3})
		paths := map[string]bdi.Open{}
		for _, o := range s.opens {
			paths[o.Path] = o
		}
		for _, p := range []string{a2, filepath.Join(sub2, "b")} {
			if o, ok := paths[p]; !ok || o.Open || o.Closed {
				t.Errorf("%s: report %+v (ok %v), want its new path, neither open nor closed", p, o, ok)
			}
		}
		if len(s.opens) != 2 {
			t.Errorf("reports %+v, want the two new paths", s.opens)
		}
		s.opens = nil
		w.endMoves()
		if len(s.opens) != 1 || !s.opens[0].Closed {
			t.Errorf("after the batch: %+v, want the file moved out reported closed", s.opens)
		}
		s.opens = nil
		w.openEvent(tr, inotifyEvent{Name: a2, Op: opClose})
		w.openEvent(tr, inotifyEvent{Name: filepath.Join(sub2, "b"), Op: opClose})
		if len(s.opens) != 2 || !s.opens[0].Closed || !s.opens[1].Closed {
			t.Errorf("closes under the new names: %+v, want both closed", s.opens)
		}
		if n := len(w.opens.names); n != 0 {
			t.Errorf("%d counts left", n)
		}
	})
}
