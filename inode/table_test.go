package inode

import (
	"math/rand/v2"
	"testing"
)

// checkTable compares tb with want, the inodes it should hold.
func checkTable(t *testing.T, tb *Table, want map[Key]*Inode) {
	t.Helper()
	if tb.Len() != len(want) {
		t.Fatalf("Len %d, want %d", tb.Len(), len(want))
	}
	for k, in := range want {
		if got := tb.Get(k); got != in {
			t.Fatalf("Get(%v) = %p, want %p", k, got, in)
		}
	}
	seen := map[*Inode]bool{}
	for in := range tb.All {
		if seen[in] || want[in.Key] != in {
			t.Fatalf("All gave %v twice or unknown", in.Key)
		}
		seen[in] = true
	}
	if len(seen) != len(want) {
		t.Fatalf("All gave %d inodes, want %d", len(seen), len(want))
	}
}

// TestTable runs random Sets, replacements, Deletes and Gets against a
// map, checking everything at points inside growths as well as between
// them.
func TestTable(t *testing.T) {
	var tb Table
	if tb.Get(Key{1, 1}) != nil || tb.Len() != 0 {
		t.Fatal("zero Table not empty")
	}
	tb.Delete(Key{1, 1})
	for range tb.All {
		t.Fatal("zero Table yields")
	}
	want := map[Key]*Inode{}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		k := Key{Dev: uint64(r.IntN(3)), Ino: uint64(r.IntN(5000))}
		switch op := r.IntN(10); {
		case op < 6:
			in := &Inode{Key: k}
			tb.Set(in)
			want[k] = in
		case op < 8:
			tb.Delete(k)
			delete(want, k)
		default:
			if got := tb.Get(k); got != want[k] {
				t.Fatalf("op %d: Get(%v) = %p, want %p", i, k, got, want[k])
			}
		}
		if i%997 == 0 || (tb.old != nil && (tb.moved <= movePerSet || tb.moved == len(tb.old)/2)) {
			checkTable(t, &tb, want)
		}
	}
	checkTable(t, &tb, want)
	// An inode set again replaces itself.
	for _, in := range want {
		tb.Set(in)
		break
	}
	checkTable(t, &tb, want)
}

// TestTableDeleteDuringAll: yield may delete the inode it is given, in the
// middle of a growth too; the others are all still given.
func TestTableDeleteDuringAll(t *testing.T) {
	var tb Table
	want := map[Key]*Inode{}
	for i := range 1000 {
		in := &Inode{Key: Key{Dev: 1, Ino: uint64(i)}}
		tb.Set(in)
		want[in.Key] = in
		if tb.old != nil && tb.moved > 0 && i > 600 {
			break // a growth under way
		}
	}
	if tb.old == nil {
		t.Fatal("no growth under way")
	}
	total, n := tb.Len(), 0
	for in := range tb.All {
		if in.Key.Ino%2 == 0 {
			tb.Delete(in.Key)
			delete(want, in.Key)
		}
		n++
	}
	if n != total {
		t.Fatalf("All gave %d inodes, want %d", n, total)
	}
	checkTable(t, &tb, want)
}

// TestTableGetAllocs: a lookup allocates nothing.
func TestTableGetAllocs(t *testing.T) {
	var tb Table
	tb.Set(&Inode{Key: Key{1, 2}})
	if n := testing.AllocsPerRun(100, func() { _ = tb.Get(Key{1, 2}) }); n != 0 {
		t.Errorf("Get: %v allocations, want 0", n)
	}
}
