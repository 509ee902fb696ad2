package testfs

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/internal/testwait"
)

func TestExt4(t *testing.T) { testType(t, "ext4", unix.EXT4_SUPER_MAGIC) }
func TestXFS(t *testing.T)  { testType(t, "xfs", unix.XFS_SUPER_MAGIC) }

func testType(t *testing.T, typ string, magic int64) {
	for _, dio := range []bool{false, true} {
		var fs *FS
		name := fmt.Sprintf("dio=%v", dio)
		t.Run(name, func(t *testing.T) {
			fs = Mount(t, Options{Type: typ, DirectIO: dio})
			checkMounted(t, fs, magic)
			want := map[bool]string{false: "0", true: "1"}[dio]
			if got := sysLoop(t, fs.Device, "dio"); got != want {
				t.Errorf("%s dio = %q, want %s", fs.Device, got, want)
			}

			p := filepath.Join(fs.Dir, "hello")
			if err := os.WriteFile(p, []byte("hello\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			fs.RemountRO(t)
			err := os.WriteFile(filepath.Join(fs.Dir, "nope"), nil, 0o644)
			if !errors.Is(err, unix.EROFS) {
				t.Errorf("create on read-only remount: got %v, want EROFS", err)
			}
			fs.RemountRW(t)
			if err := os.WriteFile(p, []byte("again\n"), 0o644); err != nil {
				t.Fatalf("write after remount,rw: %v", err)
			}
			if dio {
				fs.DropCaches(t)
				b, err := os.ReadFile(p)
				if err != nil || string(b) != "again\n" {
					t.Fatalf("read after drop caches: %q, %v", b, err)
				}
			}
		})
		if fs == nil {
			continue // skipped
		}
		checkGone(t, fs)
	}
}

// recTB records Errorf calls instead of failing the test.
type recTB struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
	r.TB.Logf("(recorded) "+format, args...)
}

// TestAllocated: an Allocated image has every block allocated in the
// host filesystem after mkfs (nothing discarded); a default one is sparse.
func TestAllocated(t *testing.T) {
	const sizeMB = 64
	for _, alloc := range []bool{false, true} {
		t.Run(fmt.Sprintf("allocated=%v", alloc), func(t *testing.T) {
			fs := Mount(t, Options{SizeMB: sizeMB, Allocated: alloc, DirectIO: true})
			checkMounted(t, fs, unix.EXT4_SUPER_MAGIC)
			var st unix.Stat_t
			if err := unix.Stat(fs.Image, &st); err != nil {
				t.Fatal(err)
			}
			used := st.Blocks * 512
			if full := used >= sizeMB<<20; full != alloc {
				t.Errorf("image %s: %d of %d MiB allocated, want all allocated: %v", fs.Image, used>>20, sizeMB, alloc)
			}
		})
	}
	if fs, err := New(Options{Type: "xfs", Allocated: true}); err == nil {
		fs.Close()
		t.Error("Allocated with xfs: no error")
	}
}

// A test that leaves a file open: cleanup must retry, fall back to a lazy
// umount, say so, and the loop device must go away once the file is closed.
func TestBusyAtCleanup(t *testing.T) {
	var fs *FS
	var f *os.File
	rec := &recTB{}
	t.Run("inner", func(t *testing.T) {
		rec.TB = t
		fs = Mount(rec, Options{})
		var err error
		f, err = os.Create(filepath.Join(fs.Dir, "held-open"))
		if err != nil {
			t.Fatal(err)
		}
	})
	if fs == nil {
		return
	}
	defer f.Close()
	if len(rec.errs) == 0 || !strings.Contains(strings.Join(rec.errs, "\n"), "lazy umount") {
		t.Errorf("cleanup did not report the lazy umount; errors: %q", rec.errs)
	}
	if isMounted(t, fs.Dir) {
		t.Errorf("%s still mounted after lazy umount", fs.Dir)
	}
	if bf, err := backingFile(fs.Device); err != nil || bf != fs.Image {
		t.Errorf("%s: backing file %q (err %v); expected it still held (autoclear pending) while a file is open", fs.Device, bf, err)
	}
	if _, err := f.WriteString("still works\n"); err != nil {
		t.Errorf("write to file on lazily unmounted fs: %v", err)
	}
	f.Close()
	// The last reference to the detached mount is gone; the superblock is
	// released and the autoclear loop device detaches. Both may be slightly
	// asynchronous, so poll.
	waitDetached(t, fs)
}

func TestParallel(t *testing.T) {
	// Parallel tests must each get their own device; checkMounted verifies
	// that the device it got is backed by its own image. Also use more
	// devices than the 8 that usually pre-exist, all at the same time.
	var mu sync.Mutex
	var all []*FS
	t.Run("group", func(t *testing.T) {
		for i := range 6 {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				for range 2 {
					fs := Mount(t, Options{SizeMB: 32})
					checkMounted(t, fs, unix.EXT4_SUPER_MAGIC)
					mu.Lock()
					all = append(all, fs)
					mu.Unlock()
				}
			})
		}
	})
	t.Run("many", func(t *testing.T) {
		var devs []string
		for range 10 {
			fs := Mount(t, Options{SizeMB: 32})
			checkMounted(t, fs, unix.EXT4_SUPER_MAGIC)
			devs = append(devs, fs.Device)
			mu.Lock()
			all = append(all, fs)
			mu.Unlock()
		}
		t.Logf("devices: %v", devs)
	})
	for _, fs := range all {
		checkGone(t, fs)
	}
}

