package lists

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

type node struct {
	Entry[*node]
	v int
}

func (n *node) Link() *Entry[*node] { return &n.Entry }

func vals(l *List[*node]) []int {
	out := []int{}
	for n := range l.All {
		out = append(out, n.v)
	}
	// Walk backwards too, so a broken prev pointer is caught.
	back := []int{}
	for n := l.Back(); n != nil; n = l.Prev(n) {
		back = append([]int{n.v}, back...)
	}
	if !cmp.Equal(out, back) {
		panic("forward and backward walks differ")
	}
	return out
}

func nodes(n int) []*node {
	out := make([]*node, n)
	for i := range out {
		out[i] = &node{v: i}
	}
	return out
}

func TestZeroValue(t *testing.T) {
	var l List[*node]
	if !l.Empty() || l.Len() != 0 || l.Front() != nil || l.Back() != nil {
		t.Fatalf("zero list not empty")
	}
	var other List[*node]
	l.SpliceBackInit(&other) // splicing empties must be a no-op
	if !l.Empty() {
		t.Fatal("splice of empty made l non-empty")
	}
}

func TestOps(t *testing.T) {
	ns := nodes(6)
	tests := []struct {
		name string
		do   func(a, b *List[*node])
		a, b []int
	}{
		{"pushback", func(a, b *List[*node]) { a.PushBack(ns[0]); a.PushBack(ns[1]) }, []int{0, 1}, []int{}},
		{"pushfront", func(a, b *List[*node]) { a.PushFront(ns[0]); a.PushFront(ns[1]) }, []int{1, 0}, []int{}},
		{"move to other list tail", func(a, b *List[*node]) {
			a.PushBack(ns[0])
			a.PushBack(ns[1])
			b.PushBack(ns[2])
			b.MoveToBack(ns[0])
		}, []int{1}, []int{2, 0}},
		{"move within list", func(a, b *List[*node]) {
			a.PushBack(ns[0])
			a.PushBack(ns[1])
			a.PushBack(ns[2])
			a.MoveToBack(ns[0])
			a.MoveToFront(ns[2])
		}, []int{2, 1, 0}, []int{}},
		{"remove middle", func(a, b *List[*node]) {
			a.PushBack(ns[0])
			a.PushBack(ns[1])
			a.PushBack(ns[2])
			Remove(ns[1])
		}, []int{0, 2}, []int{}},
		{"insert before", func(a, b *List[*node]) {
			a.PushBack(ns[0])
			a.PushBack(ns[2])
			a.InsertBefore(ns[1], ns[2])
		}, []int{0, 1, 2}, []int{}},
		{"splice back", func(a, b *List[*node]) {
			a.PushBack(ns[0])
			b.PushBack(ns[1])
			b.PushBack(ns[2])
			a.SpliceBackInit(b)
		}, []int{0, 1, 2}, []int{}},
		{"splice front", func(a, b *List[*node]) {
			a.PushBack(ns[0])
			b.PushBack(ns[1])
			b.PushBack(ns[2])
			a.SpliceFrontInit(b)
		}, []int{1, 2, 0}, []int{}},
		{"splice into empty then reuse source", func(a, b *List[*node]) {
			b.PushBack(ns[1])
			a.SpliceBackInit(b)
			b.PushBack(ns[3])
		}, []int{1}, []int{3}},
		{"remove while walking", func(a, b *List[*node]) {
			for _, n := range ns[:4] {
				a.PushBack(n)
			}
			for n := range a.All {
				if n.v%2 == 0 {
					b.MoveToBack(n)
				}
			}
		}, []int{1, 3}, []int{0, 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, n := range ns {
				n.Entry = Entry[*node]{}
			}
			var a, b List[*node]
			tc.do(&a, &b)
			if d := cmp.Diff(tc.a, vals(&a)); d != "" {
				t.Errorf("a (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.b, vals(&b)); d != "" {
				t.Errorf("b (-want +got):\n%s", d)
			}
			if a.Len() != len(tc.a) || b.Len() != len(tc.b) {
				t.Errorf("Len = %d,%d want %d,%d", a.Len(), b.Len(), len(tc.a), len(tc.b))
			}
		})
	}
}

func mustPanic(t *testing.T, name string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s: no panic", name)
		}
	}()
	f()
}

func TestMisuseIsCaught(t *testing.T) {
	ns := nodes(2)
	var a, b List[*node]
	a.PushBack(ns[0])
	mustPanic(t, "second PushBack on another list", func() { b.PushBack(ns[0]) })
	mustPanic(t, "second PushFront on same list", func() { a.PushFront(ns[0]) })
	mustPanic(t, "Remove of unlinked", func() { Remove(ns[1]) })
	mustPanic(t, "InsertBefore unlinked mark", func() { a.InsertBefore(ns[1], ns[1]) })
	if d := cmp.Diff([]int{0}, vals(&a)); d != "" || !b.Empty() {
		t.Errorf("misuse changed the lists: %s", d)
	}
}

// late is an element whose Entry is not its first field: the list finds
// an element at its Entry's address, so adding one must panic.
type late struct {
	v int
	Entry[*late]
}

func (n *late) Link() *Entry[*late] { return &n.Entry }

func TestEntryNotFirstIsCaught(t *testing.T) {
	var l List[*late]
	x := &late{v: 1}
	mustPanic(t, "PushBack of an element whose Entry is not its first field", func() { l.PushBack(x) })
	if !l.Empty() || x.Link().Linked() {
		t.Errorf("the refused element was linked")
	}
}

func BenchmarkMoveAndSplice(b *testing.B) {
	ns := nodes(1024)
	var x, y List[*node]
	for _, n := range ns {
		x.PushBack(n)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		y.MoveToBack(ns[i%len(ns)])
		if i%len(ns) == len(ns)-1 {
			x.SpliceBackInit(&y)
		}
	}
}
