package seccomp

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// Profile is the part of the profile format flusherd.json uses.
type Profile struct {
	DefaultAction   string `json:"defaultAction"`
	DefaultErrnoRet *uint  `json:"defaultErrnoRet"`
	Syscalls        []struct {
		Names   []string `json:"names"`
		Action  string   `json:"action"`
		Comment string   `json:"comment"`
	} `json:"syscalls"`
}

// load decodes flusherd.json, failing on a field the format lacks.
func load(t *testing.T) (*Profile, map[string]bool) {
	t.Helper()
	data, err := os.ReadFile("flusherd.json")
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var p Profile
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("flusherd.json: %v", err)
	}
	allowed := map[string]bool{}
	for _, s := range p.Syscalls {
		for _, n := range s.Names {
			if allowed[n] {
				t.Errorf("%s is named twice", n)
			}
			allowed[n] = s.Action == "SCMP_ACT_ALLOW"
		}
	}
	return &p, allowed
}

// TestProfile: the profile refuses by default (ENOSYS, so that a call it
// leaves out takes flusherd's fallback, as openat2 does) and allows only,
// with every call the shipped unit names beside its groups.
func TestProfile(t *testing.T) {
	p, allowed := load(t)
	if p.DefaultAction != "SCMP_ACT_ERRNO" || p.DefaultErrnoRet == nil || *p.DefaultErrnoRet != 38 {
		t.Errorf("default action %q, errno %v; want SCMP_ACT_ERRNO with 38 (ENOSYS)", p.DefaultAction, p.DefaultErrnoRet)
	}
	for _, s := range p.Syscalls {
		if s.Action != "SCMP_ACT_ALLOW" {
			t.Errorf("an entry with action %q (%v): only allowing entries are expected", s.Action, s.Names)
		}
	}
	unit, err := os.ReadFile("../../systemd/flusherd.service")
	if err != nil {
		t.Fatal(err)
	}
	named := 0
	for sc := bufio.NewScanner(bytes.NewReader(unit)); sc.Scan(); {
		v, ok := strings.CutPrefix(sc.Text(), "SystemCallFilter=")
		if !ok || strings.HasPrefix(v, "~") {
			continue
		}
		for _, n := range strings.Fields(v) {
			if strings.HasPrefix(n, "@") {
				continue
			}
			named++
			if !allowed[n] {
				t.Errorf("%s: in the unit's SystemCallFilter=, not allowed by the profile", n)
			}
		}
	}
	if named < 4 {
		t.Errorf("%d calls named in the unit's SystemCallFilter=; the unit was not read right", named)
	}
	// What the profile is for, beyond the Go runtime's calls: flusherd's
	// own, from the unit's comments and its strace under tests.
	for _, n := range []string{"name_to_handle_at", "sync_file_range", "fdatasync", "syncfs", "openat2",
		"inotify_init1", "inotify_add_watch", "ioctl", "getdents64", "accept4", "renameat", "execve"} {
		if !allowed[n] {
			t.Errorf("%s is not allowed", n)
		}
	}
}
