package testfs

import (
	"bufio"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Marked is an inode that an inotify watch or a fanotify inode mark is
// on: the filesystem's device in the kernel's dev_t encoding (KernelDev)
// and the inode number.
type Marked struct{ Dev, Ino uint64 }

// MarkedInodes returns the inodes that process pid's inotify and fanotify
// instances hold a watch or an inode mark on, from the "ino:" and "sdev:"
// fields of /proc/<pid>/fdinfo, each with the instance's kind
// ("anon_inode:inotify" or "anon_inode:[fanotify]"). Filesystem and mount
// marks name no inode and are not listed.
func MarkedInodes(pid int) (map[Marked]string, error) {
	dir := "/proc/" + strconv.Itoa(pid)
	fds, err := os.ReadDir(dir + "/fd")
	if err != nil {
		return nil, err
	}
	marks := map[Marked]string{}
	for _, e := range fds {
		link, err := os.Readlink(dir + "/fd/" + e.Name())
		if err != nil || link != "anon_inode:inotify" && link != "anon_inode:[fanotify]" {
			continue
		}
		f, err := os.Open(dir + "/fdinfo/" + e.Name())
		if err != nil {
			continue // closed meanwhile
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var m Marked
			okIno, okDev := false, false
			for field := range strings.FieldsSeq(sc.Text()) {
				if v, ok := strings.CutPrefix(field, "ino:"); ok {
					m.Ino, err = strconv.ParseUint(v, 16, 64)
					okIno = err == nil
				}
				if v, ok := strings.CutPrefix(field, "sdev:"); ok {
					m.Dev, err = strconv.ParseUint(v, 16, 64)
					okDev = err == nil
				}
			}
			if okIno && okDev {
				marks[m] = link
			}
		}
		f.Close()
	}
	return marks, nil
}

// KernelDev is st_dev in the kernel's dev_t encoding (major<<20 | minor),
// as fdinfo shows it.
func KernelDev(dev uint64) uint64 { return uint64(unix.Major(dev))<<20 | uint64(unix.Minor(dev)) }
