package sysfs

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// WbtLatency returns the latency target of the kernel's writeback
// throttling (blk-wbt) on block device name's request queue (a bdi name
// "MAJ:MIN"): <Sys>/dev/block/<name>/queue/wbt_lat_usec, the whole disk's
// for a partition. 0: wbt is off there (an I/O scheduler such as BFQ
// turns it off). A bdi that is not a block device, or a queue without the
// file, gives an error wrapping fs.ErrNotExist; a malformed file, one
// wrapping ErrFormat.
func (fs FS) WbtLatency(name string) (time.Duration, error) {
	if !validName(name) {
		return 0, fmt.Errorf("sysfs: bad device name %q: %w", name, errInvalid)
	}
	p, err := fs.sysPath("dev", "block", name)
	if err != nil {
		return 0, err
	}
	dir, err := filepath.EvalSymlinks(p)
	if err != nil {
		return 0, fmt.Errorf("sysfs: %w", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "partition")); err == nil {
		dir = filepath.Dir(dir) // the disk's directory holds the queue
	}
	f := filepath.Join(dir, "queue", "wbt_lat_usec")
	data, err := os.ReadFile(f)
	if err != nil {
		return 0, fmt.Errorf("sysfs: %w", err)
	}
	us, err := strconv.ParseUint(string(bytes.TrimSpace(data)), 10, 63)
	if err != nil {
		return 0, fmt.Errorf("sysfs: %s: %w: %w", f, ErrFormat, err)
	}
	return time.Duration(us) * time.Microsecond, nil
}
