package main

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"flusherd/internal/testfs"
)

func TestParseProbes(t *testing.T) {
	for in, want := range map[string][]string{
		"fdatasync":          {probeFdatasync},
		"sqlite":             {probeSQLiteWAL, probeSQLiteRollback},
		"pgbench,sqlite-wal": {probePgbench, probeSQLiteWAL},
		"sqlite,sqlite-wal":  {probeSQLiteWAL, probeSQLiteRollback},
	} {
		got, err := parseProbes(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("parseProbes(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := parseProbes("mysql"); err == nil || !strings.Contains(err.Error(), "mysql") {
		t.Errorf("an unknown probe: %v", err)
	}
}

func TestReadPgbenchLog(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	// client, number, latency µs, script, end s, end µs, lag µs
	os.WriteFile(p, []byte("0 1 5729 0 1796387173 474701 90\n1 1 120000 0 1796387174 0 2410\n"), 0o644)
	recs, err := readPgbenchLog(p, 1796387000*1e9)
	if err != nil {
		t.Fatal(err)
	}
	want := []probeRec{
		{at: 173*1e9 + 474701*1e3 - 5729*1e3, sync: 5729 * time.Microsecond},
		{at: 174*1e9 - 120e6, sync: 120 * time.Millisecond},
	}
	if !slices.Equal(recs, want) {
		t.Errorf("got %+v, want %+v", recs, want)
	}
	os.WriteFile(p, []byte("0 1 x 0 1 2\n"), 0o644)
	if _, err := readPgbenchLog(p, 0); err == nil {
		t.Error("a bad line: no error")
	}
}

// runProbe runs a probe of kind in dir for about d and checks its commits:
// at least min, each started within the run, each latency positive and
// under 10 s. It returns the probe, to be torn down (also at cleanup).
func runProbe(t *testing.T, r *stormRun, kind, dir string, d time.Duration, min int) prober {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := r.newProber(kind)
	t.Cleanup(p.tearDown)
	if err := p.setUp(ctx, dir); err != nil {
		t.Fatal(err)
	}
	t0 := monoNow()
	if err := p.start(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(d)
	recs, err := p.stop(ctx, func() { t.Error("the probe did not stop in time") })
	t1 := monoNow()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) < min {
		t.Fatalf("%d commits in %v, want at least %d", len(recs), d, min)
	}
	for _, rec := range recs {
		if rec.at < t0-int64(time.Second) || rec.at > t1 || rec.sync <= 0 || rec.sync > 10*time.Second {
			t.Fatalf("commit %+v outside the run [%d, %d] or its latency out of range", rec, t0, t1)
		}
	}
	return p
}

// TestSQLiteProbes: both SQLite probes commit, in their journal mode.
func TestSQLiteProbes(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		testfs.Missing(t, "python3: %v", err)
	}
	r := &stormRun{o: stormOpts{interval: 10 * time.Millisecond}}
	// The database header's file format versions (bytes 18 and 19) are
	// 2 in WAL mode and 1 with a rollback journal. (The -wal file is no
	// witness: SQLite removes it when the last connection closes.)
	for _, c := range []struct {
		kind    string
		version byte
	}{{probeSQLiteWAL, 2}, {probeSQLiteRollback, 1}} {
		t.Run(c.kind, func(t *testing.T) {
			dir := t.TempDir()
			runProbe(t, r, c.kind, dir, time.Second, 20)
			hdr := make([]byte, 20)
			f, err := os.Open(filepath.Join(dir, "probe.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := io.ReadFull(f, hdr); err != nil {
				t.Fatal(err)
			}
			if hdr[18] != c.version || hdr[19] != c.version {
				t.Errorf("database header's format versions %d, %d, want %d (%s)", hdr[18], hdr[19], c.version, c.kind)
			}
		})
	}
}

// TestPgbenchProbe: the pgbench probe makes a real cluster, runs pgbench
// at -R 50 and reads its log; its teardown stops the server.
func TestPgbenchProbe(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the probe runs the server as the postgres user: needs root")
	}
	if _, err := pgBinDir(); err != nil {
		testfs.Missing(t, "%v", err)
	}
	if _, err := postgresCred(); err != nil {
		testfs.Missing(t, "%v", err)
	}
	testfs.SkipShort(t, "initdb and pgbench -i take seconds")
	r := &stormRun{o: stormOpts{pgScale: 1, pgRate: 50}}
	dir := t.TempDir()
	p := runProbe(t, r, probePgbench, dir, 2*time.Second, 40)
	pid := filepath.Join(dir, "pgdata", "postmaster.pid")
	if _, err := os.Stat(pid); err != nil {
		t.Fatalf("the server's pid file: %v", err)
	}
	p.tearDown()
	if _, err := os.Stat(pid); !os.IsNotExist(err) {
		t.Errorf("postmaster.pid still there after the teardown: %v", err)
	}
}
