package main

// The storm bench's probes: what waits beside the burst. Each reports one
// record per commit (its start on CLOCK_MONOTONIC and its latency).
//
//	fdatasync        a 4 KiB pwrite and an fdatasync of its own file
//	                 (the hidden storm-probe command), every --probe-interval;
//	sqlite-wal       Python's sqlite3 module, journal_mode=WAL,
//	                 synchronous=FULL: one row inserted and committed every
//	                 --probe-interval;
//	sqlite-rollback  the same with journal_mode=DELETE (a rollback journal);
//	pgbench          a PostgreSQL cluster made on the throttled filesystem
//	                 (initdb, a private socket directory, no TCP), pgbench -i
//	                 at --pg-scale, then pgbench -c 2 -j 2 -R --pg-rate with
//	                 its per-transaction log; a commit's latency is the log's
//	                 (with -R it counts from the transaction's scheduled
//	                 start, so a stall delays the ones queued behind it).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	probeFdatasync      = "fdatasync"
	probeSQLiteWAL      = "sqlite-wal"
	probeSQLiteRollback = "sqlite-rollback"
	probePgbench        = "pgbench"
)

// probeKinds lists the probes in the order the bench runs them.
var probeKinds = []string{probeFdatasync, probeSQLiteWAL, probeSQLiteRollback, probePgbench}

// parseProbes parses --probe: a comma-separated list of probeKinds
// ("sqlite" is both SQLite modes), in the order given, without repeats.
func parseProbes(s string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		names := []string{p}
		if p == "sqlite" {
			names = []string{probeSQLiteWAL, probeSQLiteRollback}
		} else if !slices.Contains(probeKinds, p) {
			return nil, fmt.Errorf("--probe: unknown probe %q (want %s, or sqlite for both SQLite modes)", p, strings.Join(probeKinds, ", "))
		}
		for _, n := range names {
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	return out, nil
}

// prober is one run's probe.
type prober interface {
	// setUp makes the probe's files under dir (a directory on the
	// filesystem of the run, before the throttle).
	setUp(ctx context.Context, dir string) error
	// start starts committing and returns after the first commit.
	start(ctx context.Context) error
	// waitPid is the process whose threads' waits are sampled (0: none).
	waitPid() int
	// stop ends the commits and returns them; release lifts the throttle
	// when the probe does not stop in time (a commit stuck behind it).
	stop(ctx context.Context, release func()) ([]probeRec, error)
	// tearDown stops what setUp started; it may be called at any stage.
	tearDown()
}

// newProber returns a prober of kind (one of probeKinds).
func (r *stormRun) newProber(kind string) prober {
	switch kind {
	case probeSQLiteWAL, probeSQLiteRollback:
		mode := "WAL"
		if kind == probeSQLiteRollback {
			mode = "DELETE"
		}
		return &sqliteProbe{journal: mode, interval: r.o.interval}
	case probePgbench:
		return &pgbenchProbe{scale: r.o.pgScale, rate: r.o.pgRate}
	}
	return &fdatasyncProbe{self: r.o.self, interval: r.o.interval}
}

// childProbe is a probe run as a child process that speaks the storm
// children's protocol: "ready" after its first commit, then, after a
// line on stdin, "p START PWRITE_NS SYNC_NS" per commit and "end".
type childProbe struct{ c *stormChild }

func (p *childProbe) startChild(ctx context.Context, name string, args ...string) error {
	c, err := startStormChild(name, args...)
	if err != nil {
		return err
	}
	if err := c.expect(ctx, "ready", 30*time.Second); err != nil {
		c.kill()
		return err
	}
	p.c = c
	return nil
}

func (p *childProbe) waitPid() int { return p.c.cmd.Process.Pid }

func (p *childProbe) stop(ctx context.Context, release func()) ([]probeRec, error) {
	if _, err := io.WriteString(p.c.stdin, "stop\n"); err != nil {
		return nil, err
	}
	recs, err := p.c.collect(ctx, 5*time.Second)
	if errors.Is(err, errChildSlow) {
		release()
		recs, err = p.c.collect(ctx, 60*time.Second)
	}
	return recs, err
}

func (p *childProbe) tearDown() {
	if p.c != nil {
		p.c.kill()
	}
}

// fdatasyncProbe is the hidden storm-probe command (stormProbe).
type fdatasyncProbe struct {
	childProbe
	self     string
	interval time.Duration
	path     string
}

func (p *fdatasyncProbe) setUp(ctx context.Context, dir string) error {
	p.path = filepath.Join(dir, "probe")
	return writeSynced(p.path, probeSize)
}

func (p *fdatasyncProbe) start(ctx context.Context) error {
	return p.startChild(ctx, p.self, stormProbeCmd, "--file", p.path, "--interval", p.interval.String())
}

// sqliteProbeScript is the SQLite probe: argv db, journal mode, interval
// (s). Python's time.monotonic_ns is CLOCK_MONOTONIC on Linux.
const sqliteProbeScript = `
import os, sqlite3, sys, threading, time
db, mode, interval = sys.argv[1], sys.argv[2], float(sys.argv[3])
con = sqlite3.connect(db, isolation_level=None)
got = con.execute("PRAGMA journal_mode=" + mode).fetchone()[0]
if got.upper() != mode.upper():
    sys.exit("journal_mode %s refused (%s)" % (mode, got))
con.execute("PRAGMA synchronous=FULL")
con.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, at INTEGER, pad BLOB)")
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
recs, pad = [], os.urandom(100)
while not stop.is_set():
    t0 = time.monotonic_ns()
    con.execute("BEGIN")
    con.execute("INSERT INTO t (at, pad) VALUES (?, ?)", (t0, pad))
    con.execute("COMMIT")
    t1 = time.monotonic_ns()
    recs.append((t0, t1 - t0))
    if len(recs) == 1:
        print("ready", flush=True)
    time.sleep(interval)
out = sys.stdout
for t0, d in recs:
    out.write("p %d 0 %d\n" % (t0, d))
out.write("end\n")
out.flush()
`

// sqliteProbe commits one row per interval with Python's sqlite3.
type sqliteProbe struct {
	childProbe
	journal  string
	interval time.Duration
	db       string
}

func (p *sqliteProbe) setUp(ctx context.Context, dir string) error {
	if _, err := exec.LookPath("python3"); err != nil {
		return fmt.Errorf("the %s probe needs python3 with its sqlite3 module: %w", strings.ToLower(p.journal), err)
	}
	p.db = filepath.Join(dir, "probe.db")
	return nil
}

func (p *sqliteProbe) start(ctx context.Context) error {
	return p.startChild(ctx, "python3", "-c", sqliteProbeScript, p.db, p.journal,
		strconv.FormatFloat(p.interval.Seconds(), 'f', -1, 64))
}

// pgbenchProbe runs a PostgreSQL server on the run's filesystem and
// pgbench against it, both as the postgres user (initdb refuses root).
type pgbenchProbe struct {
	scale, rate int
	bin         string // PostgreSQL's bin directory
	cred        *syscall.Credential
	data, sock  string
	logDir      string
	server      bool
	cmd         *exec.Cmd
	exited      chan error
	out         strings.Builder
}

// pgBinDir returns the bin directory of the newest PostgreSQL installed
// from Debian's packages (/usr/lib/postgresql/N/bin), or of pg_config.
func pgBinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return va - vb
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "pgbench")); err == nil {
			return dirs[i], nil
		}
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		d := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(d, "pgbench")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no PostgreSQL server with pgbench installed (Debian: apt-get install postgresql)")
}

