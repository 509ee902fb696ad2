package watch

import (
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"flusherd/bdi"
)

// touched schedules a write of the stats file a second from now, unless
// one is already due: at most one write a second while events come, and
// no timer at all while none do.
func (b *base) touched() {
	if b.statsDir == "" || b.statsDue.Load() {
		return // (one event in a stream of them costs one atomic load)
	}
	b.statsMu.Lock()
	defer b.statsMu.Unlock()
	if b.statsNext != nil {
		return
	}
	b.statsDue.Store(true)
	b.statsNext = time.AfterFunc(time.Second, func() {
		b.statsMu.Lock()
		b.statsNext = nil
		b.statsDue.Store(false)
		b.statsMu.Unlock()
		name := ""
		if b.statsName != nil {
			name = b.statsName()
		}
		var trees []TreeUse
		if b.statsTrees != nil {
			trees = b.statsTrees()
		}
		if err := WriteStats(b.statsDir, name, b.ctr, trees); err != nil {
			b.log.Debug("cannot write the watch stats file", zap.Error(err))
		}
	})
}

// WriteStats writes c as <dir>/watch/stats, atomically, in the stats files'
// layout (one "name: value" line each), then a "tree:" line for each tree:
// the backend that serves it and its root, quoted (strconv.Quote), with
// " gone" after a root that is no longer served.
func WriteStats(dir, backend string, c *Counters, trees []TreeUse) error {
	var text strings.Builder
	fmt.Fprintf(&text, "%-16s%10s\n%-16s%10d\n%-16s%10d\n%-16s%10d\n%-16s%10d\n%-16s%10d\n%-16s%10d\n%-16s%10d\n",
		"backend:", backend, "events:", c.Events.Load(), "overflows:", c.Overflows.Load(),
		"rescans:", c.Rescans.Load(), "unwatched_dirs:", c.Unwatched.Load(),
		"nested_mounts:", c.Nested.Load(), "unserved_mounts:", c.Unserved.Load(),
		"quieted:", c.Quieted.Load())
	for _, t := range trees {
		gone := ""
		if !t.Served {
			gone = " gone"
		}
		fmt.Fprintf(&text, "%-16s%10s %s%s\n", "tree:", t.Backend, strconv.Quote(t.Root), gone)
	}
	return bdi.WriteFileAtomic(filepath.Join(dir, "watch", "stats"), func(w io.Writer) error {
		_, err := io.WriteString(w, text.String())
		return err
	})
}
