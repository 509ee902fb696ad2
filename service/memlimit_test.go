package service

import (
	"flusherd/config"

	"errors"
	"io/fs"
	"slices"
	"testing"
)

// TestMemoryLimit: 90 % of the smallest limit of the cgroup and its
// ancestors, v1 or v2 (v1's memory controller first on a hybrid system),
// none when unlimited or when $GOMEMLIMIT is set; a bad file is an error.
func TestMemoryLimit(t *testing.T) {
	const (
		v2      = "0::/kubepods/pod1/ctr\n"
		v2root  = "0::/\n"
		hybrid  = "4:memory:/process_api/abc\n3:cpuset:/\n0::/\n"
		v1multi = "5:cpu,memory:/docker/abc\n"
	)
	for _, c := range []struct {
		name      string
		env, proc string
		files     map[string]string
		limit, cg int64
		file      string
		wantErr   bool
		wantFiles []string
	}{
		{name: "v2 container limit", proc: v2,
			files: map[string]string{"kubepods/pod1/ctr/memory.max": "67108864\n", "kubepods/pod1/memory.max": "max\n", "kubepods/memory.max": "max\n"},
			limit: 60397977, cg: 64 << 20, file: "kubepods/pod1/ctr/memory.max",
			wantFiles: []string{"kubepods/pod1/ctr/memory.max", "kubepods/pod1/memory.max", "kubepods/memory.max", "memory.max"}},
		{name: "v2 pod limit smaller than the container's", proc: v2,
			files: map[string]string{"kubepods/pod1/ctr/memory.max": "max\n", "kubepods/pod1/memory.max": "1000000000\n"},
			limit: 900000000, cg: 1000000000, file: "kubepods/pod1/memory.max"},
		{name: "v2 cgroup namespace", proc: v2root,
			files: map[string]string{"memory.max": "104857600\n"},
			limit: 94371840, cg: 100 << 20, file: "memory.max", wantFiles: []string{"memory.max"}},
		{name: "v2 unlimited", proc: v2,
			files: map[string]string{"kubepods/pod1/ctr/memory.max": "max\n"}},
		{name: "GOMEMLIMIT set", env: "100MiB", proc: v2,
			files: map[string]string{"kubepods/pod1/ctr/memory.max": "67108864\n"}},
		{name: "v1 on a hybrid system", proc: hybrid,
			files: map[string]string{"memory/process_api/abc/memory.limit_in_bytes": "268435456\n", "memory.max": "1000\n"},
			limit: 241591910, cg: 256 << 20, file: "memory/process_api/abc/memory.limit_in_bytes",
			wantFiles: []string{"memory/process_api/abc/memory.limit_in_bytes", "memory/process_api/memory.limit_in_bytes", "memory/memory.limit_in_bytes"}},
		{name: "v1 unlimited", proc: hybrid,
			files: map[string]string{"memory/process_api/abc/memory.limit_in_bytes": "9223372036854771712\n", "memory/memory.limit_in_bytes": "9223372036854771712\n"}},
		{name: "v1 controllers listed together, container's own view", proc: v1multi,
			files: map[string]string{"memory/memory.limit_in_bytes": "536870912\n"},
			limit: 483183820, cg: 512 << 20, file: "memory/memory.limit_in_bytes"},
		{name: "no cgroup", proc: ""},
		{name: "garbage", proc: v2root, files: map[string]string{"memory.max": "lots\n"}, wantErr: true},
		{name: "negative", proc: v2root, files: map[string]string{"memory.max": "-1\n"}, wantErr: true},
	} {
		var asked []string
		read := func(name string) (string, error) {
			asked = append(asked, name)
			s, ok := c.files[name]
			if !ok {
				return "", fs.ErrNotExist
			}
			return s, nil
		}
		limit, cg, file, err := MemoryLimit(c.env, c.proc, read)
		if (err != nil) != c.wantErr {
			t.Errorf("%s: err %v, want error %v", c.name, err, c.wantErr)
			continue
		}
		if limit != c.limit || cg != c.cg || file != c.file {
			t.Errorf("%s: MemoryLimit = %d, %d, %q; want %d, %d, %q", c.name, limit, cg, file, c.limit, c.cg, c.file)
		}
		if c.wantFiles != nil && !slices.Equal(asked, c.wantFiles) {
			t.Errorf("%s: read %q, want %q", c.name, asked, c.wantFiles)
		}
	}
	_, _, _, err := MemoryLimit("", v2root, func(string) (string, error) { return "", fs.ErrPermission })
	if !errors.Is(err, fs.ErrPermission) {
		t.Errorf("an unreadable limit file: %v, want ErrPermission", err)
	}
}

// TestMaxTracked: max_tracked_inodes "auto" is bdi.TrackedBudget of the
// Go memory limit, no bound without one; "unlimited" is no bound, a count
// is itself.
func TestMaxTracked(t *testing.T) {
	for _, c := range []struct {
		key           int64
		limit, wanted int64
	}{
		{config.MaxTrackedAuto, 150994944, 294912}, // a 160 MiB cgroup
		{config.MaxTrackedAuto, 0, 0},
		{config.MaxTrackedUnlimited, 150994944, 0},
		{300, 150994944, 300},
		{300, 0, 300},
	} {
		cfg := config.Default()
		cfg.Writeback.MaxTrackedInodes = c.key
		if got := MaxTracked(cfg, c.limit); got != c.wanted {
			t.Errorf("max_tracked_inodes %d, Go limit %d: MaxTracked = %d, want %d", c.key, c.limit, got, c.wanted)
		}
	}
}
