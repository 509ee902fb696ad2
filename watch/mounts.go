package watch

import (
	"context"
	"errors"
	"flusherd/inode"
	"flusherd/internal/logpath"

	"github.com/moby/sys/mountinfo"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// watchMounts calls checkMounts at once, then, whenever the mount table
// changes (poll(2) on /proc/self/mountinfo reports POLLPRI), checks the
// roots at or below each mount point mounted or unmounted since
// (checkRootsUnder: a mount elsewhere costs O(depth), not O(trees)), and
// calls checkMounts, until ctx ends. Every rootCheckEvery without a
// change it checks every root (checkRoots): a root can go without any
// event or mount change (a btrfs subvolume deleted), and one that could
// not be reached may be reachable again.
func (b *base) watchMounts(ctx context.Context) {
	mi, err := unix.Open("/proc/self/mountinfo", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		b.log.Warn("cannot watch the mount table; an unmounted tree is noticed only by its events", zap.Error(err))
		return
	}
	defer unix.Close(mi)
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		b.log.Warn("cannot watch the mount table", zap.Error(err))
		return
	}
	defer unix.Close(p[0])
	stop := context.AfterFunc(ctx, func() { unix.Close(p[1]) })
	defer func() {
		if stop() {
			unix.Close(p[1])
		}
	}()
	fds := []unix.PollFd{{Fd: int32(mi), Events: unix.POLLPRI}, {Fd: int32(p[0]), Events: unix.POLLIN}}
	infos, err := mountinfo.GetMounts(nil)
	b.checkMounts(ctx, infos, err)
	for {
		fds[0].Revents, fds[1].Revents = 0, 0
		n, err := unix.Poll(fds, int(b.rootCheckEvery.Milliseconds()))
		if err != nil && !errors.Is(err, unix.EINTR) {
			b.log.Warn("poll on the mount table failed", zap.Error(err))
			return
		}
		if fds[1].Revents != 0 || ctx.Err() != nil {
			return
		}
		if n == 0 && err == nil {
			b.checkRoots()
			continue
		}
		if fds[0].Revents&(unix.POLLPRI|unix.POLLERR) != 0 {
			now, err := mountinfo.GetMounts(nil)
			if err != nil {
				b.checkRoots()
			} else {
				for _, mp := range mountsChanged(infos, now) {
					b.checkRootsUnder(mp)
				}
				infos = now
			}
			b.checkMounts(ctx, now, err)
		}
	}
}

// noWriteback holds the statfs(2) f_type of filesystems that never hold
// data to write back: pseudo filesystems, memory-backed ones (tmpfs,
// ramfs: the data has no backing store) and read-only formats. A mount of
// one inside a tree needs nothing from flusherd.
var noWriteback = map[int64]string{
	unix.PROC_SUPER_MAGIC: "proc", unix.SYSFS_MAGIC: "sysfs", unix.CGROUP_SUPER_MAGIC: "cgroup",
	unix.CGROUP2_SUPER_MAGIC: "cgroup2", unix.DEVPTS_SUPER_MAGIC: "devpts", 0x19800202: "mqueue",
	unix.DEBUGFS_MAGIC: "debugfs", unix.TRACEFS_MAGIC: "tracefs", unix.SECURITYFS_MAGIC: "securityfs",
	unix.PSTOREFS_MAGIC: "pstore", unix.BPF_FS_MAGIC: "bpf", unix.AUTOFS_SUPER_MAGIC: "autofs",
	0x62656570: "configfs", 0x65735543: "fusectl", unix.HUGETLBFS_MAGIC: "hugetlbfs",
	unix.BINFMTFS_MAGIC: "binfmt_misc", unix.EFIVARFS_MAGIC: "efivarfs", unix.NSFS_MAGIC: "nsfs",
	unix.TMPFS_MAGIC: "tmpfs", unix.RAMFS_MAGIC: "ramfs", unix.SQUASHFS_MAGIC: "squashfs",
	unix.EROFS_SUPER_MAGIC_V1: "erofs", unix.ISOFS_SUPER_MAGIC: "iso9660", unix.CRAMFS_MAGIC: "cramfs",
}

