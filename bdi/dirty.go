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
}

// class returns the index of the class for expire, adding it if new.
func (d *dirtyList) class(expire time.Duration) uint8 {
	for i := range d.classes {
		if d.classes[i].expire == expire {
			return uint8(i)
		}
	}
	if len(d.classes) == 255 {
		panic("bdi: more than 255 distinct expire intervals")
	}
	d.classes = append(d.classes, &dirtyClass{expire: expire})
	return uint8(len(d.classes) - 1)
}

// pushBack adds in at the tail of its class (in.Class, from class).
// in.DirtiedWhen must not be older than the tail's (it is "now" for every
// caller).
func (d *dirtyList) pushBack(in *inode.Inode) {
	d.classes[in.Class].list.PushBack(in)
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
	moved := 0
	for {
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
}