func checkMounted(t *testing.T, fs *FS, magic int64) {
	t.Helper()
	if got := sysLoop(t, fs.Device, "autoclear"); got != "1" {
		t.Errorf("%s autoclear = %q, want 1", fs.Device, got)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(fs.Dir, &sfs); err != nil {
		t.Fatal(err)
	}
	if int64(sfs.Type) != magic {
		t.Errorf("statfs(%s).Type = %#x, want %#x", fs.Dir, sfs.Type, magic)
	}
	if _, err := os.Stat(filepath.Join("/sys/class/bdi", fs.MajMin)); err != nil {
		t.Errorf("bdi for %s: %v", fs.MajMin, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(fs.Dir, &st); err != nil {
		t.Fatal(err)
	}
	if uint64(st.Dev) != fs.Dev || fs.MajMin != fmt.Sprintf("%d:%d", unix.Major(fs.Dev), unix.Minor(fs.Dev)) {
		t.Errorf("Dev=%d MajMin=%s, stat says %d", fs.Dev, fs.MajMin, st.Dev)
	}
	if !isMounted(t, fs.Dir) {
		t.Errorf("%s not in mountinfo", fs.Dir)
	}
	if devs := losetupJ(t, fs.Image); len(devs) != 1 || devs[0] != fs.Device {
		t.Errorf("losetup -j %s = %q, want [%s]", fs.Image, devs, fs.Device)
	}
}

func checkGone(t *testing.T, fs *FS) {
	t.Helper()
	if isMounted(t, fs.Dir) {
		t.Errorf("%s still mounted after cleanup", fs.Dir)
	}
	if bf, err := backingFile(fs.Device); err == nil && bf == fs.Image {
		t.Errorf("%s still backed by %s after cleanup", fs.Device, fs.Image)
	}
	if devs := losetupJ(t, fs.Image); len(devs) != 0 {
		t.Errorf("losetup -j %s after cleanup = %q, want none", fs.Image, devs)
	}
	if _, err := os.Stat(fs.Image); err == nil {
		// TempDir removal runs after our cleanup; the image should be gone.
		t.Errorf("image %s still exists", fs.Image)
	}
}

func waitDetached(t *testing.T, fs *FS) {
	t.Helper()
	if !testwait.Poll(2*time.Second, func() bool { return !fs.Attached() }) {
		t.Errorf("%s still backed by %s", fs.Device, fs.Image)
	}
}

// isMounted reports whether dir is a mount point in /proc/self/mountinfo.
func isMounted(t *testing.T, dir string) bool {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMountinfo(fields[4]) == dir {
			return true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return false
}

// unescapeMountinfo undoes the octal escaping (\040 etc.) used in mountinfo.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func losetupJ(t *testing.T, image string) []string {
	t.Helper()
	out, err := exec.Command("losetup", "-n", "-O", "NAME", "-j", image).Output()
	if err != nil {
		t.Fatalf("losetup -j: %v", err)
	}
	return strings.Fields(string(out))
}

func sysLoop(t *testing.T, dev, attr string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(sysLoopDir(dev), attr))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// Unmount before the end of the test: a busy filesystem stays mounted and
// Unmount says why; once free it unmounts, a second call fails, the loop
// device detaches by itself (autoclear), and cleanup has nothing left to do
// and reports no error.
func TestUnmount(t *testing.T) {
	var fs *FS
	rec := &recTB{}
	t.Run("inner", func(t *testing.T) {
		rec.TB = t
		fs = Mount(rec, Options{SizeMB: 32})
		f, err := os.Create(filepath.Join(fs.Dir, "held-open"))
		if err != nil {
			t.Fatal(err)
		}
		if err := fs.Unmount(); !errors.Is(err, unix.EBUSY) {
			t.Errorf("Unmount with a file open: got %v, want EBUSY", err)
		}
		if !isMounted(t, fs.Dir) {
			t.Fatalf("%s not mounted after a failed Unmount", fs.Dir)
		}
		f.Close()
		if err := fs.Unmount(); err != nil {
			t.Fatalf("Unmount: %v", err)
		}
		if isMounted(t, fs.Dir) {
			t.Errorf("%s still mounted after Unmount", fs.Dir)
		}
		if err := fs.Unmount(); err == nil {
			t.Errorf("second Unmount: got nil, want an error")
		}
		waitDetached(t, fs)
	})
	if fs == nil {
		return // skipped
	}
	if len(rec.errs) != 0 {
		t.Errorf("cleanup after Unmount reported errors: %q", rec.errs)
	}
	checkGone(t, fs)
}

// TestNew: New, for programs that are not tests, makes the same mounted
// filesystem (with the extra mkfs arguments and mount data asked for),
// and Close takes down exactly what it made: the mount, the loop device,
// the image and its temporary directory. A failure leaves nothing behind.
func TestNew(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		Missing(t, "mkfs.ext4: %v", err)
	}
	imgDir := t.TempDir()
	fs, err := New(Options{Type: "ext4", SizeMB: 64, ImageDir: imgDir, MkfsArgs: []string{"-N", "5000"}, Data: "barrier=0"})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	checkMounted(t, fs, unix.EXT4_SUPER_MAGIC)
	if filepath.Dir(fs.Image) != imgDir {
		t.Errorf("image %s not in ImageDir %s", fs.Image, imgDir)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(fs.Dir, &sfs); err != nil {
		t.Fatal(err)
	}
	if sfs.Files < 4096 || sfs.Files > 8192 {
		t.Errorf("%d inodes, want about the 5000 asked of mkfs", sfs.Files)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, " "+fs.Dir+" ") && !strings.Contains(l, "barrier=0") && !strings.Contains(l, "nobarrier") {
			t.Errorf("mount data not applied: %s", l)
		}
	}
	mnt := filepath.Dir(fs.Dir)
	if err := fs.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	waitDetached(t, fs)
	checkGone(t, fs)
	if _, err := os.Stat(mnt); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary directory %s: %v, want removed", mnt, err)
	}
	if err := fs.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	// A failure: an unknown filesystem type is an error, and nothing is
	// left in ImageDir.
	if fs, err := New(Options{Type: "nosuchfs", ImageDir: imgDir}); err == nil || fs != nil {
		t.Errorf("New of an unknown type = %v, %v; want an error", fs, err)
	}
	if left, _ := os.ReadDir(imgDir); len(left) != 0 {
		t.Errorf("left in ImageDir: %v", left)
	}
}