// NoWriteback reports whether dir is on a filesystem whose data is never
// written back (noWriteback: tmpfs, ramfs, proc, sysfs, squashfs, ...),
// and its kind: a tree there is watched but has nothing to do. statfs(2)
// errors report false.
func NoWriteback(dir string) (fstype string, ok bool) {
	var sfs unix.Statfs_t
	if unix.Statfs(dir, &sfs) != nil {
		return "", false
	}
	fstype, ok = noWriteback[int64(sfs.Type)]
	return fstype, ok
}

// checkMounts finds the filesystems mounted inside a served recursive tree
// (a mount point below its root, in infos: /proc/self/mountinfo as parsed
// by moby/sys/mountinfo, or err) and hands each new mount, once per mount ID, to the
// backend's nested hook, which marks or watches it and scans it: a file
// written there is served as any other in the tree. A mount of a
// filesystem without writeback (noWriteback) is skipped, logged at info;
// an overlay mount is logged as not served (its dirty pages belong to
// the upper layer's inode, see config's overlay check). It is called at
// the start of watchMounts and whenever the mount table changes.
func (b *base) checkMounts(ctx context.Context, infos []*mountinfo.Info, err error) {
	if b.nested == nil {
		return
	}
	if err != nil {
		b.log.Warn("cannot read the mount table; filesystems mounted inside trees may not be served", zap.Error(err))
		return
	}
	present := make(map[int]bool, len(infos))
	devs := make(map[uint64]string, len(infos))
	for _, m := range infos {
		present[m.ID] = true
		devs[unix.Mkdev(uint32(m.Major), uint32(m.Minor))] = m.Mountpoint
	}
	b.forgetUnmounted(present, devs)
	for _, m := range infos {
		b.mu.Lock()
		in := b.idx.deepest(m.Mountpoint, func(t *watchedTree, self bool) bool { return !self && t.Recursive })
		b.mu.Unlock()
		if in == nil || !b.served(in) {
			continue
		}
		b.mountsMu.Lock()
		_, met := b.mountsMet[m.ID]
		if b.mountsMet == nil {
			b.mountsMet = map[int]*nestedMount{}
		}
		if !met {
			b.mountsMet[m.ID] = nil
		}
		b.mountsMu.Unlock()
		if met {
			continue
		}
		mp := logpath.String("mountpoint", m.Mountpoint)
		// Looked at through a descriptor: no symlink followed.
		mfd, err := inode.OpenPath(m.Mountpoint)
		if err != nil {
			continue // unmounted meanwhile, or its path is no longer a tree's
		}
		var sfs unix.Statfs_t
		var st unix.Stat_t
		err = unix.Fstatfs(mfd, &sfs)
		if err == nil {
			err = unix.Fstat(mfd, &st)
		}
		unix.Close(mfd)
		if err != nil {
			continue
		}
		if kind, ok := noWriteback[int64(sfs.Type)]; ok {
			b.log.Info("a filesystem without writeback is mounted inside a tree; nothing there to write back",
				mp, zap.String("fstype", kind), logpath.String("tree", in.Root))
			continue
		}
		if sfs.Type == unix.OVERLAYFS_SUPER_MAGIC {
			b.ctr.Unserved.Add(1)
			b.log.Warn("an overlayfs is mounted inside a tree; its writes are not served (an overlay file's dirty pages belong to its upper layer's inode): watch the upper layer's directory as a tree of its own",
				mp, logpath.String("tree", in.Root))
			continue
		}
		b.mu.Lock()
		delete(b.goneDevs, st.Dev) // mounted in a tree again: its files are reported
		b.mu.Unlock()
		if b.nested(ctx, in.Tree, m.Mountpoint) {
			b.mountsMu.Lock()
			b.mountsMet[m.ID] = &nestedMount{mountpoint: m.Mountpoint, dev: st.Dev}
			b.mountsMu.Unlock()
			b.ctr.Nested.Add(1)
			b.log.Info("a filesystem mounted inside a tree is served", mp, zap.String("fstype", m.FSType),
				logpath.String("tree", in.Root))
		} else {
			b.ctr.Unserved.Add(1)
		}
	}
}

