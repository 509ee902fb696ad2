package bdi

import (
	"slices"
	"strings"
	"testing"
	"time"

	"flusherd/inode"
	"flusherd/lists"
)

// TestDirtyListClasses: an expire already in use shares its class and
// counts one more inode; unref releases one and never goes below zero or
// past the classes; a class no inode holds is reused; once 255 are held,
// a new expire shares the class with the nearest expire, above or below.
func TestDirtyListClasses(t *testing.T) {
	var d dirtyList
	a, exact := d.class(time.Second)
	if a != 0 || !exact {
		t.Fatalf("first class = %d, %v; want 0, true", a, exact)
	}
	if b, _ := d.class(time.Second); b != a || d.classes[a].refs != 2 {
		t.Fatalf("same expire: class %d with %d refs, want %d with 2", b, d.classes[a].refs, a)
	}
	d.unref(a)
	d.unref(a)
	d.unref(a) // one too many: stays at zero
	if r := d.classes[a].refs; r != 0 {
		t.Fatalf("refs after three unrefs of two = %d, want 0", r)
	}
	d.unref(uint8(len(d.classes))) // no such class: ignored
	// Unheld and empty: reused for a new expire.
	if c, exact := d.class(2 * time.Second); c != a || !exact || d.classes[a].expire != 2*time.Second {
		t.Fatalf("new expire took class %d (exact %v, expire %v), want %d reused", c, exact, d.classes[c].expire, a)
	}
	// Hold 255 classes: expires 2 s, 10 s, 20 s, ... 2540 s.
	for i := 1; i < 255; i++ {
		if c, exact := d.class(time.Duration(i*10) * time.Second); int(c) != i || !exact {
			t.Fatalf("expire %d0s: class %d (exact %v), want %d", i, c, exact, i)
		}
	}
	for _, tc := range []struct {
		expire time.Duration
		want   uint8
	}{
		{14 * time.Second, 1}, // nearer 10 s (below) than 20 s
		{16 * time.Second, 2}, // nearer 20 s (above) than 10 s
		{time.Second, 0},      // 2 s
		{time.Hour, 254},      // above them all: 2540 s
		{2538 * time.Second, 254},
		{2535 * time.Second, 253}, // a tie: the first found
	} {
		refs := d.classes[tc.want].refs
		c, exact := d.class(tc.expire)
		if c != tc.want || exact {
			t.Errorf("expire %v with every class held: class %d (expire %v, exact %v), want %d (expire %v), not exact",
				tc.expire, c, d.classes[c].expire, exact, tc.want, d.classes[tc.want].expire)
			continue
		}
		if d.classes[c].refs != refs+1 {
			t.Errorf("shared class %d has %d refs, want %d", c, d.classes[c].refs, refs+1)
		}
		if d.classes[c].expire != d.classes[tc.want].expire {
			t.Errorf("sharing changed class %d's expire", c)
		}
	}
	if n := len(d.classes); n != 255 {
		t.Errorf("%d classes, want 255", n)
	}
}

// TestMoveExpired: kupdate work (all false) moves the inodes expired at
// now, each class by its own expire, oldest dirtiedWhen first across
// classes; sync work (all true) moves every inode dirtied at or before
// its start, the one dirtied exactly then included, and none after.
func TestMoveExpired(t *testing.T) {
	s := time.Second
	build := func() (*dirtyList, map[*inode.Inode]string) {
		d := &dirtyList{}
		names := map[*inode.Inode]string{}
		for _, f := range []struct {
			name   string
			expire time.Duration
			when   time.Duration
		}{
			{"a1", s, 1 * s}, {"a2", s, 4 * s}, {"a3", s, 10 * s},
			{"b1", 5 * s, 2 * s}, {"b2", 5 * s, 3 * s}, {"b3", 5 * s, 6 * s},
		} {
			c, _ := d.class(f.expire)
			in := &inode.Inode{Class: c, DirtiedWhen: f.when}
			d.pushBack(in)
			names[in] = f.name
		}
		return d, names
	}
	for _, tc := range []struct {
		now  time.Duration
		all  bool
		want string
	}{
		// a expires after 1 s, b after 5 s.
		{5 * s, false, "a1 a2"},
		{8 * s, false, "a1 b1 b2 a2"},
		{10*s + s/2, false, "a1 b1 b2 a2"},
		{11 * s, false, "a1 b1 b2 a2 b3 a3"},
		{6 * s, true, "a1 b1 b2 a2 b3"},
		{10 * s, true, "a1 b1 b2 a2 b3 a3"},
		{0, true, ""},
	} {
		d, names := build()
		var dst lists.List[*inode.Inode]
		n := d.moveExpired(&dst, tc.now, tc.all)
		var got []string
		for in := dst.Front(); in != nil; in = dst.Next(in) {
			got = append(got, names[in])
		}
		if g := strings.Join(got, " "); g != tc.want || n != len(got) {
			t.Errorf("moveExpired(now %v, all %v) moved %d: %q, want %q", tc.now, tc.all, n, g, tc.want)
		}
		if d.len() != len(names)-len(got) {
			t.Errorf("now %v, all %v: %d left on b_dirty, want %d", tc.now, tc.all, d.len(), len(names)-len(got))
		}
	}
}

