package sysfs

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// StatLine is one line of /sys/kernel/debug/bdi/<name>/stats.
type StatLine struct {
	Key   string // e.g. "BdiWriteback", "b_dirty", "state"
	Value uint64 // in Unit; "state" is a bit mask (enum wb_state)
	Unit  string // "" (a count), "kB" or "kBps"
}

// KernelBdiStats reads <Sys>/kernel/debug/bdi/<name>/stats (debugfs must be
// mounted at <Sys>/kernel/debug) and returns its lines in the kernel's order,
// for tools that compare flusherd's accounting with the kernel's.
//
// The format is that of bdi_debug_stats_show in mm/backing-dev.c:
// "Key:  value[ unit]" with values in kB (BdiWriteback, BdiReclaimable,
// BdiDirtyThresh, DirtyThresh, BackgroundThresh, BdiDirtied, BdiWritten),
// kBps (BdiWriteBandwidth) or plain counts (b_dirty, b_io, b_more_io,
// b_dirty_time, bdi_list); "state" is printed in hex (%lx) and parsed as
// such. Keys are not checked, so lines added by newer kernels are returned
// too.
//
// A missing file (no debugfs, no such bdi) gives an error wrapping
// fs.ErrNotExist; an invalid name one wrapping fs.ErrInvalid; a malformed
// line one wrapping ErrFormat. Reading debugfs normally requires root.
func (fs FS) KernelBdiStats(name string) ([]StatLine, error) {
	if !validName(name) {
		return nil, fmt.Errorf("sysfs: invalid bdi name %q: %w", name, errInvalid)
	}
	p, err := fs.sysPath("kernel", "debug", "bdi", name, "stats")
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("sysfs: reading %s: %w", p, err)
	}
	var out []StatLine
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		key, rest, ok := strings.Cut(line, ":")
		f := strings.Fields(rest)
		key = strings.TrimSpace(key)
		if !ok || key == "" || len(f) < 1 || len(f) > 2 {
			return nil, fmt.Errorf("sysfs: %s:%d: %q: %w", p, n, line, ErrFormat)
		}
		base := 10
		if key == "state" {
			base = 16
		}
		v, err := strconv.ParseUint(f[0], base, 64)
		if err != nil {
			return nil, fmt.Errorf("sysfs: %s:%d: %w: %w", p, n, ErrFormat, err)
		}
		sl := StatLine{Key: key, Value: v}
		if len(f) == 2 {
			sl.Unit = f[1]
		}
		out = append(out, sl)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("sysfs: reading %s: %w", p, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("sysfs: %s is empty: %w", p, ErrFormat)
	}
	return out, nil
}
