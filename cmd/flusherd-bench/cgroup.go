package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// cpuGroup is a cgroup with the cpu controller that the bench made, at the
// default CPU weight (cgroup v2 cpu.weight 100, v1 cpu.shares 1024): the
// share of the CPU a systemd service or an application's scope gets
// against its siblings, whatever number of threads it runs
// (systemd.resource-control(5), CPUWeight=).
type cpuGroup struct{ dir string }

// newCPUGroups makes one cgroup per name, siblings under the cgroup root
// of the cpu controller (cgroup v2 when the unified hierarchy has it, else
// the v1 cpu hierarchy), and returns them with a function that removes
// them (each once its processes are gone: it waits up to 5 s for them).
func newCPUGroups(names ...string) ([]*cpuGroup, func(), error) {
	root, err := cpuRoot()
	if err != nil {
		return nil, func() {}, err
	}
	var gs []*cpuGroup
	remove := func() {
		for _, g := range gs {
			for end := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				err := os.Remove(g.dir)
				if err == nil || errors.Is(err, os.ErrNotExist) || time.Now().After(end) {
					break
				}
			}
		}
	}
	for _, n := range names {
		dir := filepath.Join(root, fmt.Sprintf("flusherd-bench-%d-%s", os.Getpid(), n))
		if err := os.Mkdir(dir, 0o755); err != nil {
			remove()
			return nil, func() {}, err
		}
		gs = append(gs, &cpuGroup{dir: dir})
	}
	return gs, remove, nil
}

// cpuRoot returns the directory of the root cgroup in which the cpu
// controller can be used: /sys/fs/cgroup on a cgroup v2 system (enabling
// "+cpu" in its cgroup.subtree_control if needed), /sys/fs/cgroup/cpu on
// a v1 one.
func cpuRoot() (string, error) {
	const v2 = "/sys/fs/cgroup"
	if b, err := os.ReadFile(filepath.Join(v2, "cgroup.controllers")); err == nil {
		if !hasWord(string(b), "cpu") {
			return "", fmt.Errorf("cgroup v2: the cpu controller is not available (%s)", strings.TrimSpace(string(b)))
		}
		sc, _ := os.ReadFile(filepath.Join(v2, "cgroup.subtree_control"))
		if !hasWord(string(sc), "cpu") {
			if err := os.WriteFile(filepath.Join(v2, "cgroup.subtree_control"), []byte("+cpu"), 0); err != nil {
				return "", fmt.Errorf("cgroup v2: enabling the cpu controller: %w", err)
			}
		}
		return v2, nil
	}
	const v1 = "/sys/fs/cgroup/cpu"
	if _, err := os.Stat(filepath.Join(v1, "cpu.shares")); err != nil {
		return "", fmt.Errorf("no cgroup hierarchy with the cpu controller (%s, %s)", v2, v1)
	}
	return v1, nil
}

func hasWord(s, w string) bool { return slices.Contains(strings.Fields(s), w) }

// add moves process pid, all its threads, into g (cgroup.procs).
func (g *cpuGroup) add(pid int) error {
	return os.WriteFile(filepath.Join(g.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
}

// threadsIn counts the threads of pid that are in g, from
// /proc/PID/task/*/cgroup: a check that add moved them all.
func (g *cpuGroup) threadsIn(pid int) (in, all int, err error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, 0, err
	}
	rel := "/" + filepath.Base(g.dir)
	for _, t := range tasks {
		f, err := os.Open(fmt.Sprintf("/proc/%d/task/%s/cgroup", pid, t.Name()))
		if err != nil {
			continue
		}
		all++
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// "0::/path" (v2) or "N:cpu,...:/path" (v1).
			parts := strings.SplitN(sc.Text(), ":", 3)
			if len(parts) == 3 && parts[2] == rel && (parts[1] == "" || hasWord(strings.ReplaceAll(parts[1], ",", " "), "cpu")) {
				in++
				break
			}
		}
		f.Close()
	}
	return in, all, nil
}