// mountsChanged returns the mount points of the mounts in before or now
// but not in both (by mount ID and mount point: a mount moved is at
// both its mount points), each once.
func mountsChanged(before, now []*mountinfo.Info) []string {
	type mount struct {
		id int
		at string
	}
	was := make(map[mount]bool, len(before))
	for _, m := range before {
		was[mount{m.ID, m.Mountpoint}] = true
	}
	var out []string
	seen := map[string]bool{}
	add := func(mp string) {
		if !seen[mp] {
			seen[mp] = true
			out = append(out, mp)
		}
	}
	for _, m := range now {
		k := mount{m.ID, m.Mountpoint}
		if was[k] {
			delete(was, k)
			continue
		}
		add(m.Mountpoint)
	}
	for k := range was {
		add(k.at)
	}
	return out
}

// nestedMount is a served filesystem mounted inside a tree.
type nestedMount struct {
	mountpoint string
	dev        uint64 // st_dev of its root
}

// forgetUnmounted forgets the mounts seen inside trees that are no longer
// in the mount table (present, by mount ID: the kernel reuses IDs, so a
// later mount under a freed ID is new). The files of a served one whose
// filesystem is mounted nowhere now (devs: a mount point of each st_dev) are
// dropped from the lists: the unmount wrote them back (a lazy unmount
// writes them when the last file open on it is closed), and a retry could
// only fail with ENODEV, forever. Where its filesystem is still mounted
// (the mount was a bind mount of it, or one of several), an unmount wrote
// nothing: the files stay tracked and are written back, opened by handle
// through a mount that remains (registered with the opener, when it opens
// by handle: inode.Handles.AddMount).
func (b *base) forgetUnmounted(present map[int]bool, devs map[uint64]string) {
	var gone []*nestedMount
	b.mountsMu.Lock()
	for id, nm := range b.mountsMet {
		if present[id] {
			continue
		}
		delete(b.mountsMet, id)
		if nm != nil {
			gone = append(gone, nm)
		}
	}
	still := map[uint64]bool{}
	for _, nm := range b.mountsMet {
		if nm != nil {
			still[nm.dev] = true
		}
	}
	b.mountsMu.Unlock()
	mp := func(nm *nestedMount) zap.Field { return logpath.String("mountpoint", nm.mountpoint) }
	for _, nm := range gone {
		b.ctr.Nested.Add(^uint64(0))
		last := !still[nm.dev]
		for _, t := range b.list() {
			if t.rootKey().Dev == nm.dev {
				last = false
			}
		}
		if other, ok := devs[nm.dev]; ok {
			if b.handles != nil {
				if _, err := b.handles.AddMount(other); err != nil {
					b.log.Warn("cannot open a remaining mount of a filesystem unmounted inside a tree; its tracked files' writeback fails until it is mounted there again",
						mp(nm), logpath.String("other_mountpoint", other), zap.Error(err))
				}
			}
			b.log.Info("a filesystem mounted inside a tree was unmounted there; it is still mounted elsewhere, so nothing was written by the unmount: the files tracked there stay tracked and are written back",
				mp(nm), logpath.String("other_mountpoint", other))
			continue
		}
		b.log.Info("a filesystem mounted inside a tree was unmounted; its files are no longer tracked (the unmount wrote them back; a lazy unmount, umount -l, writes them once the last file open on it is closed)",
			mp(nm))
		if last {
			// Mounted nowhere in the trees now: a report of one of its
			// files still on its way (read before the unmount) is
			// dropped, not tracked for retries that could only fail.
			b.mu.Lock()
			if b.goneDevs == nil {
				b.goneDevs = map[uint64]bool{}
			}
			b.goneDevs[nm.dev] = true
			b.mu.Unlock()
			b.fence()
		}
		b.sink.TreeGone(nm.mountpoint, nm.dev, last, true)
	}
}
