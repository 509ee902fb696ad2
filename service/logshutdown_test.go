package service

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"flusherd/bdi"
)

// TestLogShutdownWording: files given up for a missing permission are not
// blamed on their filesystem; files left at the timeout are not said to
// have had their writeback started (their attempts may have failed); files
// given up for one errno share a line; a cut scan or lost events turn
// "every tracked file is clean" into an error.
func TestLogShutdownWording(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	rep := bdi.ShutdownReport{
		GivenUp: map[string][]bdi.GivenUp{"7:0": {
			{Path: "/t/ro", Err: fmt.Errorf("sync_file_range: %w", syscall.EROFS)},
			{Path: "/t/denied", Err: fmt.Errorf("cachestat: %w", syscall.EPERM)},
		}},
		Left: map[string][]string{"7:0": {"/t/slow"}},
	}
	LogShutdown(zap.New(core), rep, "shutdown_timeout (1s) ended", nil)
	msgs := map[string]string{} // error text -> message
	for _, e := range logs.All() {
		if s, ok := e.ContextMap()["error"].(string); ok {
			msgs[s] = e.Message
		}
	}
	if m := msgs["operation not permitted"]; !strings.Contains(m, "may not open or inspect") || strings.Contains(m, "filesystem") {
		t.Errorf("EPERM given up: %q", m)
	}
	if m := msgs["read-only file system"]; !strings.Contains(m, "their filesystem cannot be written") {
		t.Errorf("EROFS given up: %q", m)
	}
	if n := logs.FilterMessageSnippet("when shutdown_timeout (1s) ended").Len(); n != 1 {
		t.Errorf("%d lines for the files left at the timeout, want 1", n)
	}
	if n := logs.FilterMessageSnippet("was started").Len(); n != 0 {
		t.Errorf("a line says the left files' writeback was started")
	}

	// Lost and given-up files only, nothing left at the deadline: the
	// lost ones are named as lost, and the last line blames no timeout.
	core, logs = observer.New(zap.InfoLevel)
	LogShutdown(zap.New(core), bdi.ShutdownReport{
		Lost:    map[string][]bdi.GivenUp{"7:0": {{Path: "/t/lost", Err: syscall.EIO}}},
		GivenUp: map[string][]bdi.GivenUp{"7:0": {{Path: "/t/ro", Err: syscall.EROFS}}},
	}, "shutdown_timeout (1s) ended", nil)
	if n := logs.FilterMessageSnippet("data was lost to a failed writeback").FilterField(zap.String("error", "input/output error")).Len(); n != 1 {
		t.Errorf("%d lines for the lost file, want 1: %v", n, logs.All())
	}
	last := logs.All()[logs.Len()-1]
	if last.Message != "exiting with files not written back" {
		t.Fatalf("last line %q", last.Message)
	}
	m := last.ContextMap()
	if _, ok := m["ended_by"]; ok || m["data_lost"] != int64(1) || m["given_up"] != int64(1) || m["still_dirty"] != int64(0) {
		t.Errorf("last line's fields %v: want data_lost 1, given_up 1, still_dirty 0, no ended_by", m)
	}

	// Files given up for one errno, each with its own text (an open by
	// handle names the handle): one line for the three, with the first's
	// whole error.
	core, logs = observer.New(zap.InfoLevel)
	var shut []bdi.GivenUp
	for i := range 3 {
		shut = append(shut, bdi.GivenUp{Path: fmt.Sprintf("/t/%d", i), Err: &os.PathError{Op: "open_by_handle_at", Path: fmt.Sprintf("file handle 81%d", i), Err: syscall.EIO}})
	}
	LogShutdown(zap.New(core), bdi.ShutdownReport{GivenUp: map[string][]bdi.GivenUp{"7:0": shut}}, "shutdown_timeout (1s) ended", nil)
	g := logs.FilterMessageSnippet("files given up").All()
	if len(g) != 1 || g[0].ContextMap()["files"] != int64(3) || g[0].ContextMap()["error"] != "input/output error" ||
		g[0].ContextMap()["first_error"] != "open_by_handle_at file handle 810: input/output error" || !strings.Contains(g[0].Message, "refuses to open them") {
		t.Errorf("three files given up with EIO: %v", logs.All())
	}

	core, logs = observer.New(zap.InfoLevel)
	LogShutdown(zap.New(core), bdi.ShutdownReport{}, "shutdown_timeout (1s) ended", errors.New("the initial scan was stopped"))
	if n := logs.FilterMessageSnippet("may be dirty and untracked").Len(); n != 1 || logs.FilterMessageSnippet("every tracked file is clean").Len() != 0 {
		t.Errorf("after a cut scan: %v", logs.All())
	}

	// Writes in writeback mode not verified: a warning with their count
	// and names; the tracked files are clean all the same.
	core, logs = observer.New(zap.InfoLevel)
	LogShutdown(zap.New(core), bdi.ShutdownReport{
		Unverified: map[string]bdi.Unverified{"7:0": {Paths: []string{"/t/b", "/t/a"}, Files: 9000}},
	}, "shutdown_timeout (1s) ended", nil)
	w := logs.FilterMessageSnippet("outcome is not known").All()
	if len(w) != 1 || w[0].Level != zap.WarnLevel || w[0].ContextMap()["files"] != int64(9000) {
		t.Errorf("unverified writes: %v", logs.All())
	}
	if logs.FilterMessage("every tracked file is clean; exiting").Len() != 1 {
		t.Errorf("no clean last line with only unverified writes: %v", logs.All())
	}
}