// postgresCred is the postgres user's uid and gid.
func postgresCred() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("the pgbench probe runs the server as the postgres user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// pg runs a PostgreSQL program as postgres and returns its error with its
// output.
func (p *pgbenchProbe) pg(ctx context.Context, prog string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(p.bin, prog), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Dir = p.sock
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v\n%s", prog, strings.Join(args, " "), err, tail(string(out), 10))
	}
	return nil
}

// allowTraverse lets every user search the directories above dir up to
// the temporary directory (the bench's own, made 0700), so that the
// postgres user reaches its cluster.
func allowTraverse(dir string) error {
	top := filepath.Clean(os.TempDir())
	for d := filepath.Dir(dir); d != top && d != "/" && d != "."; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			return err
		}
		if m := st.Mode().Perm(); m&0o001 == 0 {
			if err := os.Chmod(d, m|0o111); err != nil {
				return err
			}
		}
	}
	return nil
}

// mkdirOwned makes dir and gives it to the postgres user.
func (p *pgbenchProbe) mkdirOwned(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.Chown(dir, int(p.cred.Uid), int(p.cred.Gid))
}

func (p *pgbenchProbe) connArgs() []string {
	return []string{"-h", p.sock, "-p", "5432", "-U", "postgres"}
}

func (p *pgbenchProbe) setUp(ctx context.Context, dir string) error {
	var err error
	if p.bin, err = pgBinDir(); err != nil {
		return err
	}
	if p.cred, err = postgresCred(); err != nil {
		return err
	}
	if p.sock, err = os.MkdirTemp("", "flusherd-bench-pg-"); err != nil {
		return err
	}
	if err := allowTraverse(dir); err != nil {
		return err
	}
	p.data, p.logDir = filepath.Join(dir, "pgdata"), filepath.Join(p.sock, "log")
	for _, d := range []string{p.sock, p.data, p.logDir} {
		if err := p.mkdirOwned(d); err != nil {
			return err
		}
	}
	if err := p.pg(ctx, "initdb", "-D", p.data, "-A", "trust", "-U", "postgres", "--no-sync"); err != nil {
		return err
	}
	// No TCP; the socket in a directory of its own, so the port only
	// names the socket.
	p.server = true
	if err := p.pg(ctx, "pg_ctl", "-D", p.data, "-w", "-t", "60", "-l", filepath.Join(p.sock, "server.log"),
		"-o", "-p 5432 -k "+p.sock+" -c listen_addresses=''", "start"); err != nil {
		return err
	}
	args := append(p.connArgs(), "-i", "-q", "-s", strconv.Itoa(p.scale), "postgres")
	if err := p.pg(ctx, "pgbench", args...); err != nil {
		return err
	}
	return p.pg(ctx, "psql", append(p.connArgs(), "-q", "-c", "CHECKPOINT", "postgres")...)
}

