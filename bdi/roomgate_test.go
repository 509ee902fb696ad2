package bdi

import (
	"testing"
	"time"

	"flusherd/inode"
)

// TestRoomTurn: the room under the in-flight window goes to the oldest
// big file waiting for it. A big file deferred for want of room holds the
// turn; a younger one with room then waits too, an older one takes the
// room (and the turn when it has none); the holder's own attempt with room
// clears it, and a holder not back within roomGateStale is let go.
func TestRoomTurn(t *testing.T) {
	withWB(t, testConfig(), func(h *harness) {
		t := h.t
		old := dirtiedAt(inode.Key{Dev: 7, Ino: 1}, time.Second)
		mid := dirtiedAt(inode.Key{Dev: 7, Ino: 2}, 2*time.Second)
		young := dirtiedAt(inode.Key{Dev: 7, Ino: 3}, 3*time.Second)
		steps := []struct {
			name    string
			in      *inode.Inode
			hasRoom bool
			want    bool
		}{
			{"nobody waits: room taken", young, true, true},
			{"mid without room: holds the turn", mid, false, false},
			{"younger with room: waits behind mid", young, true, false},
			{"older with room: takes it", old, true, true},
			{"older without room: takes the turn", old, false, false},
			{"mid with room: waits behind old now", mid, true, false},
			{"the holder with room: takes it, and frees the turn", old, true, true},
			{"then the young one with room", young, true, true},
			{"young without room: holds the turn", young, false, false},
		}
		for _, s := range steps {
			if got := h.wb.roomTurn(s.in, s.hasRoom); got != s.want {
				t.Errorf("%s: roomTurn = %v, want %v", s.name, got, s.want)
			}
		}
		if !h.wb.roomTurn(mid, true) {
			t.Errorf("mid, older than the holder (young), with room: waited")
		}
		// young holds the turn: a younger file waits, until the turn
		// is let go roomGateStale after young was last deferred.
		h.wb.roomTurn(young, false)
		if h.wb.roomTurn(dirtiedAt(inode.Key{Dev: 7, Ino: 4}, 4*time.Second), true) {
			t.Errorf("a younger file took the room while young holds the turn")
		}
		time.Sleep(roomGateStale + time.Millisecond)
		if !h.wb.roomTurn(dirtiedAt(inode.Key{Dev: 7, Ino: 4}, 4*time.Second), true) {
			t.Errorf("the turn was not let go %v after its holder was last deferred", roomGateStale)
		}
	})
}

// dirtiedAt returns a new inode with Key k, dirtied at when.
func dirtiedAt(k inode.Key, when time.Duration) *inode.Inode {
	in := inode.New(k)
	in.DirtiedWhen = when
	return in
}
