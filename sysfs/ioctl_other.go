//go:build linux && (mips || mipsle || mips64 || mips64le || ppc64 || ppc64le || sparc64)

package sysfs

// btrfsIocFSInfo is _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args) in the
// encoding of mips, powerpc and sparc (13 size bits, 3 direction bits,
// _IOC_READ == 2): 2 << 29 | size << 16 | type << 8 | nr.
const btrfsIocFSInfo uintptr = 2<<29 | 1024<<16 | 0x94<<8 | 31