func (p *pgbenchProbe) start(ctx context.Context) error {
	args := append(p.connArgs(), "-n", "-c", "2", "-j", "2", "-T", "86400", "-l", "--log-prefix", filepath.Join(p.logDir, "pgbench"))
	if p.rate > 0 {
		args = append(args, "-R", strconv.Itoa(p.rate))
	}
	args = append(args, "postgres")
	p.cmd = exec.Command(filepath.Join(p.bin, "pgbench"), args...)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p.cmd.Dir = p.sock
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		return err
	}
	p.exited = make(chan error, 1)
	go func() { p.exited <- p.cmd.Wait() }()
	// Ready once its clients are connected and a first transaction is
	// done: the server's count of commits has moved.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-p.exited:
			p.cmd = nil
			return fmt.Errorf("pgbench exited at once: %v\n%s", err, tail(p.out.String(), 10))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if n, _ := p.commits(ctx); n > 0 {
			return nil
		}
	}
	return fmt.Errorf("pgbench: no transaction within 30 s\n%s", tail(p.out.String(), 10))
}

// commits is the server's count of pgbench_history rows.
func (p *pgbenchProbe) commits(ctx context.Context) (int, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(p.bin, "psql"), append(p.connArgs(), "-At", "-c", "SELECT count(*) FROM pgbench_history", "postgres")...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	cmd.Dir = p.sock
	out, err := cmd.Output()
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(out)))
}

func (p *pgbenchProbe) waitPid() int { return 0 }

// stop ends pgbench with SIGALRM (how its -T ends a run: it finishes and
// writes its logs) and reads its per-transaction logs.
func (p *pgbenchProbe) stop(ctx context.Context, release func()) ([]probeRec, error) {
	if p.cmd == nil {
		return nil, errors.New("pgbench is not running")
	}
	p.cmd.Process.Signal(syscall.SIGALRM)
	var err error
	select {
	case err = <-p.exited:
	case <-time.After(5 * time.Second):
		release()
		select {
		case err = <-p.exited:
		case <-time.After(60 * time.Second):
			p.cmd.Process.Kill()
			<-p.exited
			err = errChildSlow
		}
	}
	p.cmd = nil
	if err != nil {
		return nil, fmt.Errorf("pgbench: %v\n%s", err, tail(p.out.String(), 10))
	}
	logs, _ := filepath.Glob(filepath.Join(p.logDir, "pgbench.*"))
	if len(logs) == 0 {
		return nil, errors.New("pgbench wrote no transaction log")
	}
	offset := realMinusMono()
	var recs []probeRec
	for _, l := range logs {
		rs, err := readPgbenchLog(l, offset)
		if err != nil {
			return nil, err
		}
		recs = append(recs, rs...)
	}
	slices.SortFunc(recs, func(a, b probeRec) int { return int(a.at - b.at) })
	return recs, nil
}

// realMinusMono is CLOCK_REALTIME - CLOCK_MONOTONIC, ns.
func realMinusMono() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_REALTIME, &ts)
	return ts.Nano() - monoNow()
}

// readPgbenchLog reads a pgbench per-transaction log (client, number,
// latency µs, script, end s, end µs[, lag µs]) into records whose start is
// the end minus the latency, on CLOCK_MONOTONIC (offset: realMinusMono).
func readPgbenchLog(path string, offset int64) ([]probeRec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var recs []probeRec
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 6 {
			return nil, fmt.Errorf("%s: bad line %q", path, sc.Text())
		}
		var v [3]int64
		for i, k := range []int{2, 4, 5} {
			if v[i], err = strconv.ParseInt(fs[k], 10, 64); err != nil {
				return nil, fmt.Errorf("%s: bad line %q", path, sc.Text())
			}
		}
		lat := time.Duration(v[0]) * time.Microsecond
		end := v[1]*1e9 + v[2]*1e3 - offset
		recs = append(recs, probeRec{at: end - lat.Nanoseconds(), sync: lat})
	}
	return recs, sc.Err()
}

func (p *pgbenchProbe) tearDown() {
	if p.cmd != nil {
		p.cmd.Process.Kill()
		<-p.exited
		p.cmd = nil
	}
	if p.server {
		// Immediate: the cluster is thrown away, and a checkpoint on the
		// throttled device would take its time.
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if err := p.pg(ctx, "pg_ctl", "-D", p.data, "-m", "immediate", "-w", "stop"); err != nil {
			fmt.Fprintf(os.Stderr, "storm: stopping the PostgreSQL server: %v\n", err)
		}
		cancel()
		p.server = false
	}
	if p.sock != "" {
		os.RemoveAll(p.sock)
	}
}
