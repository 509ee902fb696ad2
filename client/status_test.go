package client

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"flusherd/control"
	"flusherd/internal/cli"
)

var update = flag.Bool("update", false, "rewrite the golden files of testdata/")

// golden compares got with testdata/name (rewritten with -update).
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	p := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(p, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", p, diff)
	}
}

// exampleStatus is a status with two trees (one gone, one with exposure
// figures) and one device.
var exampleStatus = control.Status{
	Trees: []control.TreeStatus{
		{Root: "/srv/logs", Mode: "writeback", ExpireSeconds: 3, Backend: "fanotify", Served: true, Tracked: 12, Dirty: 10,
			DirtyBytes: 5 << 20, WritebackBytes: 64 << 10, OldestDirtySeconds: 2.25, WrittenBytes: 340 << 20, Errors: 1, Blocked: 1,
			Exposure: control.Exposure{Count: 240, P50Seconds: 3, P99Seconds: 3.9, MaxSeconds: 3.9}},
		{Root: "/srv/spool", Mode: "integrity", ExpireSeconds: 15, Backend: "fanotify", Served: false, Failed: 2},
	},
	Devices: []control.DeviceStatus{
		{Bdi: "7:0", Tracked: 12, DirtyBytes: 5 << 20, WritebackBytes: 64 << 10, WindowBytes: 1 << 20, PaceBytesPerSec: 30 << 20, WrittenBytes: 340 << 20, Errors: 1, FailedFiles: 2,
			SweepCandidates: 3, SweepFound: 1},
	},
}

// serve answers the control socket of a stats directory with resp.
func serve(t *testing.T, resp control.Response) string {
	t.Helper()
	dir := t.TempDir()
	srv, err := control.Listen(control.SocketPath(dir), func(context.Context, control.Request) control.Response { return resp }, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ctx)
	}()
	t.Cleanup(func() { cancel(); srv.Close(); <-done })
	return dir
}

// TestStatusGolden: the status tables and the --json object, as the
// daemon's answer gives them (the JSON field names are the interface that
// scripts read: a golden file pins them).
func TestStatusGolden(t *testing.T) {
	dir := serve(t, control.Response{OK: true, Status: &exampleStatus})
	var out, errb bytes.Buffer
	if code := Status(context.Background(), dir, false, 0, &out, &errb); code != cli.ExitOK {
		t.Fatalf("status: exit %d: %s", code, errb.String())
	}
	golden(t, "status.txt", out.Bytes())
	out.Reset()
	if code := Status(context.Background(), dir, true, 0, &out, &errb); code != cli.ExitOK {
		t.Fatalf("status --json: exit %d: %s", code, errb.String())
	}
	golden(t, "status.json", out.Bytes())
	var back control.Status
	if err := json.Unmarshal(out.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(exampleStatus, back); diff != "" {
		t.Errorf("--json does not read back (-want +got):\n%s", diff)
	}
}

// TestStatusInterval: with --interval, the status is printed again each
// interval until the context ends (JSON: one object a line).
func TestStatusInterval(t *testing.T) {
	dir := serve(t, control.Response{OK: true, Status: &exampleStatus})
	ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
	defer cancel()
	var out, errb bytes.Buffer
	if code := Status(ctx, dir, true, 50*time.Millisecond, &out, &errb); code != cli.ExitOK {
		t.Fatalf("status --interval: exit %d: %s", code, errb.String())
	}
	lines := bytes.Split(bytes.TrimSpace(out.Bytes()), []byte("\n"))
	if len(lines) < 3 {
		t.Fatalf("%d objects printed in 250ms every 50ms, want several:\n%s", len(lines), out.String())
	}
	for _, l := range lines {
		var st control.Status
		if err := json.Unmarshal(l, &st); err != nil || len(st.Trees) != 2 {
			t.Errorf("line %q: %v", l, err)
		}
	}
}
