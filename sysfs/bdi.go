package sysfs

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// BdiName returns the name the kernel gives the backing device (bdi) of a
// filesystem object: the name used in <Sys>/class/bdi/<name> and
// <Sys>/kernel/debug/bdi/<name>.
//
// dev is the st_dev of a file. fd is an open file descriptor (O_PATH is fine)
// of a file or directory on the same filesystem, or -1 when none is at hand;
// it is needed for btrfs and fuseblk, whose bdi cannot be derived from st_dev.
//
// The rules follow the kernel:
//
//   - btrfs (fstatfs(fd).f_type == BTRFS_SUPER_MAGIC): st_dev is an anonymous
//     0:N that differs per subvolume, while the bdi is per filesystem and is
//     registered by super_setup_bdi() as "btrfs-N" (fs/super.c). The name is
//     the basename of the symlink <Sys>/fs/btrfs/<fsid>/bdi, with fsid from
//     the BTRFS_IOC_FS_INFO ioctl (fs/btrfs/ioctl.c, fs/btrfs/sysfs.c). An
//     O_PATH fd is reopened through <Proc>/self/fd for the ioctl.
//   - fuseblk (f_type == FUSE_SUPER_MAGIC with a non-zero major): fuse
//     replaces the block device's bdi by a private one named
//     "MAJ:MIN-fuseblk" (fuse_bdi_init in fs/fuse/inode.c).
//   - block devices, i.e. a non-zero major with <Sys>/dev/block/MAJ:MIN
//     present: a filesystem uses the bdi of the whole disk
//     (bdev->bd_disk->bdi), which add_disk() registers as
//     "<disk major>:<first minor>" (block/genhd.c). If the sysfs directory
//     has a "partition" file, the name is therefore the content of the
//     parent directory's "dev" file (e.g. 8:2 -> 8:0, 259:0 -> 7:0 for a
//     loop partition); otherwise MAJ:MIN itself (whole disks, device-mapper,
//     md, loop).
//   - anything else (NFS, FUSE, tmpfs, overlay, ...; usually major 0):
//     "MAJ:MIN" of dev, the name NFS and FUSE register. Filesystems without
//     their own bdi (tmpfs, overlay, proc) use the unregistered
//     noop_backing_dev_info, so that name will not exist.
//
// With fd == -1, btrfs and fuseblk cannot be recognised and the st_dev rules
// apply. The name found is returned even if <Sys>/class/bdi has no such
// directory; use HasBdi to check.
//
// Errors wrap the underlying system error (fstatfs, ioctl, reading sysfs) and
// ErrFormat when a sysfs "dev" file cannot be parsed.
func (fs FS) BdiName(dev uint64, fd int) (string, error) {
	if fd >= 0 {
		var st unix.Statfs_t
		if err := unix.Fstatfs(fd, &st); err != nil {
			return "", fmt.Errorf("sysfs: fstatfs fd %d: %w", fd, err)
		}
		switch uint32(st.Type) {
		case unix.BTRFS_SUPER_MAGIC:
			return fs.btrfsBdi(fd)
		case unix.FUSE_SUPER_MAGIC:
			if unix.Major(dev) != 0 {
				return devName(dev) + "-fuseblk", nil
			}
		}
	}
	if unix.Major(dev) == 0 {
		return devName(dev), nil
	}
	return fs.blockBdi(dev)
}

// HasBdi reports whether <Sys>/class/bdi/<name> exists and is a directory.
func (fs FS) HasBdi(name string) bool {
	if !validName(name) {
		return false
	}
	p, err := fs.sysPath("class", "bdi", name)
	if err != nil {
		return false
	}
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

func devName(dev uint64) string {
	return fmt.Sprintf("%d:%d", unix.Major(dev), unix.Minor(dev))
}

func (fs FS) blockBdi(dev uint64) (string, error) {
	name := devName(dev)
	p, err := fs.sysPath("dev", "block", name)
	if err != nil {
		return "", err
	}
	if _, err := os.Lstat(p); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			// Not a block device sysfs knows (e.g. a fake st_dev).
			return name, nil
		}
		return "", fmt.Errorf("sysfs: %w", err)
	}
	if _, err := os.Stat(filepath.Join(p, "partition")); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return name, nil
		}
		return "", fmt.Errorf("sysfs: %w", err)
	}
	// A partition: <Sys>/dev/block/MAJ:MIN is a symlink into
	// /sys/devices/.../<disk>/<part>; the disk is the parent directory.
	resolved, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", fmt.Errorf("sysfs: resolving %s: %w", p, err)
	}
	devFile := filepath.Join(filepath.Dir(resolved), "dev")
	b, err := os.ReadFile(devFile)
	if err != nil {
		return "", fmt.Errorf("sysfs: reading %s: %w", devFile, err)
	}
	parent, err := parseDev(strings.TrimSpace(string(b)))
	if err != nil {
		return "", fmt.Errorf("sysfs: %s: %w", devFile, err)
	}
	return parent, nil
}

