package service

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/internal/logpath"
)

// ClaimStatsDir makes dir if needed, refuses it unless only this user can
// write in it (not a symlink), and locks it (flock <dir>/flusherd.lock):
// a second daemon fails at once. A killed daemon's temporary files are
// removed. Each refusal says what to do; unlock releases the lock.
func ClaimStatsDir(dir string, log *zap.Logger) (unlock func(), err error) {
	unlock, err = claimStatsDir(dir)
	if err != nil {
		return nil, err
	}
	if n, err := bdi.RemoveStaleTemps(dir); err != nil {
		log.Warn("cannot remove the temporary files a killed flusherd left in stats.dir", logpath.String("dir", dir), zap.Error(err))
	} else if n > 0 {
		log.Info("removed temporary stats files that a killed flusherd left", logpath.String("dir", dir), zap.Int("files", n))
	}
	return unlock, nil
}

// claimStatsDir is ClaimStatsDir without the clean-up.
func claimStatsDir(dir string) (unlock func(), err error) {
	// elsewhere is what every refusal below suggests.
	const elsewhere = "choose another directory with --stats-dir or stats.dir"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		if errors.Is(err, unix.EROFS) && (os.Geteuid() == 0 || UnderSystemd()) {
			// As root, a read-only directory is the sandbox's doing
			// (ProtectSystem=strict), or a read-only filesystem.
			return nil, fmt.Errorf("stats.dir: %w (the shipped flusherd.service lets flusherd write only in /run/flusherd: "+
				"keep the default, or add ReadWritePaths=%s in a drop-in, /etc/systemd/system/flusherd.service.d/*.conf; "+
				"outside systemd, %s on a writable filesystem)", err, dir, elsewhere)
		}
		if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EROFS) {
			return nil, fmt.Errorf("stats.dir: %w (run as root, or %s, one this user may write)", err, elsewhere)
		}
		return nil, fmt.Errorf("stats.dir: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return nil, fmt.Errorf("stats.dir: %w", &os.PathError{Op: "lstat", Path: dir, Err: err})
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return nil, fmt.Errorf("stats.dir %s is not a directory (a symlink is not accepted): %s", strconv.Quote(dir), elsewhere)
	case int(st.Uid) != os.Geteuid():
		return nil, fmt.Errorf("stats.dir %s belongs to uid %d, not to this user (uid %d): refusing to write there; chown it, or %s",
			strconv.Quote(dir), st.Uid, os.Geteuid(), elsewhere)
	case st.Mode&0o022 != 0:
		return nil, fmt.Errorf("stats.dir %s is writable by group or others (mode %#o): refusing to write there; chmod go-w it, or %s",
			strconv.Quote(dir), st.Mode&0o7777, elsewhere)
	}
	lock := filepath.Join(dir, "flusherd.lock")
	fd, err := unix.Open(lock, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("stats.dir: %w", &os.PathError{Op: "open", Path: lock, Err: err})
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("another flusherd runs with stats.dir %s (it holds %s)", strconv.Quote(dir), lock)
		}
		return nil, fmt.Errorf("stats.dir: flock %s: %w", lock, err)
	}
	return func() { unix.Close(fd) }, nil
}
