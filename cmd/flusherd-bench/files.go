package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"

	"flusherd/bdi"
)

func mib(kb uint64) string { return fmt.Sprintf("%.1f MiB", float64(kb)/1024) }

// parseKV reads "key: value ..." lines (the stats files' and /proc's
// layout): the value is the first field after the colon. Other lines are
// skipped.
func parseKV(data []byte) map[string]string {
	m := map[string]string{}
	for line := range strings.Lines(string(data)) {
		k, v, ok := strings.Cut(line, ":")
		f := strings.Fields(v)
		if !ok || len(f) == 0 {
			continue
		}
		m[strings.TrimSpace(k)] = f[0]
	}
	return m
}

// procStatusKB returns a process's VmRSS and VmHWM in kB (procfs,
// /proc/PID/status); zeros when it cannot be read.
func procStatusKB(pid int) (m struct{ rss, hwm uint64 }) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return m
	}
	st, err := p.NewStatus()
	if err != nil {
		return m
	}
	m.rss, m.hwm = st.VmRSS>>10, st.VmHWM>>10
	return m
}

// meminfoKB returns MemTotal and MemAvailable in kB (procfs,
// /proc/meminfo); zeros when they cannot be read.
func meminfoKB() (m struct{ total, available uint64 }) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return m
	}
	mi, err := fs.Meminfo()
	if err != nil {
		return m
	}
	if mi.MemTotal != nil {
		m.total = *mi.MemTotal
	}
	if mi.MemAvailable != nil {
		m.available = *mi.MemAvailable
	}
	return m
}

// watchStats is the daemon's <stats.dir>/watch/stats: "backend: NAME",
// then counters ("events: N", "overflows: N", "rescans: N",
// "unwatched_dirs: N").
type watchStats struct {
	Backend string
	counts  map[string]uint64
}

func (s watchStats) get(key string) (uint64, bool) {
	n, ok := s.counts[key]
	return n, ok
}

// parseWatchStats parses a watch/stats file; it must have an events line.
// Unknown lines are ignored.
func parseWatchStats(data []byte) (watchStats, error) {
	s := watchStats{counts: map[string]uint64{}}
	for k, v := range parseKV(data) {
		if k == "backend" {
			s.Backend = v
			continue
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			if slices.Contains([]string{"events", "overflows", "rescans", "unwatched_dirs"}, k) {
				return watchStats{}, fmt.Errorf("watch stats: %s: %v", k, err)
			}
			continue
		}
		s.counts[k] = n
	}
	if _, ok := s.counts["events"]; !ok {
		return watchStats{}, errors.New("watch stats: no events line")
	}
	return s, nil
}

// readWatchStats reads <statsDir>/watch/stats; false if it is absent or
// unreadable.
func readWatchStats(statsDir string) (watchStats, bool) {
	p := filepath.Join(statsDir, "watch", "stats")
	data, err := os.ReadFile(p)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			fmt.Fprintln(os.Stderr, "flusherd-bench watch:", err)
		}
		return watchStats{}, false
	}
	s, err := parseWatchStats(data)
	if err != nil {
		fmt.Fprintf(os.Stderr, "flusherd-bench watch: %s: %v\n", p, err)
		return watchStats{}, false
	}
	return s, true
}

// trackedIn is the number of tracked files of one bdi stats file
// (bdi.Stats.Tracked).
func trackedIn(data []byte) (uint64, bool) {
	st, err := bdi.ParseStats(data, os.Getpagesize())
	if err != nil {
		return 0, false
	}
	return uint64(st.Tracked()), true
}

// tracked sums the tracked files over every device's stats file
// (<statsDir>/bdi/<dev>/stats); false if there is none yet.
func tracked(statsDir string) (uint64, bool) {
	paths, _ := filepath.Glob(filepath.Join(statsDir, "bdi", "*", "stats"))
	var n uint64
	found := false
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if c, ok := trackedIn(data); ok {
			n += c
			found = true
		}
	}
	return n, found
}

type wrow struct {
	section      int
	name, target string
	vals         map[string]string
}

type wtable struct{ rows []*wrow }

// set records backend's value on the named row, made on first use.
func (t *wtable) set(section int, name, target, backend, val string) {
	for _, r := range t.rows {
		if r.name == name {
			r.vals[backend] = val
			if target != "" {
				r.target = target
			}
			return
		}
	}
	t.rows = append(t.rows, &wrow{section: section, name: name, target: target, vals: map[string]string{backend: val}})
}

func (t *wtable) print(w io.Writer, backends []string) {
	rows := slices.Clone(t.rows)
	slices.SortStableFunc(rows, func(a, b *wrow) int { return a.section - b.section })
	cols := append([]string{"measure"}, backends...)
	cols = append(cols, "target")
	var cells [][]string
	for _, r := range rows {
		c := []string{r.name}
		for _, b := range backends {
			v, ok := r.vals[b]
			if !ok {
				v = "-"
			}
			c = append(c, v)
		}
		cells = append(cells, append(c, r.target))
	}
	markdownTable(w, cols, cells)
}

func metIf(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// thousands formats n with comma separators.
func thousands(n uint64) string {
	s := strconv.FormatUint(n, 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
