package lists

import (
	"math/rand/v2"
	"testing"
)

// TestFIFOOrder: pushes and pops interleaved at random (the ring wraps and
// grows while it holds elements) come out in the order they went in, none
// lost or repeated, and a popped slot holds no reference.
func TestFIFOOrder(t *testing.T) {
	var q FIFO[*int]
	rng := rand.New(rand.NewPCG(3, 4))
	pushed, popped := 0, 0
	pop := func() {
		v, ok := q.Pop()
		if !ok {
			if pushed != popped {
				t.Fatalf("empty with %d of %d popped", popped, pushed)
			}
			return
		}
		if *v != popped {
			t.Fatalf("pop %d gave %d", popped, *v)
		}
		popped++
	}
	for pushed < 20000 {
		for range rng.IntN(50) {
			v := pushed
			q.Push(&v)
			pushed++
		}
		for range rng.IntN(50) {
			pop()
		}
		if q.Len() != pushed-popped {
			t.Fatalf("Len %d, want %d", q.Len(), pushed-popped)
		}
		for i := range q.buf {
			if (i-q.head)&(len(q.buf)-1) >= q.n && q.buf[i] != nil {
				t.Fatalf("free slot %d still holds %d", i, *q.buf[i])
			}
		}
	}
	for popped < pushed {
		pop()
	}
	if _, ok := q.Pop(); ok {
		t.Fatal("popped from an empty queue")
	}
}

// TestFIFODrainLetsGo: a queue drained after holding more than fifoKeep
// elements lets its buffer go; a small one keeps it for the next pushes.
func TestFIFODrainLetsGo(t *testing.T) {
	var q FIFO[int]
	for i := range 10 {
		q.Push(i)
	}
	for range 10 {
		q.Pop()
	}
	if len(q.buf) == 0 {
		t.Error("a small drained queue let its buffer go")
	}
	for i := range 5000 {
		q.Push(i)
	}
	for range 5000 {
		q.Pop()
	}
	if q.buf != nil {
		t.Errorf("a drained queue kept %d slots", len(q.buf))
	}
}

// BenchmarkFIFO: a queue that is pushed and popped in turn, never empty,
// against a slice popped from its front. Allocations per element show the
// slice's regrowth.
func BenchmarkFIFO(b *testing.B) {
	b.Run("ring", func(b *testing.B) {
		var q FIFO[*int]
		v := new(int)
		q.Push(v)
		b.ReportAllocs()
		for b.Loop() {
			q.Push(v)
			q.Pop()
		}
	})
	b.Run("slice", func(b *testing.B) {
		q := []*int{new(int)}
		v := new(int)
		b.ReportAllocs()
		for b.Loop() {
			q = append(q, v)
			q[0] = nil
			q = q[1:]
		}
	})
}
