// Package lists is an intrusive, circular, doubly linked list modelled on the
// kernel's struct list_head (include/linux/list.h) and gVisor's pkg/ilist.
//
// An element embeds an Entry as its first field and is linked by the address
// of that Entry, so a move between lists allocates nothing and costs O(1):
// list_move_tail is MoveToBack, list_move is MoveToFront, list_splice_init is
// SpliceBackInit. As list_entry (container_of) does, the element is found from
// its Entry's address, which is the element's own: an Entry costs two
// pointers and nothing else.
//
// As in the kernel, an entry does not record which list it is on and a list
// keeps no length: that is what makes a splice O(1). Len walks the list and is
// meant for statistics (bdi_debug_stats_show counts the same way). An entry is
// on at most one list: pushing an entry that is already linked, or removing
// one that is not, panics, since either is a programming error that would
// otherwise corrupt two lists at once.
//
// The zero value of List is an empty list. Lists are not safe for concurrent
// use; the owner (a bdi's writeback goroutine, under its list lock) serialises
// access.
package lists

import "unsafe"

// Linker is implemented by the element type: a pointer to a struct whose
// first field is an Entry, which Link returns. Adding an element whose Entry
// is elsewhere panics.
type Linker[T any] interface {
	comparable
	Link() *Entry[T]
}

// Entry is embedded in an element, as its first field. Its zero value is
// "not on any list".
type Entry[T any] struct {
	next, prev *Entry[T]
}

// elem returns the element whose Entry is e (list_entry): the pointer to
// the element has e's address, since the Entry is its first field (checked
// as each element is added, by checkNew). e must not be a list's root.
func elem[T any](e *Entry[T]) T {
	return *(*T)(unsafe.Pointer(&e))
}

// Linked reports whether the entry is on a list.
func (e *Entry[T]) Linked() bool { return e.next != nil }

// List is a circular list with a sentinel, like struct list_head. A List must
// not be copied after first use: its sentinel's address is part of the ring.
type List[T Linker[T]] struct {
	root Entry[T]
}

func (l *List[T]) lazyInit() {
	if l.root.next == nil {
		l.root.next = &l.root
		l.root.prev = &l.root
	}
}

// Empty reports whether the list has no elements, in O(1) (list_empty).
func (l *List[T]) Empty() bool { return l.root.next == nil || l.root.next == &l.root }

// Len counts the elements in O(n).
func (l *List[T]) Len() int {
	n := 0
	for e := l.root.next; e != nil && e != &l.root; e = e.next {
		n++
	}
	return n
}

// Front returns the first element, or the zero T if the list is empty.
func (l *List[T]) Front() T {
	var zero T
	if l.Empty() {
		return zero
	}
	return elem(l.root.next)
}

// Back returns the last element, or the zero T if the list is empty.
func (l *List[T]) Back() T {
	var zero T
	if l.Empty() {
		return zero
	}
	return elem(l.root.prev)
}

// Next returns the element after x on its list, or the zero T when x is the
// last one. x must be on l.
func (l *List[T]) Next(x T) T {
	var zero T
	e := x.Link()
	if e.next == &l.root {
		return zero
	}
	return elem(e.next)
}

// Prev returns the element before x on its list, or the zero T when x is the
// first one. x must be on l.
func (l *List[T]) Prev(x T) T {
	var zero T
	e := x.Link()
	if e.prev == &l.root {
		return zero
	}
	return elem(e.prev)
}

func insert[T any](e, prev, next *Entry[T]) {
	next.prev = e
	e.next = next
	e.prev = prev
	prev.next = e
}

func (l *List[T]) checkNew(x T) *Entry[T] {
	e := x.Link()
	if e.next != nil {
		panic("lists: element is already on a list")
	}
	if unsafe.Sizeof(x) != unsafe.Sizeof(e) || *(*unsafe.Pointer)(unsafe.Pointer(&x)) != unsafe.Pointer(e) {
		panic("lists: the element's Entry is not its first field")
	}
	l.lazyInit()
	return e
}

// PushBack adds x, which must not be on any list, at the tail (list_add_tail).
func (l *List[T]) PushBack(x T) {
	e := l.checkNew(x)
	insert(e, l.root.prev, &l.root)
}

// PushFront adds x, which must not be on any list, at the head (list_add).
func (l *List[T]) PushFront(x T) {
	e := l.checkNew(x)
	insert(e, &l.root, l.root.next)
}

// InsertBefore adds x, which must not be on any list, before mark, which must
// be on l.
func (l *List[T]) InsertBefore(x, mark T) {
	m := mark.Link()
	if m.next == nil {
		panic("lists: mark is not on a list")
	}
	e := l.checkNew(x)
	insert(e, m.prev, m)
}

// Remove unlinks x from whatever list it is on (list_del_init). It panics if
// x is not on a list.
func Remove[T Linker[T]](x T) {
	e := x.Link()
	if e.next == nil {
		panic("lists: element is not on a list")
	}
	e.prev.next = e.next
	e.next.prev = e.prev
	e.next, e.prev = nil, nil
}

// MoveToBack moves x from whatever list it is on, or from none, to the tail
// of l (list_move_tail).
func (l *List[T]) MoveToBack(x T) {
	if x.Link().Linked() {
		Remove(x)
	}
	l.PushBack(x)
}

// MoveToFront moves x from whatever list it is on, or from none, to the head
// of l (list_move).
func (l *List[T]) MoveToFront(x T) {
	if x.Link().Linked() {
		Remove(x)
	}
	l.PushFront(x)
}

// SpliceBackInit moves every element of src to the tail of l, in order, and
// leaves src empty (list_splice_tail_init). It is O(1).
func (l *List[T]) SpliceBackInit(src *List[T]) {
	if src == l || src.Empty() {
		return
	}
	l.lazyInit()
	first, last := src.root.next, src.root.prev
	at := l.root.prev
	at.next = first
	first.prev = at
	last.next = &l.root
	l.root.prev = last
	src.root.next = &src.root
	src.root.prev = &src.root
}

// SpliceFrontInit moves every element of src to the head of l, in order, and
// leaves src empty (list_splice_init). It is O(1).
func (l *List[T]) SpliceFrontInit(src *List[T]) {
	if src == l || src.Empty() {
		return
	}
	l.lazyInit()
	first, last := src.root.next, src.root.prev
	at := l.root.next
	l.root.next = first
	first.prev = &l.root
	last.next = at
	at.prev = last
	src.root.next = &src.root
	src.root.prev = &src.root
}

// All calls yield for each element from head to tail until yield returns
// false. yield may remove the element it is given (the walk has already
// read the next one, like list_for_each_entry_safe) but no other.
func (l *List[T]) All(yield func(T) bool) {
	if l.Empty() {
		return
	}
	for e := l.root.next; e != &l.root; {
		next := e.next
		if !yield(elem(e)) {
			return
		}
		e = next
	}
}
