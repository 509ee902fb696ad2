package inode

import "hash/maphash"

// Table is a set of tracked inodes indexed by Key: what a
// map[Key]*Inode does, in less memory. It is a chained hash table whose
// chains run through the inodes themselves (Inode's hnext field), so it
// costs one 8-byte pointer per bucket; as it fills, it has between one and
// two buckets per inode: 8 to 16 bytes per inode, against the 16 bytes of
// key and 8 of value that a Go map stores per slot at a load of 7/16 to
// 7/8 (a map[Key]*Inode measured 35 bytes per entry at 100,000 entries, 56
// at 1,000,000, with Go 1.26).
//
// It grows, doubling its buckets (a power of two, 8 at first), when it
// would hold more inodes than buckets, and never shrinks (as a Go map does
// not). A growth does not move every chain at once: each Set afterwards
// moves two of the old buckets' chains, so no single call walks a large
// table. The hash is hash/maphash's, with a random seed per table.
//
// An inode is in at most one Table at a time, and its Key must not change
// while it is in one. The zero Table is empty and
// ready to use. A Table is not safe for concurrent use (a bdi's list lock
// guards its own).
type Table struct {
	// buckets holds the chains; its length is 0 or a power of two.
	buckets []*Inode
	// old is the previous buckets while a growth moves their chains
	// into buckets (nil otherwise); old[:moved] are moved (nil).
	old   []*Inode
	moved int
	n     int // inodes held
	seed  maphash.Seed
}

// movePerSet is how many old buckets each Set moves while a growth is under
// way. After a growth there are at least len(old) Sets before the next
// (the table then holds about len(old) inodes, and grows past
// 2*len(old)), so one would do; two finish it sooner (and a growth
// finishes any left of the previous one first).
const movePerSet = 2

func (t *Table) hash(k Key) uint64 { return maphash.Comparable(t.seed, k) }

// slot returns the bucket that holds key k's chain (its hash h).
func (t *Table) slot(h uint64) **Inode {
	if t.old != nil {
		if i := int(h & uint64(len(t.old)-1)); i >= t.moved {
			return &t.old[i]
		}
	}
	return &t.buckets[h&uint64(len(t.buckets)-1)]
}

// Len returns the number of inodes in the table.
func (t *Table) Len() int { return t.n }

// Get returns the inode whose Key is k, or nil.
func (t *Table) Get(k Key) *Inode {
	if t.n == 0 {
		return nil
	}
	for in := *t.slot(t.hash(k)); in != nil; in = in.hnext {
		if in.Key == k {
			return in
		}
	}
	return nil
}

// Set adds in, indexed by in.Key, replacing the inode of the same Key if
// the table has one (as m[in.Key] = in). in must not be in a table
// already (unless it is the one replaced).
func (t *Table) Set(in *Inode) {
	if t.buckets == nil {
		t.seed = maphash.MakeSeed()
		t.buckets = make([]*Inode, 8)
	}
	if t.n >= len(t.buckets) {
		t.grow() // (one more than needed if in replaces one)
	} else if t.old != nil {
		t.move(movePerSet)
	}
	p := t.slot(t.hash(in.Key))
	for q := p; *q != nil; q = &(*q).hnext {
		if old := *q; old.Key == in.Key {
			*q = old.hnext
			old.hnext = nil
			t.n--
			break
		}
	}
	in.hnext = *p
	*p = in
	t.n++
}

// Delete removes the inode whose Key is k, if any (as delete(m, k)).
func (t *Table) Delete(k Key) {
	if t.n == 0 {
		return
	}
	for p := t.slot(t.hash(k)); *p != nil; p = &(*p).hnext {
		if in := *p; in.Key == k {
			*p = in.hnext
			in.hnext = nil
			t.n--
			return
		}
	}
}

// All calls yield for every inode, in no particular order, until yield
// returns false. yield may Delete the inode it is given, but not another,
// and must not Set. All first finishes a growth under way.
func (t *Table) All(yield func(*Inode) bool) {
	if t.n == 0 {
		return
	}
	t.move(len(t.old))
	for _, in := range t.buckets {
		for in != nil {
			next := in.hnext
			if !yield(in) {
				return
			}
			in = next
		}
	}
}

// grow doubles the buckets; the chains move over the next Sets.
func (t *Table) grow() {
	t.move(len(t.old)) // (a growth under way is finished first)
	t.old, t.moved = t.buckets, 0
	t.buckets = make([]*Inode, 2*len(t.old))
}

// move moves up to n of the old buckets' chains into buckets.
func (t *Table) move(n int) {
	for ; n > 0 && t.old != nil; n-- {
		in := t.old[t.moved]
		t.old[t.moved] = nil
		t.moved++
		mask := uint64(len(t.buckets) - 1)
		for in != nil {
			next := in.hnext
			p := &t.buckets[t.hash(in.Key)&mask]
			in.hnext = *p
			*p = in
			in = next
		}
		if t.moved == len(t.old) {
			t.old, t.moved = nil, 0
		}
	}
}
