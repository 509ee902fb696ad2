package policy

// Facts is what is known of an inode once an attempt on it has ended: its
// outcome and the states that override the requeue table.
type Facts struct {
	Outcome Outcome
	Blocked RequeueBlocked
	// Err: the attempt failed with an error (Outcome was classified from it).
	Err bool
	// Read: the attempt's open and first cachestat succeeded;
	// DirtyBefore and WritebackBefore are the pages that cachestat saw.
	Read                         bool
	DirtyBefore, WritebackBefore uint64
	// Redirtied: an event for the inode came during the attempt.
	Redirtied bool
	// HadIOError: an I/O error of its own, or one on its filesystem since
	// it was dirtied, came before this attempt (see Lost).
	HadIOError bool
	// LostBefore: its data was lost earlier and it is reported again.
	LostBefore bool
	// Dropped: its tree went away during the attempt.
	Dropped bool
	// Leaving: its tree left the configuration; Headway: the attempt was
	// deferred by max_inflight, or used up write_chunk and left fewer
	// dirty pages than it found, so writing it goes on.
	Leaving, Headway bool
	// Renewed: a new file took the inode's number during the attempt;
	// HadHandle: the attempt named the old file by its handle.
	Renewed, HadHandle bool
	// OtherPath: the inode has another name (a hard link) to try.
	OtherPath bool
	// ShuttingDown: the daemon is stopping; Denied: the attempt failed
	// with EACCES or EPERM; OpenFailed: the filesystem refused its open
	// (OpenFailed: EIO from one shut down, EUCLEAN, EBADMSG).
	ShuttingDown, Denied, OpenFailed bool
}

// Decision is where an inode goes after an attempt and what changes with
// it.
type Decision struct {
	Dest Dest
	// Lost: its data was lost by this attempt's finding (Lost).
	Lost bool
	// StillLost: its loss stands: nothing was written since.
	StillLost bool
	// Rewritten: written again since its loss; the loss is over.
	Rewritten bool
	// CountGone: the file the attempt named is gone (a new file has its
	// number): counted in inodes_gone and as progress.
	CountGone bool
	// TakeOtherPath: the inode is tried under its other name.
	TakeOtherPath bool
	// GiveUp: left unwritten at shutdown, for the shutdown report.
	GiveUp bool
}

// Decide is requeue_inode(): the one place that picks an inode's list
// after an attempt. The outcome's row of the table (Requeue) is
// overridden, in this order, by a loss (Failed), a loss that stands, a
// tree dropped (Drop) or leaving (Forget unless Headway), a number taken
// by a new file or another name to try (MoreIOWait instead of Drop), and
// a shutdown that cannot reach the file (Forget, GiveUp).
func Decide(f Facts) Decision {
	d := Decision{Dest: Requeue(f.Outcome, f.Blocked)}
	if Lost(f.Outcome, f.HadIOError, f.Read, f.DirtyBefore, f.WritebackBefore, f.Redirtied) {
		d.Dest, d.Lost = Failed, true
	}
	if f.LostBefore && d.Dest != Failed {
		switch {
		case f.Outcome == Clean && f.DirtyBefore == 0 && f.WritebackBefore == 0 && !f.Redirtied:
			d.Dest, d.StillLost = Failed, true
		case f.DirtyBefore > 0 || f.WritebackBefore > 0:
			d.Rewritten = true
		}
	}
	switch {
	case f.Dropped:
		d.Dest = Drop
	case f.Leaving && d.Dest != Drop:
		if f.Err || !f.Headway {
			d.Dest = Forget
		}
	case d.Dest == Drop && f.Renewed:
		d.Dest, d.CountGone = MoreIOWait, f.HadHandle
	case d.Dest == Drop && f.OtherPath:
		d.Dest, d.TakeOtherPath = MoreIOWait, true
	}
	if f.ShuttingDown && d.Dest != Drop && d.Dest != Failed && (f.Outcome == FSUnavailable || f.Denied || f.OpenFailed) {
		d.Dest, d.GiveUp = Forget, true
	}
	return d
}
