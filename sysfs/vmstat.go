package sysfs

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// VMStat returns all of <Proc>/vmstat as a map from name to value, exactly
// as the kernel prints them (vmstat_show in mm/vmstat.c): most entries are
// counts of pages (nr_*) or event counters. Errors wrap the read error or
// ErrFormat for a malformed line.
func (fs FS) VMStat() (map[string]uint64, error) {
	p, err := fs.procPath("vmstat")
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("sysfs: reading %s: %w", p, err)
	}
	m := make(map[string]uint64, 200)
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		f := bytes.Fields(sc.Bytes())
		if len(f) == 0 {
			continue
		}
		if len(f) != 2 {
			return nil, fmt.Errorf("sysfs: %s:%d: %q: %w", p, n, sc.Text(), ErrFormat)
		}
		v, err := strconv.ParseUint(string(f[1]), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("sysfs: %s:%d: %w: %w", p, n, ErrFormat, err)
		}
		m[string(f[0])] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("sysfs: reading %s: %w", p, err)
	}
	return m, nil
}

// DirtyThresholds returns nr_dirty_threshold and
// nr_dirty_background_threshold from <Proc>/vmstat, in pages (multiply by
// PageSize for bytes). These are the global limits the kernel computes in
// global_dirty_limits() (mm/page-writeback.c) from vm.dirty_ratio /
// vm.dirty_bytes and their background variants. A missing key is an error
// wrapping ErrFormat.
func (fs FS) DirtyThresholds() (dirty, background uint64, err error) {
	m, err := fs.VMStat()
	if err != nil {
		return 0, 0, err
	}
	dirty, ok1 := m["nr_dirty_threshold"]
	background, ok2 := m["nr_dirty_background_threshold"]
	if !ok1 || !ok2 {
		return 0, 0, fmt.Errorf("sysfs: %s/vmstat lacks nr_dirty_threshold or nr_dirty_background_threshold: %w", fs.Proc, ErrFormat)
	}
	return dirty, background, nil
}

// NrDirty returns /proc/vmstat nr_dirty: the pages of the page cache that
// are dirty now, on every device (the count the kernel compares with its
// background threshold in domain_over_bg_thresh). A missing key is an error
// wrapping ErrFormat.
func (fs FS) NrDirty() (uint64, error) {
	m, err := fs.VMStat()
	if err != nil {
		return 0, err
	}
	n, ok := m["nr_dirty"]
	if !ok {
		return 0, fmt.Errorf("sysfs: %s/vmstat lacks nr_dirty: %w", fs.Proc, ErrFormat)
	}
	return n, nil
}
