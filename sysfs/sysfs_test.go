package sysfs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

func fixture(t *testing.T) FS {
	t.Helper()
	f, err := New("testdata/proc", "testdata/sys")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestNew(t *testing.T) {
	if _, err := New("testdata/nonexistent", "testdata/sys"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing root: err = %v, want fs.ErrNotExist", err)
	}
	if _, err := New("testdata/proc/vmstat", "testdata/sys"); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("file root: err = %v, want fs.ErrInvalid", err)
	}
	if _, err := New("", "testdata/sys"); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("empty root: err = %v, want fs.ErrInvalid", err)
	}
	if d := Default(); d.Proc != "/proc" || d.Sys != "/sys" {
		t.Errorf("Default() = %+v", d)
	}
}

func TestZeroValue(t *testing.T) {
	var z FS
	if _, err := z.VMStat(); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("VMStat: err = %v, want fs.ErrInvalid", err)
	}
	if _, err := z.KernelBdiStats("7:0"); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("KernelBdiStats: err = %v, want fs.ErrInvalid", err)
	}
	if _, err := z.BdiName(unix.Mkdev(8, 2), -1); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("BdiName: err = %v, want fs.ErrInvalid", err)
	}
	if z.HasBdi("8:0") {
		t.Error("HasBdi on zero FS = true")
	}
}

func TestBdiNameFixture(t *testing.T) {
	f := fixture(t)
	for _, tc := range []struct {
		maj, min uint32
		want     string
		has      bool
	}{
		{8, 2, "8:0", true},      // partition -> parent disk
		{8, 0, "8:0", true},      // whole disk
		{7, 0, "7:0", true},      // loop
		{253, 0, "253:0", true},  // device-mapper
		{0, 52, "0:52", true},    // NFS-like, registered
		{0, 40, "0:40", false},   // tmpfs-like, noop bdi
		{9, 127, "9:127", false}, // block major not in sysfs
	} {
		got, err := f.BdiName(unix.Mkdev(tc.maj, tc.min), -1)
		if err != nil {
			t.Errorf("BdiName(%d:%d): %v", tc.maj, tc.min, err)
			continue
		}
		if got != tc.want {
			t.Errorf("BdiName(%d:%d) = %q, want %q", tc.maj, tc.min, got, tc.want)
		}
		if h := f.HasBdi(got); h != tc.has {
			t.Errorf("HasBdi(%q) = %v, want %v", got, h, tc.has)
		}
	}
	for _, bad := range []string{"", ".", "..", "../bdi/8:0", "8:0/"} {
		if f.HasBdi(bad) {
			t.Errorf("HasBdi(%q) = true", bad)
		}
	}
}

func TestBdiNameFixtureErrors(t *testing.T) {
	f := FS{Proc: "testdata/proc", Sys: "testdata/badsys"}
	_, err := f.BdiName(unix.Mkdev(8, 17), -1)
	if !errors.Is(err, ErrFormat) {
		t.Errorf("bad parent dev: err = %v, want ErrFormat", err)
	}
	if _, err := f.BdiName(unix.Mkdev(8, 2), -1); err != nil {
		t.Errorf("absent device: %v", err)
	}
}

// TestBdiNameFdNonBtrfs checks that an fd on an ordinary filesystem leaves
// the st_dev rules in charge.
func TestBdiNameFdNonBtrfs(t *testing.T) {
	var st unix.Statfs_t
	fd, err := unix.Open("testdata", unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Fstatfs(fd, &st); err != nil {
		t.Fatal(err)
	}
	if uint32(st.Type) == unix.BTRFS_SUPER_MAGIC || uint32(st.Type) == unix.FUSE_SUPER_MAGIC {
		t.Skip("testdata is on btrfs/fuse")
	}
	got, err := fixture(t).BdiName(unix.Mkdev(8, 2), fd)
	if err != nil || got != "8:0" {
		t.Errorf("BdiName(8:2, fd) = %q, %v; want 8:0", got, err)
	}
	if _, err := fixture(t).BdiName(unix.Mkdev(8, 2), 1<<20); !errors.Is(err, unix.EBADF) {
		t.Errorf("bad fd: err = %v, want EBADF", err)
	}
}

func TestVMStatFixture(t *testing.T) {
	f := fixture(t)
	m, err := f.VMStat()
	if err != nil {
		t.Fatal(err)
	}
	if len(m) < 50 {
		t.Errorf("VMStat: only %d entries", len(m))
	}
	if _, ok := m["nr_dirty"]; !ok {
		t.Error("VMStat: no nr_dirty")
	}
	d, b, err := f.DirtyThresholds()
	if err != nil {
		t.Fatal(err)
	}
	if d != 1220896 || b != 609702 {
		t.Errorf("DirtyThresholds = %d, %d; want 1220896, 609702", d, b)
	}
	if m["nr_dirty_threshold"] != d {
		t.Error("VMStat and DirtyThresholds disagree")
	}
}

func TestVMStatErrors(t *testing.T) {
	if _, err := (FS{Proc: "testdata/badproc", Sys: "testdata/sys"}).VMStat(); !errors.Is(err, ErrFormat) {
		t.Errorf("bad vmstat: err = %v, want ErrFormat", err)
	}
	if _, _, err := (FS{Proc: "testdata/noproc", Sys: "testdata/sys"}).DirtyThresholds(); !errors.Is(err, ErrFormat) {
		t.Errorf("vmstat without thresholds: err = %v, want ErrFormat", err)
	}
	if _, _, err := (FS{Proc: "testdata/missing", Sys: "testdata/sys"}).DirtyThresholds(); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing vmstat: err = %v, want fs.ErrNotExist", err)
	}
}