// TestDirtyListTies: a new expire reuses the first free class, not a later
// one; inodes of different classes dirtied at the same time move in class
// order.
func TestDirtyListTies(t *testing.T) {
	var d dirtyList
	for _, e := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second} {
		d.class(e)
	}
	d.unref(0)
	d.unref(2)
	if c, exact := d.class(9 * time.Second); c != 0 || !exact {
		t.Fatalf("two free classes, 0 and 2: took %d, want the first", c)
	}
	var e dirtyList
	names := map[*inode.Inode]string{}
	for _, f := range []struct {
		name   string
		expire time.Duration
	}{{"x", time.Second}, {"y", 2 * time.Second}, {"z", 3 * time.Second}} {
		c, _ := e.class(f.expire)
		in := &inode.Inode{Class: c, DirtiedWhen: 5 * time.Second}
		e.pushBack(in)
		names[in] = f.name
	}
	var dst lists.List[*inode.Inode]
	e.moveExpired(&dst, time.Minute, false)
	var got []string
	for in := dst.Front(); in != nil; in = dst.Next(in) {
		got = append(got, names[in])
	}
	if g := strings.Join(got, " "); g != "x y z" {
		t.Errorf("dirtied together: moved %q, want class order \"x y z\"", g)
	}
}

// TestMoveOldestAndInsertByAge: moveOldest takes the oldest inodes of any
// class, whatever their age, until their dirty pages reach the budget, an
// inode never looked at counting as the unknown pages; insertByAge puts an
// inode back at its place by dirtiedWhen, so that the next moveOldest
// takes it in age order.
func TestMoveOldestAndInsertByAge(t *testing.T) {
	s := time.Second
	d := &dirtyList{}
	names := map[*inode.Inode]string{}
	byName := map[string]*inode.Inode{}
	for _, f := range []struct {
		name   string
		expire time.Duration
		when   time.Duration
		pages  uint32
	}{
		{"a1", s, 1 * s, 10}, {"a2", s, 4 * s, 0}, {"a3", s, 10 * s, 10},
		{"b1", 5 * s, 2 * s, 10}, {"b2", 5 * s, 3 * s, 10},
	} {
		c, _ := d.class(f.expire)
		in := &inode.Inode{Class: c, DirtiedWhen: f.when, DirtyPages: f.pages}
		d.pushBack(in)
		names[in], byName[f.name] = f.name, in
	}
	moved := func(dst *lists.List[*inode.Inode]) string {
		var got []string
		for in := dst.Front(); in != nil; in = dst.Next(in) {
			got = append(got, names[in])
		}
		return strings.Join(got, " ")
	}
	for _, tc := range []struct {
		budget, unknown int64
		want            string
	}{
		{1, 100, "a1"},
		{10, 100, "a1"},
		{11, 100, "a1 b1"},
		{30, 100, "a1 b1 b2"},
		{31, 100, "a1 b1 b2 a2"},     // a2 unknown: counts 100
		{131, 100, "a1 b1 b2 a2 a3"}, // 10+10+10+100 = 130 < 131
		{1000, 100, "a1 b1 b2 a2 a3"},
	} {
		var dst lists.List[*inode.Inode]
		n := d.moveOldest(&dst, tc.budget, tc.unknown)
		if got := moved(&dst); got != tc.want || n != len(strings.Fields(got)) {
			t.Errorf("moveOldest(%d, unknown %d) moved %d: %q, want %q", tc.budget, tc.unknown, n, got, tc.want)
		}
		// Back by age, in another order: the next call sees the same
		// list.
		taken := strings.Fields(moved(&dst))
		for _, name := range []string{"b2", "a3", "a1", "a2", "b1"} {
			if slices.Contains(taken, name) {
				d.insertByAge(byName[name])
			}
		}
		if dst.Len() != 0 || d.len() != 5 {
			t.Fatalf("after putting back: %d left moved, %d on b_dirty; want 0 and 5", dst.Len(), d.len())
		}
	}
	var dst lists.List[*inode.Inode]
	d.moveExpired(&dst, time.Hour, true)
	if got := moved(&dst); got != "a1 b1 b2 a2 a3" {
		t.Errorf("after the inserts, b_dirty in age order is %q, want %q", got, "a1 b1 b2 a2 a3")
	}
}

// TestInsertByAgeEitherEnd: insertByAge keeps a class ordered by
// dirtiedWhen, after any inode dirtied at the same time, whichever end it
// looks from (the nearer one): near the oldest, near the newest, equal to
// one in the middle, older and newer than all.
func TestInsertByAgeEitherEnd(t *testing.T) {
	s := time.Second
	d := &dirtyList{}
	c, _ := d.class(time.Minute)
	for i := 1; i <= 10; i++ {
		in := &inode.Inode{Class: c, DirtiedWhen: time.Duration(i) * s}
		d.pushBack(in)
	}
	var added []*inode.Inode
	for _, w := range []time.Duration{9*s + s/2, s + s/2, 5 * s, 0, 11 * s, 10 * s} {
		in := &inode.Inode{Class: c, DirtiedWhen: w}
		added = append(added, in)
		d.insertByAge(in)
	}
	l := &d.classes[c].list
	var prev time.Duration = -1
	n := 0
	for x := l.Front(); x != nil; x = l.Next(x) {
		if x.DirtiedWhen < prev {
			t.Fatalf("class out of order: %v after %v", x.DirtiedWhen, prev)
		}
		prev = x.DirtiedWhen
		n++
	}
	if n != 16 {
		t.Errorf("%d inodes in the class, want 16", n)
	}
	// An inode dirtied at the same time as one already there goes after it.
	for _, in := range []*inode.Inode{added[2], added[5]} {
		if p := l.Prev(in); p == nil || p.DirtiedWhen != in.DirtiedWhen {
			t.Errorf("inode at %v not placed after the one dirtied at the same time", in.DirtiedWhen)
		}
	}
}
