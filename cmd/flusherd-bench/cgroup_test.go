package main

import (
	"os"
	"os/exec"
	"testing"

	"flusherd/internal/testfs"
)

// TestCPUGroups: the groups are made, a process moved into one has all its
// threads there, and the groups are gone once removed after it exits.
func TestCPUGroups(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("cgroups need root")
	}
	if _, err := cpuRoot(); err != nil {
		testfs.Missing(t, "%v", err)
	}
	gs, remove, err := newCPUGroups("a", "b")
	if err != nil {
		t.Fatal(err)
	}
	removed := false
	t.Cleanup(func() {
		if !removed {
			remove()
		}
	})
	if len(gs) != 2 || gs[0].dir == gs[1].dir {
		t.Fatalf("groups %v", gs)
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := gs[1].add(cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	in, all, err := gs[1].threadsIn(cmd.Process.Pid)
	if err != nil || all == 0 || in != all {
		t.Errorf("threads in the group: %d of %d (%v)", in, all, err)
	}
	if in, _, _ := gs[0].threadsIn(cmd.Process.Pid); in != 0 {
		t.Errorf("%d threads in the other group", in)
	}
	cmd.Process.Kill()
	cmd.Wait()
	remove()
	removed = true
	for _, g := range gs {
		if _, err := os.Stat(g.dir); !os.IsNotExist(err) {
			t.Errorf("%s still there after remove (%v)", g.dir, err)
		}
	}
}
