package sysfs

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
)

// Tests in this file run against the live kernel and need root; they create
// loop devices and mounts below t.TempDir() and undo exactly what they made.

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

// debugfs is the mount of /sys/kernel/debug that requireDebugfs made, if
// any, and how many running tests use it.
var debugfs struct {
	sync.Mutex
	users   int
	mounted bool
}

// requireDebugfs makes sure /sys/kernel/debug/bdi is there (the kernel's
// own bdi stats, which these tests compare with): it mounts debugfs if it
// is not mounted, and unmounts it when the last test that needed the mount
// ends. It fails under CI when debugfs cannot be had (testfs.Missing).
func requireDebugfs(t *testing.T) {
	t.Helper()
	debugfs.Lock()
	defer debugfs.Unlock()
	if _, err := os.Stat("/sys/kernel/debug/bdi"); err == nil {
		if debugfs.mounted {
			debugfs.users++
			t.Cleanup(releaseDebugfs)
		}
		return
	}
	if err := unix.Mount("debugfs", "/sys/kernel/debug", "debugfs", 0, ""); err != nil {
		testfs.Missing(t, "debugfs: mount -t debugfs none /sys/kernel/debug: %v", err)
	}
	if _, err := os.Stat("/sys/kernel/debug/bdi"); err != nil {
		unix.Unmount("/sys/kernel/debug", 0)
		testfs.Missing(t, "debugfs has no bdi directory: %v", err)
	}
	debugfs.mounted, debugfs.users = true, 1
	t.Cleanup(releaseDebugfs)
}

func releaseDebugfs() {
	debugfs.Lock()
	defer debugfs.Unlock()
	if debugfs.users--; debugfs.users == 0 && debugfs.mounted {
		unix.Unmount("/sys/kernel/debug", 0)
		debugfs.mounted = false
	}
}

func requireTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		testfs.Missing(t, "%s not available", name)
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// cleanupRun registers a command to run at cleanup, reporting failure.
func cleanupRun(t *testing.T, name string, args ...string) {
	t.Helper()
	t.Cleanup(func() {
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Errorf("cleanup: %s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	})
}

// image creates a sparse file of size bytes in a fresh temporary directory.
func image(t *testing.T, size int64) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return img
}

// losetup attaches img to a free loop device and detaches it at cleanup.
func losetup(t *testing.T, img string, extra ...string) string {
	t.Helper()
	requireTool(t, "losetup")
	testfs.HoldMounts(t) // released after the detach below
	dev := run(t, "losetup", append(append([]string{}, extra...), "--find", "--show", img)...)
	cleanupRun(t, "losetup", "-d", dev)
	return dev
}

// mount mounts dev on a fresh temporary directory and unmounts it at cleanup.
func mount(t *testing.T, dev string) string {
	t.Helper()
	dir := t.TempDir()
	run(t, "mount", dev, dir)
	cleanupRun(t, "umount", dir)
	return dir
}

// openPath opens p with flags and closes it at cleanup (before the umount
// registered earlier).
func openPath(t *testing.T, p string, flags int) int {
	t.Helper()
	fd, err := unix.Open(p, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open %s: %v", p, err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func statDev(t *testing.T, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Dev
}

func rdev(t *testing.T, p string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return devName(st.Rdev)
}

// bdiName calls BdiName on path p with an O_PATH fd and checks that it
// matches the call with a readable fd.
func bdiName(t *testing.T, p string) string {
	t.Helper()
	dev := statDev(t, p)
	name, err := Default().BdiName(dev, openPath(t, p, unix.O_PATH))
	if err != nil {
		t.Fatalf("BdiName(%s, O_PATH fd): %v", devName(dev), err)
	}
	name2, err := Default().BdiName(dev, openPath(t, p, unix.O_RDONLY))
	if err != nil || name2 != name {
		t.Fatalf("BdiName(%s, O_RDONLY fd) = %q, %v; O_PATH gave %q", devName(dev), name2, err, name)
	}
	return name
}

// checkDirtyLands writes a file in dir without syncing and checks that the
// kernel's stats for bdi show a dirty inode: proof that the name is the bdi
// the kernel really uses for that filesystem.
func checkDirtyLands(t *testing.T, dir, bdi string) {
	t.Helper()
	fd := openPath(t, dir, unix.O_RDONLY|unix.O_DIRECTORY)
	if err := unix.Syncfs(fd); err != nil {
		t.Fatal(err)
	}
	requireDebugfs(t)
	before, err := Default().KernelBdiStats(bdi)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "dirty"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	after, err := Default().KernelBdiStats(bdi)
	if err != nil {
		t.Fatal(err)
	}
	get := func(s []StatLine, k string) uint64 {
		for _, l := range s {
			if l.Key == k {
				return l.Value
			}
		}
		t.Fatalf("no %s in stats of %s", k, bdi)
		return 0
	}
	lists := func(s []StatLine) uint64 { return get(s, "b_dirty") + get(s, "b_io") + get(s, "b_more_io") }
	t.Logf("%s: b_dirty+b_io+b_more_io %d -> %d, BdiDirtied %d -> %d kB", bdi,
		lists(before), lists(after), get(before, "BdiDirtied"), get(after, "BdiDirtied"))
	// The kernel sums BdiDirtied from per-CPU counters that are folded in
	// batches, so a reading can lag the 1024 kB written by up to a batch
	// per CPU; half of it still tells the right bdi from a wrong one.
	if get(after, "BdiDirtied") < get(before, "BdiDirtied")+512 {
		t.Errorf("writing 1 MiB on %s did not raise BdiDirtied of bdi %s", dir, bdi)
	}
	if lists(after) == 0 {
		t.Errorf("no dirty inode on bdi %s after writing a file on %s", bdi, dir)
	}
}

// checkStatKeys checks that stats contains the keys of bdi_debug_stats_show
// in the kernel's order, BdiWriteback first and state last.
func checkStatKeys(t *testing.T, stats []StatLine) {
	t.Helper()
	keys := statKeys(stats)
	if len(keys) == 0 || keys[0] != "BdiWriteback" || keys[len(keys)-1] != "state" {
		t.Errorf("keys = %v; want BdiWriteback first, state last", keys)
	}
	i := 0
	for _, k := range keys {
		if i < len(kernelStatKeys) && k == kernelStatKeys[i] {
			i++
		}
	}
	if i != len(kernelStatKeys) {
		t.Errorf("keys = %v; want %v in that order", keys, kernelStatKeys)
	}
	for _, l := range stats {
		want := ""
		switch {
		case l.Key == "BdiWriteBandwidth":
			want = "kBps"
		case strings.HasPrefix(l.Key, "Bdi") || strings.HasSuffix(l.Key, "Thresh"):
			want = "kB"
		}
		if l.Unit != want {
			t.Errorf("%s: unit %q, want %q", l.Key, l.Unit, want)
		}
	}
}

func TestRealRoot(t *testing.T) {
	requireRoot(t)
	f := Default()
	name := bdiName(t, "/")
	dev := statDev(t, "/")
	t.Logf("/: st_dev %s -> bdi %q (HasBdi %v)", devName(dev), name, f.HasBdi(name))
	if unix.Major(dev) == 0 {
		return // overlay/tmpfs root in a container: nothing to compare
	}
	if !f.HasBdi(name) {
		ents, _ := os.ReadDir("/sys/class/bdi")
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("bdi %q of / not in /sys/class/bdi %v", name, names)
	}
	// Independent check: a disk's sysfs directory links to its bdi.
	disk := filepath.Join("/sys/dev/block", devName(dev))
	if _, err := os.Stat(filepath.Join(disk, "partition")); err == nil {
		disk = filepath.Join(disk, "..")
	}
	if target, err := os.Readlink(filepath.Join(disk, "bdi")); err == nil && filepath.Base(target) != name {
		t.Errorf("%s/bdi -> %s, BdiName gave %q", disk, target, name)
	}
	d, b, err := f.DirtyThresholds()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("dirty thresholds: %d / %d pages of %d bytes", d, b, PageSize())
	if d == 0 || b == 0 || b > d {
		t.Errorf("implausible thresholds dirty=%d background=%d", d, b)
	}
}

func TestRealLoopExt4(t *testing.T) {
	requireRoot(t)
	requireTool(t, "mkfs.ext4")
	img := image(t, 64<<20)
	run(t, "mkfs.ext4", "-q", "-F", img)
	loop := losetup(t, img)
	mnt := mount(t, loop)

	name := bdiName(t, mnt)
	want := rdev(t, loop)
	t.Logf("%s on %s: bdi %q", loop, mnt, name)
	if !strings.HasPrefix(want, "7:") {
		t.Logf("loop device %s is %s, not major 7", loop, want)
	}
	if name != want {
		t.Errorf("BdiName = %q, want %q", name, want)
	}
	if !Default().HasBdi(name) {
		t.Errorf("HasBdi(%q) = false", name)
	}
	requireDebugfs(t)
	stats, err := Default().KernelBdiStats(name)
	if err != nil {
		t.Fatal(err)
	}
	checkStatKeys(t, stats)
	checkDirtyLands(t, mnt, name)
}

// writeMBR writes a DOS partition table with one Linux partition from
// sector 2048 to the end of img.
func writeMBR(t *testing.T, img string, size int64) {
	t.Helper()
	var mbr [512]byte
	e := mbr[446:462]
	e[0] = 0x00                                  // not bootable
	copy(e[1:4], []byte{0xfe, 0xff, 0xff})       // CHS first: use LBA
	e[4] = 0x83                                  // Linux
	copy(e[5:8], []byte{0xfe, 0xff, 0xff})       // CHS last: use LBA
	binary.LittleEndian.PutUint32(e[8:12], 2048) // first LBA
	binary.LittleEndian.PutUint32(e[12:16], uint32(size/512-2048))
	mbr[510], mbr[511] = 0x55, 0xaa
	f, err := os.OpenFile(img, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(mbr[:], 0); err != nil {
		t.Fatal(err)
	}
}

func waitFor(p string, d time.Duration) bool {
	return testwait.Poll(d, func() bool { _, err := os.Stat(p); return err == nil })
}

func TestRealLoopPartition(t *testing.T) {
	requireRoot(t)
	requireTool(t, "mkfs.ext4")
	const size = 64 << 20
	img := image(t, size)
	writeMBR(t, img, size)
	loop := losetup(t, img, "-P")
	part := loop + "p1"
	if !waitFor(part, time.Second) {
		// The kernel may lack the msdos partition parser
		// (CONFIG_MSDOS_PARTITION); BLKPG_ADD_PARTITION needs none.
		requireTool(t, "addpart")
		t.Logf("kernel did not scan the partition table of %s; using addpart", loop)
		run(t, "addpart", loop, "1", "2048", fmt.Sprint(size/512-2048))
		cleanupRun(t, "delpart", loop, "1")
		if !waitFor(part, 5*time.Second) {
			t.Fatalf("%s did not appear", part)
		}
	}
	run(t, "mkfs.ext4", "-q", "-F", part)
	mnt := mount(t, part)

	partDev, diskDev := statDev(t, mnt), rdev(t, loop)
	if devName(partDev) != rdev(t, part) {
		t.Fatalf("st_dev of %s is %s, %s is %s", mnt, devName(partDev), part, rdev(t, part))
	}
	if _, err := os.Stat(fmt.Sprintf("/sys/dev/block/%s/partition", devName(partDev))); err != nil {
		t.Fatalf("sysfs of %s lacks partition: %v", part, err)
	}
	name := bdiName(t, mnt)
	t.Logf("%s (%s) on %s: bdi %q; disk %s is %s", part, devName(partDev), mnt, name, loop, diskDev)
	if name != diskDev {
		t.Errorf("BdiName = %q, want the disk's %q", name, diskDev)
	}
	if Default().HasBdi(devName(partDev)) {
		t.Errorf("kernel lists a bdi for partition %s", devName(partDev))
	}
	if !Default().HasBdi(name) {
		t.Errorf("HasBdi(%q) = false", name)
	}
	checkDirtyLands(t, mnt, name)
}

func TestRealBtrfs(t *testing.T) {
	requireRoot(t)
	requireTool(t, "mkfs.btrfs")
	requireTool(t, "btrfs")
	var u [16]byte
	if _, err := rand.Read(u[:]); err != nil {
		t.Fatal(err)
	}
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	fsid := formatUUID(u)
	img := image(t, 256<<20)
	run(t, "mkfs.btrfs", "-q", "-f", "-U", fsid, img)
	loop := losetup(t, img)
	mnt := mount(t, loop)
	sub := filepath.Join(mnt, "sub")
	run(t, "btrfs", "subvolume", "create", sub)
	// The subvolume is removed with the filesystem image.

	rootDev, subDev := statDev(t, mnt), statDev(t, sub)
	if rootDev == subDev {
		t.Fatalf("subvolume has the same st_dev %s as the top", devName(rootDev))
	}
	target, err := os.Readlink(filepath.Join("/sys/fs/btrfs", fsid, "bdi"))
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Base(target)

	top, inSub := bdiName(t, mnt), bdiName(t, sub)
	t.Logf("btrfs %s on %s: st_dev %s and %s (sub) -> bdi %q and %q; /sys/fs/btrfs/%s/bdi -> %s",
		fsid, loop, devName(rootDev), devName(subDev), top, inSub, fsid, target)
	if top != want || inSub != want {
		t.Errorf("BdiName = %q (top), %q (subvolume); want %q", top, inSub, want)
	}
	if !strings.HasPrefix(want, "btrfs-") {
		t.Errorf("btrfs bdi is %q, expected btrfs-N", want)
	}
	if !Default().HasBdi(want) {
		t.Errorf("HasBdi(%q) = false", want)
	}

	// A fifo in the subvolume, held by an O_PATH fd: ioctl cannot go through
	// it, so BdiName must use the parent directory.
	fifo := filepath.Join(sub, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Default().BdiName(statDev(t, fifo), openPath(t, fifo, unix.O_PATH))
	if err != nil || got != want {
		t.Errorf("BdiName(fifo) = %q, %v; want %q", got, err, want)
	}

	// Without an fd, btrfs cannot be recognised: documented fallback.
	if got, err := Default().BdiName(subDev, -1); err != nil || got != devName(subDev) {
		t.Errorf("BdiName(%s, -1) = %q, %v; want %q", devName(subDev), got, err, devName(subDev))
	}
	checkDirtyLands(t, sub, want)
}
