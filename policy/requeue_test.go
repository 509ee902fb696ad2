package policy

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDecide(t *testing.T) {
	// written: an attempt that read its file dirty and wrote it.
	written := func(o Outcome) Facts { return Facts{Outcome: o, Read: true, DirtyBefore: 8} }
	failed := func(o Outcome) Facts { return Facts{Outcome: o, Err: true, Read: true, DirtyBefore: 8} }
	tests := []struct {
		name string
		f    Facts
		want Decision
	}{
		// The requeue table of DESIGN.md, one row each.
		{"clean now", written(Clean), Decision{Dest: Forget}},
		{"write_chunk used up", written(ChunkUsed), Decision{Dest: MoreIO}},
		{"redirtied", written(Redirtied), Decision{Dest: MoreIOWait}},
		{"pages skipped", written(Skipped), Decision{Dest: MoreIOWait}},
		{"blocked", failed(Blocked), Decision{Dest: MoreIOWait}},
		{"filesystem unavailable", failed(FSUnavailable), Decision{Dest: MoreIOWait}},
		{"under writeback", Facts{Outcome: UnderWriteback, Read: true, WritebackBefore: 8}, Decision{Dest: MoreIOWait}},
		{"I/O error", failed(IOError), Decision{Dest: MoreIOWait}},
		{"gone", failed(Gone), Decision{Dest: Drop}},
		// The legacy policy: blocked inodes get redirty_tail.
		{"legacy: blocked", Facts{Outcome: Blocked, Err: true, Blocked: LegacyRedirtyTail}, Decision{Dest: RedirtyTail}},
		{"legacy: redirtied", Facts{Outcome: Redirtied, Blocked: LegacyRedirtyTail}, Decision{Dest: RedirtyTail}},
		{"legacy: clean", Facts{Outcome: Clean, Blocked: LegacyRedirtyTail}, Decision{Dest: Forget}},

		// Lost data: an I/O error before, found clean without a write.
		{"lost: found clean", Facts{Outcome: Clean, Read: true, HadIOError: true}, Decision{Dest: Failed, Lost: true}},
		{"lost: the retry failed too", Facts{Outcome: FSUnavailable, Err: true, Read: true, HadIOError: true}, Decision{Dest: Failed, Lost: true}},
		{"not lost: counts not read", Facts{Outcome: Clean, HadIOError: true}, Decision{Dest: Forget}},
		{"not lost: redirtied", Facts{Outcome: Redirtied, Read: true, HadIOError: true, Redirtied: true}, Decision{Dest: MoreIOWait}},
		{"not lost: dirty pages found", Facts{Outcome: Clean, Read: true, HadIOError: true, DirtyBefore: 1}, Decision{Dest: Forget}},
		{"not lost: gone", Facts{Outcome: Gone, Err: true, Read: true, HadIOError: true}, Decision{Dest: Drop}},

		// A loss reported again.
		{"lost before: nothing written since", Facts{Outcome: Clean, LostBefore: true}, Decision{Dest: Failed, StillLost: true}},
		{"lost before: written again", Facts{Outcome: Clean, Read: true, DirtyBefore: 4, LostBefore: true}, Decision{Dest: Forget, Rewritten: true}},
		{"lost before: written again, blocked", Facts{Outcome: Blocked, Err: true, Read: true, WritebackBefore: 4, LostBefore: true}, Decision{Dest: MoreIOWait, Rewritten: true}},
		{"lost before: redirtied, not yet written", Facts{Outcome: Redirtied, Redirtied: true, LostBefore: true}, Decision{Dest: MoreIOWait}},

		// Trees that go.
		{"dropped: overrides clean", Facts{Outcome: Clean, Dropped: true}, Decision{Dest: Drop}},
		{"dropped: overrides a loss", Facts{Outcome: Clean, Read: true, HadIOError: true, Dropped: true}, Decision{Dest: Drop, Lost: true}},
		{"leaving: headway goes on", Facts{Outcome: ChunkUsed, Read: true, DirtyBefore: 8, Leaving: true, Headway: true}, Decision{Dest: MoreIO}},
		{"leaving: clean is forgotten", Facts{Outcome: Clean, Read: true, DirtyBefore: 8, Leaving: true}, Decision{Dest: Forget}},
		{"leaving: chunk used, no headway", Facts{Outcome: ChunkUsed, Read: true, DirtyBefore: 8, Leaving: true}, Decision{Dest: Forget}},
		{"leaving: blocked is its last", Facts{Outcome: Blocked, Err: true, Leaving: true, Headway: true}, Decision{Dest: Forget}},
		{"leaving: gone is dropped", Facts{Outcome: Gone, Err: true, Leaving: true}, Decision{Dest: Drop}},

		// A new file took the number; a hard link's other name.
		{"renewed with a handle", Facts{Outcome: Gone, Err: true, Renewed: true, HadHandle: true}, Decision{Dest: MoreIOWait, CountGone: true}},
		{"renewed without a handle", Facts{Outcome: Gone, Err: true, Renewed: true}, Decision{Dest: MoreIOWait}},
		{"renewed, not gone", Facts{Outcome: Clean, Renewed: true, HadHandle: true}, Decision{Dest: Forget}},
		{"other path", Facts{Outcome: Gone, Err: true, OtherPath: true}, Decision{Dest: MoreIOWait, TakeOtherPath: true}},
		{"other path, not gone", written(Clean), Decision{Dest: Forget}},
		{"renewed before other path", Facts{Outcome: Gone, Err: true, Renewed: true, OtherPath: true}, Decision{Dest: MoreIOWait}},
		{"leaving, gone, renewed", Facts{Outcome: Gone, Err: true, Leaving: true, Renewed: true, HadHandle: true}, Decision{Dest: MoreIOWait, CountGone: true}},

		// Shutdown.
		{"shutdown: unreachable", Facts{Outcome: FSUnavailable, Err: true, ShuttingDown: true}, Decision{Dest: Forget, GiveUp: true}},
		{"shutdown: denied", Facts{Outcome: IOError, Err: true, ShuttingDown: true, Denied: true}, Decision{Dest: Forget, GiveUp: true}},
		{"shutdown: open refused (EIO)", Facts{Outcome: IOError, Err: true, ShuttingDown: true, OpenFailed: true}, Decision{Dest: Forget, GiveUp: true}},
		{"shutdown: EIO of a write is retried", Facts{Outcome: IOError, Err: true, Read: true, ShuttingDown: true}, Decision{Dest: MoreIOWait}},
		{"running: open failed (EIO) is retried", Facts{Outcome: IOError, Err: true, OpenFailed: true}, Decision{Dest: MoreIOWait}},
		{"shutdown: blocked is retried", Facts{Outcome: Blocked, Err: true, ShuttingDown: true}, Decision{Dest: MoreIOWait}},
		{"shutdown: a loss stays reported", Facts{Outcome: FSUnavailable, Err: true, Read: true, HadIOError: true, ShuttingDown: true}, Decision{Dest: Failed, Lost: true}},
		{"shutdown: gone", Facts{Outcome: Gone, Err: true, ShuttingDown: true, Denied: true}, Decision{Dest: Drop}},
		{"no shutdown: unreachable is retried", failed(FSUnavailable), Decision{Dest: MoreIOWait}},
	}
	for _, tc := range tests {
		if diff := cmp.Diff(tc.want, Decide(tc.f)); diff != "" {
			t.Errorf("%s: Decide(%+v) (-want +got):\n%s", tc.name, tc.f, diff)
		}
	}
}
