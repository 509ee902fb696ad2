package lists

// FIFO is a first-in first-out queue on a ring buffer: Push and Pop cost
// O(1) amortised and reuse the buffer, where a slice popped from its front
// (q = q[1:]) leaves its array behind and makes every append that follows
// grow a new one. A popped slot is zeroed, so the queue keeps no reference
// to what it handed out. Once drained, a buffer of more than keep slots is
// let go. The zero value is an empty queue; a FIFO is not safe for
// concurrent use.
type FIFO[T any] struct {
	buf  []T // len(buf) is 0 or a power of two
	head int // index of the first element
	n    int // elements queued
}

// fifoKeep is the most slots a drained FIFO keeps.
const fifoKeep = 1024

// Len is the number of elements queued.
func (q *FIFO[T]) Len() int { return q.n }

// Push adds v at the back.
func (q *FIFO[T]) Push(v T) {
	if q.n == len(q.buf) {
		q.grow()
	}
	q.buf[(q.head+q.n)&(len(q.buf)-1)] = v
	q.n++
}

// Pop takes the front element; ok is false when the queue is empty.
func (q *FIFO[T]) Pop() (v T, ok bool) {
	if q.n == 0 {
		return v, false
	}
	var zero T
	v, q.buf[q.head] = q.buf[q.head], zero
	q.head = (q.head + 1) & (len(q.buf) - 1)
	q.n--
	if q.n == 0 {
		q.head = 0
		if len(q.buf) > fifoKeep {
			q.buf = nil
		}
	}
	return v, true
}

// grow doubles the buffer (at least 16 slots), the elements in order from
// its start.
func (q *FIFO[T]) grow() {
	buf := make([]T, max(16, 2*len(q.buf)))
	k := copy(buf, q.buf[q.head:])
	copy(buf[k:], q.buf[:q.head])
	q.buf, q.head = buf, 0
}