// parseDev validates a "MAJ:MIN" string and returns it in canonical form.
func parseDev(s string) (string, error) {
	maj, min, ok := strings.Cut(s, ":")
	if ok {
		a, err1 := strconv.ParseUint(maj, 10, 32)
		b, err2 := strconv.ParseUint(min, 10, 32)
		if err1 == nil && err2 == nil {
			return fmt.Sprintf("%d:%d", a, b), nil
		}
	}
	return "", fmt.Errorf("device number %q: %w", s, ErrFormat)
}

// btrfsFSInfoArgs mirrors struct btrfs_ioctl_fs_info_args: __u64 max_id,
// __u64 num_devices, __u8 fsid[16] at offset 16, then fields we ignore.
type btrfsFSInfoArgs struct {
	MaxID      uint64
	NumDevices uint64
	FSID       [16]byte
	_          [1024 - 32]byte
}

func (fs FS) btrfsBdi(fd int) (string, error) {
	fsid, err := fs.btrfsFSID(fd)
	if err != nil {
		return "", err
	}
	link, err := fs.sysPath("fs", "btrfs", fsid, "bdi")
	if err != nil {
		return "", err
	}
	target, err := os.Readlink(link)
	if err != nil {
		return "", fmt.Errorf("sysfs: btrfs bdi: %w", err)
	}
	return filepath.Base(target), nil
}

// btrfsFSID returns the fsid of the btrfs filesystem of fd as a canonical
// UUID string, the name of its directory in /sys/fs/btrfs.
func (fs FS) btrfsFSID(fd int) (string, error) {
	var args btrfsFSInfoArgs
	err := ioctlFSInfo(fd, &args)
	if errors.Is(err, unix.EBADF) {
		// O_PATH descriptors do not allow ioctl(2); reopen.
		var rfd int
		rfd, err = fs.reopen(fd)
		if err != nil {
			return "", err
		}
		err = ioctlFSInfo(rfd, &args)
		unix.Close(rfd)
	}
	if err != nil {
		return "", fmt.Errorf("sysfs: BTRFS_IOC_FS_INFO on fd %d: %w", fd, err)
	}
	return formatUUID(args.FSID), nil
}

func ioctlFSInfo(fd int, args *btrfsFSInfoArgs) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), btrfsIocFSInfo, uintptr(unsafe.Pointer(args)))
	if e != 0 {
		return e
	}
	return nil
}

// reopen opens a readable descriptor for the btrfs object behind fd (which
// may be O_PATH). Regular files and directories are reopened through
// <Proc>/self/fd/<fd>; for other types (fifos, device nodes, symlinks), whose
// ioctls would not reach btrfs, the parent directory is opened instead and
// checked to be on the same st_dev.
func (fs FS) reopen(fd int) (int, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return -1, fmt.Errorf("sysfs: fstat fd %d: %w", fd, err)
	}
	link, err := fs.procPath("self", "fd", strconv.Itoa(fd))
	if err != nil {
		return -1, err
	}
	const flags = unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOCTTY | unix.O_NONBLOCK
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG, unix.S_IFDIR:
		rfd, err := unix.Open(link, flags, 0)
		if err != nil {
			return -1, fmt.Errorf("sysfs: reopening %s: %w", link, err)
		}
		return rfd, nil
	}
	target, err := os.Readlink(link)
	if err != nil {
		return -1, fmt.Errorf("sysfs: %w", err)
	}
	dir := filepath.Dir(target)
	rfd, err := unix.Open(dir, flags|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, fmt.Errorf("sysfs: opening %s: %w", dir, err)
	}
	var dst unix.Stat_t
	if err := unix.Fstat(rfd, &dst); err != nil || dst.Dev != st.Dev {
		unix.Close(rfd)
		if err == nil {
			err = fmt.Errorf("parent %s is on another device: %w", dir, errInvalid)
		}
		return -1, fmt.Errorf("sysfs: fd %d: %w", fd, err)
	}
	return rfd, nil
}

// formatUUID formats 16 bytes as xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as
// the kernel's %pU does.
func formatUUID(u [16]byte) string {
	var b strings.Builder
	for i, part := range [][]byte{u[0:4], u[4:6], u[6:8], u[8:10], u[10:16]} {
		if i > 0 {
			b.WriteByte('-')
		}
		b.WriteString(hex.EncodeToString(part))
	}
	return b.String()
}
