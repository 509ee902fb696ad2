package bdi

import (
	"time"

	"flusherd/inode"
	"flusherd/lists"
	"flusherd/policy"
)

// dirtyList is a bdi's b_dirty. Trees may set their own expire interval, so
// inodes on one device expire at different ages; b_dirty is kept as one FIFO
// per distinct interval. An inode enters its class's FIFO with dirtiedWhen =
// now, so each FIFO is ordered by dirtiedWhen and therefore by due time, and
// moveExpired only looks at FIFO heads: it never scans inodes that are not
// due. Classes are few (one per distinct expire in the config).
type dirtyList struct {
	classes []*dirtyClass
}

type dirtyClass struct {
	expire time.Duration
	list   lists.List[*inode.Inode]
	refs   int // tracked inodes of this class, on any list
}

// class returns the index of the class for expire and counts one more
// inode in it (release it with unref). A new expire takes a class no
// tracked inode uses any more, or a new one; once all 255 are in use by
// tracked inodes (expire values changed by reloads, each still holding
// files), the class with the nearest expire is shared, and exact reports
// false.
func (d *dirtyList) class(expire time.Duration) (c uint8, exact bool) {
	free := -1
	for i := range d.classes {
		if d.classes[i].expire == expire {
			d.classes[i].refs++
			return uint8(i), true
		}
		if free < 0 && d.classes[i].refs == 0 && d.classes[i].list.Empty() {
			free = i
		}
	}
	switch {
	case free >= 0:
		d.classes[free].expire = expire
	case len(d.classes) < 255:
		d.classes = append(d.classes, &dirtyClass{expire: expire})
		free = len(d.classes) - 1
	default:
		best := 0
		for i := range d.classes {
			if absDur(d.classes[i].expire-expire) < absDur(d.classes[best].expire-expire) {
				best = i
			}
		}
		d.classes[best].refs++
		return uint8(best), false
	}
	d.classes[free].refs++
	return uint8(free), true
}

// unref releases an inode's hold on class c.
func (d *dirtyList) unref(c uint8) {
	if int(c) < len(d.classes) && d.classes[c].refs > 0 {
		d.classes[c].refs--
	}
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// pushBack adds in at the tail of its class (in.Class, from class).
// in.DirtiedWhen must not be older than the tail's (it is "now" for every
// caller).
func (d *dirtyList) pushBack(in *inode.Inode) {
	d.classes[in.Class].list.PushBack(in)
}

// insertByAge moves in, from whatever list it is on, into its class at the
// place its dirtiedWhen gives it (after every inode dirtied at or before
// it), keeping the class ordered. It walks the class from the end whose
// dirtiedWhen is nearer to its own: the head for inodes taken
// oldest-first (b_more_io after background work), the tail for a file
// the sweep found, dirtied a little before the newest.
func (d *dirtyList) insertByAge(in *inode.Inode) {
	l := &d.classes[in.Class].list
	if in.Link().Linked() {
		lists.Remove(in)
	}
	front, back := l.Front(), l.Back()
	if front != nil && in.DirtiedWhen-front.DirtiedWhen > back.DirtiedWhen-in.DirtiedWhen {
		// Nearer the newest end (a file the sweep found, dirtied a
		// little before the newest): looked for from there.
		for x := back; x != nil; x = l.Prev(x) {
			if x.DirtiedWhen <= in.DirtiedWhen {
				if next := l.Next(x); next != nil {
					l.InsertBefore(in, next)
				} else {
					l.PushBack(in)
				}
				return
			}
		}
		l.PushFront(in)
		return
	}
	for x := front; x != nil; x = l.Next(x) {
		if x.DirtiedWhen > in.DirtiedWhen {
			l.InsertBefore(in, x)
			return
		}
	}
	l.PushBack(in)
}

// lastDue is when (daemon clock) the newest inode on b_dirty expires:
// the latest dirtiedWhen + expire over the classes; 0 when b_dirty is
// empty.
func (d *dirtyList) lastDue() time.Duration {
	var last time.Duration
	for _, c := range d.classes {
		if !c.list.Empty() {
			last = max(last, c.list.Back().DirtiedWhen+c.expire)
		}
	}
	return last
}

func (d *dirtyList) empty() bool {
	for i := range d.classes {
		if !d.classes[i].list.Empty() {
			return false
		}
	}
	return true
}

func (d *dirtyList) len() int {
	n := 0
	for i := range d.classes {
		n += d.classes[i].list.Len()
	}
	return n
}

// moveExpired moves inodes from b_dirty to the tail of dst, oldest
// dirtiedWhen first, as fs/fs-writeback.c move_expired_inodes() does: when
// all is false those expired at now, else every inode dirtied at or before
// now (sync work passes its start, so that inodes dirtied during it cannot
// livelock it). It returns the number moved.
func (d *dirtyList) moveExpired(dst *lists.List[*inode.Inode], now time.Duration, all bool) int {
	return d.moveExpiredLimit(dst, now, all, -1)
}

// moveExpiredN is moveExpired of at most n expired inodes (a probing
// device's one).
func (d *dirtyList) moveExpiredN(dst *lists.List[*inode.Inode], now time.Duration, n int) int {
	return d.moveExpiredLimit(dst, now, false, n)
}

// moveExpiredLimit is moveExpired stopping after limit inodes (-1: none).
func (d *dirtyList) moveExpiredLimit(dst *lists.List[*inode.Inode], now time.Duration, all bool, limit int) int {
	moved := 0
	for moved != limit {
		best := -1
		var bestWhen time.Duration
		for i := range d.classes {
			in := d.classes[i].list.Front()
			if in == nil || (!all && !policy.Expired(now, in.DirtiedWhen, d.classes[i].expire)) || (all && in.DirtiedWhen > now) {
				continue
			}
			if best < 0 || in.DirtiedWhen < bestWhen {
				best, bestWhen = i, in.DirtiedWhen
			}
		}
		if best < 0 {
			return moved
		}
		dst.MoveToBack(d.classes[best].list.Front())
		moved++
	}
	return moved
}

// moveOldest moves inodes from b_dirty to the tail of dst, oldest
// dirtiedWhen first, whatever their age, until their dirty pages as last
// seen reach budget: background work's share of b_dirty (it takes what
// brings the device under its threshold, and leaves the rest where kupdate
// finds it). An inode not looked at since it was dirtied (no count yet)
// counts as unknown pages, what one attempt may write of it. Each is
// flagged inode.Background. It returns the number moved.
func (d *dirtyList) moveOldest(dst *lists.List[*inode.Inode], budget, unknown int64) int {
	moved := 0
	for budget > 0 {
		best := -1
		var bestWhen time.Duration
		for i := range d.classes {
			in := d.classes[i].list.Front()
			if in != nil && (best < 0 || in.DirtiedWhen < bestWhen) {
				best, bestWhen = i, in.DirtiedWhen
			}
		}
		if best < 0 {
			return moved
		}
		in := d.classes[best].list.Front()
		pages := int64(in.DirtyPages)
		if pages == 0 && in.WritebackPages == 0 {
			pages = unknown
		}
		budget -= max(1, pages)
		// Taken before it expired: if the work ends before its
		// attempt (its pages used up on the files before it),
		// kupdate finds it on b_io and puts it back.
		in.State |= inode.Background
		dst.MoveToBack(in)
		moved++
	}
	return moved
}
