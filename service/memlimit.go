package service

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"runtime/debug"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"flusherd/bdi"
	"flusherd/config"
)

// memLimitShare is the part of the cgroup's memory limit given to the Go
// runtime as its soft limit, in tenths: the rest is for what the runtime
// does not count (thread stacks, the binary's pages) and for headroom.
const memLimitShare = 9

// unlimitedV1 is the smallest memory.limit_in_bytes taken as no limit:
// cgroup v1 writes "unlimited" as PAGE_COUNTER_MAX pages, about 2^63.
const unlimitedV1 = 1 << 62

// MemoryLimit decides the Go runtime's memory limit (debug.SetMemoryLimit)
// from the cgroup the process is in: memLimitShare tenths of the smallest
// memory limit of its cgroup and the cgroup's ancestors, as read by read
// (paths under /sys/fs/cgroup; a missing file is fs.ErrNotExist and
// skipped). procCgroup is /proc/self/cgroup; gomemlimit is $GOMEMLIMIT,
// which wins when set. It returns the limit in bytes (0: leave the
// runtime's), the cgroup's limit and the file it came from.
func MemoryLimit(gomemlimit, procCgroup string, read func(name string) (string, error)) (limit, cgroup int64, file string, err error) {
	if gomemlimit != "" {
		return 0, 0, "", nil
	}
	for _, name := range limitFiles(procCgroup) {
		s, err := read(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, 0, "", err
		}
		n, err := parseMemoryLimit(s)
		if err != nil {
			return 0, 0, "", fmt.Errorf("%s: %w", name, err)
		}
		if n > 0 && (cgroup == 0 || n < cgroup) {
			cgroup, file = n, name
		}
	}
	return cgroup/10*memLimitShare + cgroup%10*memLimitShare/10, cgroup, file, nil
}

// limitFiles names the memory limit files of the cgroup in procCgroup and
// of its ancestors, the cgroup's first, relative to /sys/fs/cgroup: the
// cgroup v1 memory controller's memory.limit_in_bytes when it has one,
// else cgroup v2's memory.max. The root's is named too: in a cgroup
// namespace (a container) the root is the container's cgroup.
func limitFiles(procCgroup string) []string {
	var dir, base string
	for line := range strings.Lines(procCgroup) {
		// hierarchy-ID:controller-list:cgroup-path (cgroups(7))
		f := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "" && base == "":
			dir, base = f[2], "memory.max"
		case controls(f[1], "memory"):
			return ancestors(path.Join("memory", f[2]), "memory", "memory.limit_in_bytes")
		}
	}
	if base == "" {
		return nil
	}
	return ancestors(dir, "", base)
}

// controls reports whether the comma-separated list has controller.
func controls(list, controller string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == controller {
			return true
		}
	}
	return false
}

// ancestors names base in dir and each of its parents up to top.
func ancestors(dir, top, base string) []string {
	dir, top = path.Clean("/"+dir), path.Clean("/"+top)
	var out []string
	for {
		out = append(out, strings.TrimPrefix(path.Join(dir, base), "/"))
		if dir == top || dir == "/" {
			return out
		}
		dir = path.Dir(dir)
	}
}

// parseMemoryLimit reads a cgroup memory limit file: bytes, 0 for none
// ("max", or v1's unlimited).
func parseMemoryLimit(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "max" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("not a memory limit: %q", s)
	}
	if n >= unlimitedV1 {
		return 0, nil
	}
	return n, nil
}

// SetMemoryLimit gives the Go runtime the memory limit MemoryLimit
// decides for this process, from /proc/self/cgroup and /sys/fs/cgroup,
// and logs it; $GOMEMLIMIT, when set, is left in force. A failure to read
// the limit is logged and leaves the runtime's.
func SetMemoryLimit(log *zap.Logger) {
	pc, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		log.Debug("cannot read the process's cgroup; no Go memory limit set from it", zap.Error(err))
		return
	}
	read := func(name string) (string, error) {
		b, err := os.ReadFile(path.Join("/sys/fs/cgroup", name))
		return string(b), err
	}
	limit, cgroup, file, err := MemoryLimit(os.Getenv("GOMEMLIMIT"), string(pc), read)
	if err != nil {
		log.Warn("cannot read the cgroup's memory limit; no Go memory limit set from it", zap.Error(err))
		return
	}
	if limit == 0 {
		return
	}
	debug.SetMemoryLimit(limit)
	log.Info("Go memory limit set from the cgroup's memory limit (GOMEMLIMIT overrides it)",
		zap.Int64("gomemlimit", limit), zap.Int64("cgroup_limit", cgroup), zap.String("file", "/sys/fs/cgroup/"+file))
}

// GoMemoryLimit returns the Go runtime's memory limit in force (from the
// cgroup, set by SetMemoryLimit, or $GOMEMLIMIT), 0 for none.
func GoMemoryLimit() int64 {
	if l := debug.SetMemoryLimit(-1); l != math.MaxInt64 {
		return l
	}
	return 0
}

// MaxTracked returns the tracked-inode budget that cfg's
// writeback.max_tracked_inodes gives under the Go memory limit goLimit
// (bytes, 0: none): its count, 0 (no bound) for "unlimited", and for
// "auto" bdi.TrackedBudget of goLimit, 0 when there is no limit.
func MaxTracked(cfg *config.Config, goLimit int64) int64 {
	switch n := cfg.Writeback.MaxTrackedInodes; n {
	case config.MaxTrackedUnlimited:
		return 0
	case config.MaxTrackedAuto:
		return bdi.TrackedBudget(goLimit)
	default:
		return n
	}
}
