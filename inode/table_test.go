package inode

import (
	"math/rand/v2"
	"strconv"
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
		if seen[in] || want[in.Key()] != in {
			t.Fatalf("All gave %v twice or unknown", in.Key())
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
			in := New(k)
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
		if i%997 == 0 || (tb.old.in != nil && (tb.moved <= movePerSet || tb.moved == len(tb.old.in)/2)) {
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
		in := New(Key{Dev: 1, Ino: uint64(i)})
		tb.Set(in)
		want[in.Key()] = in
		if tb.old.in != nil && tb.moved > 0 && i > 600 {
			break // a rehash under way
		}
	}
	if tb.old.in == nil {
		t.Fatal("no rehash under way")
	}
	total, n := tb.Len(), 0
	for in := range tb.All {
		if in.Key().Ino%2 == 0 {
			tb.Delete(in.Key())
			delete(want, in.Key())
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
	tb.Set(New(Key{1, 2}))
	if n := testing.AllocsPerRun(100, func() { _ = tb.Get(Key{1, 2}) }); n != 0 {
		t.Errorf("Get: %v allocations, want 0", n)
	}
}

// TestTableSize: the slots stay between 8/7 and 12/7 per inode (plus the
// rehash under way) as the table fills, and shrink once most inodes are
// deleted.
func TestTableSize(t *testing.T) {
	var tb Table
	const n = 100_000
	for i := range n {
		tb.Set(New(Key{Dev: 1, Ino: uint64(i)}))
		if used := tb.n + tb.dead; used*8 > len(tb.cur.in)*7 {
			t.Fatalf("%d inodes, %d deleted marks in %d slots: over 7/8", tb.n, tb.dead, len(tb.cur.in))
		}
	}
	tb.move(len(tb.old.in))
	if per := float64(len(tb.cur.in)) / n; per < 8.0/7 || per > 12.0/7+0.01 {
		t.Errorf("%d slots for %d inodes: %.2f per inode", len(tb.cur.in), n, per)
	}
	for i := range n - 100 {
		tb.Delete(Key{Dev: 1, Ino: uint64(i)})
	}
	// Sets of new inodes reuse the deleted marks or rehash into fewer
	// slots: what the table holds, not what it held, sets its size.
	for i := range 20_000 {
		k := Key{Dev: 2, Ino: uint64(i % 100)}
		tb.Set(New(k))
		tb.Delete(k)
	}
	tb.move(len(tb.old.in))
	if len(tb.cur.in) > 1000 || tb.Len() != 100 {
		t.Errorf("after deletes: %d slots for %d inodes", len(tb.cur.in), tb.Len())
	}
	for i := n - 100; i < n; i++ {
		if tb.Get(Key{Dev: 1, Ino: uint64(i)}) == nil {
			t.Fatalf("inode %d lost", i)
		}
	}
}

// BenchmarkTableGet looks up random keys of a table of 1,000,000 inodes
// spread over 1,000 directories: hits, and misses (a new file's first
// report).
func BenchmarkTableGet(b *testing.B) {
	const n = 1_000_000
	var tb Table
	for i := range n {
		in := New(Key{Dev: 1, Ino: uint64(i)})
		in.SetPath("/srv/d" + strconv.Itoa(i%1000) + "/f")
		tb.Set(in)
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range []struct {
		name string
		off  uint64
	}{{"hit", 0}, {"miss", n}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if (tb.Get(Key{Dev: 1, Ino: c.off + r.Uint64N(n)}) == nil) != (c.off > 0) {
					b.Fatal("wrong answer")
				}
			}
		})
	}
}