// kernelStatKeys is the order of bdi_debug_stats_show (mm/backing-dev.c).
var kernelStatKeys = []string{
	"BdiWriteback", "BdiReclaimable", "BdiDirtyThresh", "DirtyThresh",
	"BackgroundThresh", "BdiDirtied", "BdiWritten", "BdiWriteBandwidth",
	"b_dirty", "b_io", "b_more_io", "b_dirty_time", "bdi_list", "state",
}

func statKeys(s []StatLine) []string {
	var k []string
	for _, l := range s {
		k = append(k, l.Key)
	}
	return k
}

func TestKernelBdiStatsFixture(t *testing.T) {
	f := fixture(t)
	got, err := f.KernelBdiStats("8:0")
	if err != nil {
		t.Fatal(err)
	}
	want := []StatLine{
		{"BdiWriteback", 0, "kB"},
		{"BdiReclaimable", 6588, "kB"},
		{"BdiDirtyThresh", 4883584, "kB"},
		{"DirtyThresh", 4883584, "kB"},
		{"BackgroundThresh", 2438808, "kB"},
		{"BdiDirtied", 454228, "kB"},
		{"BdiWritten", 283376, "kB"},
		{"BdiWriteBandwidth", 8204, "kBps"},
		{"b_dirty", 962, ""},
		{"b_io", 0, ""},
		{"b_more_io", 0, ""},
		{"b_dirty_time", 0, ""},
		{"bdi_list", 1, ""},
		{"state", 5, ""},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("KernelBdiStats(8:0) =\n%v\nwant\n%v", got, want)
	}
	if _, err := f.KernelBdiStats("7:0"); err != nil {
		t.Error(err)
	}
}

func TestKernelBdiStatsHex(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "kernel", "debug", "bdi", "x")
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p, "stats"), []byte("b_io:  10\nstate:  1f\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := (FS{Proc: dir, Sys: dir}).KernelBdiStats("x")
	if err != nil {
		t.Fatal(err)
	}
	want := []StatLine{{"b_io", 10, ""}, {"state", 0x1f, ""}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestKernelBdiStatsErrors(t *testing.T) {
	f := fixture(t)
	if _, err := f.KernelBdiStats("9:9"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing bdi: err = %v, want fs.ErrNotExist", err)
	}
	if _, err := (FS{Proc: "testdata/proc", Sys: "testdata/proc"}).KernelBdiStats("8:0"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing debugfs: err = %v, want fs.ErrNotExist", err)
	}
	for _, bad := range []string{"", "..", "a/b"} {
		if _, err := f.KernelBdiStats(bad); !errors.Is(err, fs.ErrInvalid) {
			t.Errorf("KernelBdiStats(%q): err = %v, want fs.ErrInvalid", bad, err)
		}
	}
	if _, err := (FS{Proc: "testdata/proc", Sys: "testdata/badsys"}).KernelBdiStats("8:16"); !errors.Is(err, ErrFormat) {
		t.Errorf("bad stats: err = %v, want ErrFormat", err)
	}
}

func TestFormatUUID(t *testing.T) {
	u := [16]byte{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10}
	if got, want := formatUUID(u), "01234567-89ab-cdef-fedc-ba9876543210"; got != want {
		t.Errorf("formatUUID = %q, want %q", got, want)
	}
}

func TestBtrfsIoctlNumber(t *testing.T) {
	// BTRFS_IOC_FS_INFO as defined in include/uapi/linux/btrfs.h (asm-generic).
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		t.Skip("encoding checked on amd64/arm64 only")
	}
	if btrfsIocFSInfo != 0x8400941f {
		t.Errorf("btrfsIocFSInfo = %#x", btrfsIocFSInfo)
	}
	var a btrfsFSInfoArgs
	if s := reflect.TypeOf(a).Size(); s != 1024 {
		t.Errorf("sizeof(btrfsFSInfoArgs) = %d", s)
	}
	if o := reflect.TypeOf(a).Field(2).Offset; o != 16 {
		t.Errorf("fsid offset = %d", o)
	}
}

func TestPageSize(t *testing.T) {
	if p := PageSize(); p < 4096 || p&(p-1) != 0 {
		t.Errorf("PageSize() = %d", p)
	}
}
