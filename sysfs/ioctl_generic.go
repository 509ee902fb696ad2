//go:build linux && !(mips || mipsle || mips64 || mips64le || ppc64 || ppc64le || sparc64)

package sysfs

// btrfsIocFSInfo is _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args) with
// sizeof(struct btrfs_ioctl_fs_info_args) == 1024 (include/uapi/linux/btrfs.h),
// in the asm-generic ioctl encoding (x86, arm, arm64, riscv, s390, loong64):
// _IOC_READ (2) << 30 | size << 16 | type << 8 | nr.
const btrfsIocFSInfo uintptr = 2<<30 | 1024<<16 | 0x94<<8 | 31
