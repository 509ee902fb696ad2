package inode

import (
	"hash/maphash"
	"math/bits"
)

// Table is a set of tracked inodes indexed by Key: what a
// map[Key]*Inode does, in less memory. It is an open-addressing hash table
// with linear probing: a slot holds an inode pointer (8 bytes) and a
// control byte (empty, deleted, or 7 bits of the key's hash, so that a
// probe compares keys only on a match). It holds at most 7/8 of its slots
// in use, and a rehash leaves it 7/12 full: 10.3 to 15.4 bytes per inode,
// with nothing in the inode itself (a chain link would cost 8 bytes in
// every Inode), against the 16 bytes of key and 8 of value that a Go map
// stores per slot at a load of 7/16 to 7/8 (a map[Key]*Inode measured 35
// bytes per entry at 100,000 entries, 56 at 1,000,000, with Go 1.26).
//
// A Delete leaves a deleted mark. When the inodes and marks fill 7/8 of
// the slots, or the inodes fewer than 1/8 of them, the next Set rehashes
// into new slots sized for the inodes held (so the table shrinks, unlike
// a Go map, once most of its inodes are gone). A rehash does
// not move every inode at once: each Set afterwards moves those of
// movePerSet old slots, so no single call walks a large table. The hash is
// hash/maphash's, with a random seed per table.
//
// An inode is in at most one Table at a time, and its Key must not change
// while it is in one. The zero Table is empty and ready to use. A Table is
// not safe for concurrent use (a bdi's list lock guards its own).
type Table struct {
	cur slots
	// old is the previous slots while a rehash moves their inodes into
	// cur (empty otherwise); old's slots below moved are moved. An inode
	// is in cur or in old, not both.
	old   slots
	moved int
	n     int // inodes held, in cur and old
	dead  int // deleted marks in cur
	seed  maphash.Seed
}

// slots is an array of slots: inode i is in[i] when ctrl[i] is a hash tag.
type slots struct {
	in   []*Inode
	ctrl []uint8
}

// Control bytes: a slot is empty, deleted, or full with its hash's tag
// (tagged).
const (
	ctrlEmpty   = 0
	ctrlDeleted = 1
	tagged      = 0x80
)

// movePerSet is how many old slots each Set moves while a rehash is under
// way: the old slots are let go after 1/16 as many Sets as they number
// (and a rehash finishes any left of the previous one first). A rehash
// leaves cur 7/12 full and the next comes when 7/8 of it is used: after
// at least half as many Sets as the inodes held, which are 7/8 of the old
// slots, so one is always done before the next.
const movePerSet = 16

func (t *Table) hash(k Key) uint64 { return maphash.Comparable(t.seed, k) }

// tag is a full slot's control byte for hash h: its low 7 bits (the slot
// index comes from its high bits).
func tag(h uint64) uint8 { return tagged | uint8(h&0x7f) }

// home is hash h's first slot in s.
func (s *slots) home(h uint64) int {
	hi, _ := bits.Mul64(h, uint64(len(s.in)))
	return int(hi)
}

// find returns the slot of s that holds key k (hash h), or -1.
func (s *slots) find(h uint64, k Key) int {
	if len(s.in) == 0 {
		return -1
	}
	tg := tag(h)
	for i := s.home(h); ; {
		switch c := s.ctrl[i]; {
		case c == ctrlEmpty:
			return -1
		case c == tg && s.in[i].is(k):
			return i
		}
		if i++; i == len(s.in) {
			i = 0
		}
	}
}

// put stores in (hash h, not in s) in the first free slot of its probe,
// and reports whether that slot held a deleted mark.
func (s *slots) put(h uint64, in *Inode) (reused bool) {
	for i := s.home(h); ; {
		if c := s.ctrl[i]; c < tagged {
			s.in[i], s.ctrl[i] = in, tag(h)
			return c == ctrlDeleted
		}
		if i++; i == len(s.in) {
			i = 0
		}
	}
}

// Len returns the number of inodes in the table.
func (t *Table) Len() int { return t.n }

// Get returns the inode whose Key is k, or nil.
func (t *Table) Get(k Key) *Inode {
	if t.n == 0 {
		return nil
	}
	h := t.hash(k)
	if i := t.cur.find(h, k); i >= 0 {
		return t.cur.in[i]
	}
	if i := t.old.find(h, k); i >= 0 {
		return t.old.in[i]
	}
	return nil
}

// Set adds in, indexed by in.Key(), replacing the inode of the same Key if
// the table has one (as m[in.Key()] = in). in must not be in a table
// already (unless it is the one replaced).
func (t *Table) Set(in *Inode) {
	if t.cur.in == nil {
		t.seed = maphash.MakeSeed()
	}
	if full, sparse := (t.n+t.dead+1)*8 > len(t.cur.in)*7, len(t.cur.in) > 64 && t.n*8 < len(t.cur.in); full || sparse {
		t.rehash() // (one more than needed if in replaces one)
	} else if t.old.in != nil {
		t.move(movePerSet)
	}
	k := in.Key()
	h := t.hash(k)
	if i := t.old.find(h, k); i >= 0 {
		t.old.in[i], t.old.ctrl[i] = nil, ctrlDeleted
		t.n--
	}
	if i := t.cur.find(h, k); i >= 0 {
		t.cur.in[i] = in
		return
	}
	if t.cur.put(h, in) {
		t.dead--
	}
	t.n++
}

// Delete removes the inode whose Key is k, if any (as delete(m, k)).
func (t *Table) Delete(k Key) {
	if t.n == 0 {
		return
	}
	h := t.hash(k)
	if i := t.cur.find(h, k); i >= 0 {
		t.cur.in[i], t.cur.ctrl[i] = nil, ctrlDeleted
		t.n--
		t.dead++
		return
	}
	if i := t.old.find(h, k); i >= 0 {
		t.old.in[i], t.old.ctrl[i] = nil, ctrlDeleted
		t.n--
	}
}

// All calls yield for every inode, in no particular order, until yield
// returns false. yield may Delete the inode it is given, but not another,
// and must not Set. All first finishes a rehash under way.
func (t *Table) All(yield func(*Inode) bool) {
	if t.n == 0 {
		return
	}
	t.move(len(t.old.in))
	for i, c := range t.cur.ctrl {
		if c >= tagged && !yield(t.cur.in[i]) {
			return
		}
	}
}

// rehash starts moving the inodes into new slots, 12/7 as many as the
// inodes held (at least 8), over the next Sets.
func (t *Table) rehash() {
	t.move(len(t.old.in)) // (a rehash under way is finished first)
	n := max(8, (t.n+1)*12/7+1)
	t.old, t.moved, t.dead = t.cur, 0, 0
	t.cur = slots{in: make([]*Inode, n), ctrl: make([]uint8, n)}
}

// move moves the inodes of up to n old slots into cur.
func (t *Table) move(n int) {
	for ; n > 0 && t.old.in != nil; n-- {
		i := t.moved
		if t.old.ctrl[i] >= tagged {
			in := t.old.in[i]
			t.old.in[i], t.old.ctrl[i] = nil, ctrlDeleted
			if t.cur.put(t.hash(in.Key()), in) {
				t.dead--
			}
		}
		t.moved++
		if t.moved == len(t.old.in) {
			t.old, t.moved = slots{}, 0
		}
	}
}
