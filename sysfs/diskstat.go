package sysfs

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// DiskWritten returns the bytes that block device name (a bdi name of the
// form "MAJ:MIN", as /sys/class/bdi names a disk's) has completed writing
// since it appeared: the sectors written field of <Sys>/dev/block/<name>/stat
// (Documentation/block/stat.rst), times 512. It is the device's completed
// write count, the figure the kernel's write bandwidth estimate follows
// (wb_update_write_bandwidth counts pages whose writeback ended). A bdi
// that is not a block device (FUSE, NFS, "btrfs-N") has no such file: the
// error wraps fs.ErrNotExist. A malformed file gives an error wrapping
// ErrFormat.
func (fs FS) DiskWritten(name string) (uint64, error) {
	if !validName(name) {
		return 0, fmt.Errorf("sysfs: bad device name %q: %w", name, errInvalid)
	}
	p, err := fs.sysPath("dev", "block", name, "stat")
	if err != nil {
		return 0, err
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return 0, fmt.Errorf("sysfs: %w", err)
	}
	f := bytes.Fields(data)
	if len(f) < 7 {
		return 0, fmt.Errorf("sysfs: %s: %d fields, want at least 7: %w", p, len(f), ErrFormat)
	}
	sectors, err := strconv.ParseUint(string(f[6]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("sysfs: %s: sectors written: %w: %w", p, ErrFormat, err)
	}
	return sectors * 512, nil
}
