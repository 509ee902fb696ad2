package metrics

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"go.uber.org/goleak"

	"flusherd/bdi"
	"flusherd/inode"
	"flusherd/policy"
	"flusherd/tree"
	"flusherd/watch"
)

var update = flag.Bool("update", false, "rewrite testdata/metrics.golden")

const golden = "testdata/metrics.golden"

// fakeSource has fixed numbers: two devices and the fanotify watcher.
type fakeSource struct {
	devs    []Device
	backend string
	ctr     *watch.Counters
	trees   []Tree
}

func (f *fakeSource) Trees() []Tree                    { return f.trees }
func (f *fakeSource) Devices() []Device                { return f.devs }
func (f *fakeSource) Watch() (string, *watch.Counters) { return f.backend, f.ctr }

func newFake() *fakeSource {
	var sda bdi.Stats
	sda.BdiWriteback, sda.BdiReclaimable, sda.BdiWritten = 3, 1000, 53715
	sda.BDirty, sda.BIO, sda.BMoreIO, sda.BMoreIOWait = 17, 2, 1, 4
	sda.PlugRequests, sda.PlugMerges, sda.PlugBatches = 3000, 120, 17
	sda.RetryPauseMs = 40
	sda.StuckCalls = 2
	sda.FailedFiles = 1
	sda.Rescans = 3
	sda.BackgroundWorks, sda.RangeWritebacks, sda.InflightBytes = 4, 11, 12288
	sda.BdiWriteBandwidth, sda.BdiDirtied = 40960, 54715
	sda.Throttled, sda.DetachedCalls, sda.InodesGone = 6, 8, 9
	sda.ListLockMaxUs, sda.LoopStallMaxUs = 85, 100412
	sda.SweepCandidates, sda.SweepFound = 14, 3
	sda.Outcomes[policy.Clean] = 900 // not an error: not exported
	sda.Outcomes[policy.Blocked] = 5
	sda.Outcomes[policy.FSUnavailable] = 1
	sda.Outcomes[policy.IOError] = 2
	sda.Outcomes[policy.Gone] = 7
	ctr := &watch.Counters{}
	ctr.Events.Store(18211)
	ctr.Overflows.Store(1)
	ctr.Rescans.Store(2)
	ctr.Unwatched.Store(0)
	ctr.Nested.Store(1)
	ctr.Unserved.Store(3)
	ctr.Quieted.Store(212)
	return &fakeSource{
		devs: []Device{
			{Name: "8:0", Stats: sda, MaxDirtyAge: 12500 * time.Millisecond},
			{Name: "btrfs-1"}, // idle: all zero
		},
		backend: "fanotify",
		ctr:     ctr,
		trees: []Tree{
			{Root: "/srv/logs", OldestAge: 2500 * time.Millisecond, Totals: bdi.TreeTotals{
				TreeFigures: bdi.TreeFigures{Root: "/srv/logs", Tracked: 12, Dirty: 10, DirtyPages: 100},
				Written:     5000, Errors: 3},
				Exposure: bdi.Exposure{Count: 40, Sum: 120,
					Buckets: []uint64{0, 0, 0, 0, 2, 10, 30, 38, 39, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40}}},
			{Root: "/srv/spool"}, // nothing yet
		},
	}
}

// TestGolden compares the exposition of a fake source (with HELP and TYPE
// lines) with testdata/metrics.golden; -update rewrites the file.
func TestGolden(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(newFake(), 4096))
	if *update {
		// Not testutil.GatherAndFormat: without metric names it
		// filters every metric out (client_golang v1.25.0).
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		enc := expfmt.NewEncoder(&out, expfmt.NewFormat(expfmt.TypeTextPlain))
		for _, mf := range mfs {
			if err := enc.Encode(mf); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(golden)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := testutil.GatherAndCompare(reg, f); err != nil {
		t.Errorf("%v\n(run go test ./metrics -run TestGolden -update to accept a deliberate change)", err)
	}
}

// TestLint runs promlint (the naming conventions) over every metric.
func TestLint(t *testing.T) {
	problems, err := testutil.CollectAndLint(NewCollector(newFake(), 4096))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

// TestNoWatcher: without watcher counters only the device metrics are
// exported, and with no device and no watcher nothing is.
func TestNoWatcher(t *testing.T) {
	src := newFake()
	src.ctr = nil
	c := NewCollector(src, 4096)
	if n := testutil.CollectAndCount(c, "flusherd_watch_events_total", "flusherd_watch_backend_info"); n != 0 {
		t.Errorf("%d watcher metrics without a watcher", n)
	}
	if n := testutil.CollectAndCount(c, "flusherd_inodes"); n != 10 {
		t.Errorf("%d flusherd_inodes series, want 10 (5 lists of 2 devices)", n)
	}
	if n := testutil.CollectAndCount(NewCollector(&fakeSource{}, 4096)); n != 0 {
		t.Errorf("%d metrics from an empty source", n)
	}
}

// TestLiveSource reads a real registry and a backend through NewSource:
// a device with one file on b_dirty and a rescan, and the backend's name
// and counters.
func TestLiveSource(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	reg := bdi.NewRegistry(bdi.Options{
		Config: bdi.Config{DirtyWritebackInterval: time.Hour, MinPause: time.Millisecond, MaxPause: time.Second,
			WriteChunk: 4 << 20, PlugEnabled: true, MaxPending: 16, QueueDepth: 1},
		Resolve: func(uint64, string) (string, error) { return "7:99", nil },
	})
	defer reg.Stop()
	key := inode.Key{Dev: 1, Ino: 2}
	if err := reg.MarkInodeDirty(file, key, "", tree.Tree{Expire: time.Hour}); err != nil {
		t.Fatal(err)
	}
	reg.Rescanned(1)
	be := &fakeBackend{}
	be.ctr.Events.Store(5)
	be.ctr.Unwatched.Store(3)

	c := NewCollector(NewSource(reg, be), 4096)
	want := `
# HELP flusherd_inodes Tracked files on each of the device's writeback lists: b_dirty (dirty, not yet due), b_io (picked for this pass or under an attempt), b_more_io (write_chunk used up, more to write), b_more_io_wait (could not be written now, retried after a pause), failed (data lost after a failed writeback, until written again; failed_files in the stats file).
# TYPE flusherd_inodes gauge
flusherd_inodes{bdi="7:99",list="b_dirty"} 1
flusherd_inodes{bdi="7:99",list="b_io"} 0
flusherd_inodes{bdi="7:99",list="b_more_io"} 0
flusherd_inodes{bdi="7:99",list="b_more_io_wait"} 0
flusherd_inodes{bdi="7:99",list="failed"} 0
# HELP flusherd_rescans_total Cachestat rescans of trees on the device (after an event queue overflow, and of directories inotify could not watch; rescans).
# TYPE flusherd_rescans_total counter
flusherd_rescans_total{bdi="7:99"} 1
# HELP flusherd_watch_backend_info The watcher backend in use, in the label backend (fanotify or inotify); always 1.
# TYPE flusherd_watch_backend_info gauge
flusherd_watch_backend_info{backend="inotify"} 1
# HELP flusherd_watch_events_total Events the watcher read from the kernel.
# TYPE flusherd_watch_events_total counter
flusherd_watch_events_total 5
# HELP flusherd_watch_unwatched_directories Directories inotify could not watch (fs.inotify.max_user_watches reached); they are rescanned every watcher.rescan_interval.
# TYPE flusherd_watch_unwatched_directories gauge
flusherd_watch_unwatched_directories 3
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "flusherd_inodes", "flusherd_rescans_total",
		"flusherd_watch_backend_info", "flusherd_watch_events_total", "flusherd_watch_unwatched_directories"); err != nil {
		t.Error(err)
	}
	if age := testutil.ToFloat64(onlyMetric(c, "flusherd_max_dirty_age_seconds")); age <= 0 || age > 60 {
		t.Errorf("flusherd_max_dirty_age_seconds = %v, want a small positive age", age)
	}
	if n := testutil.CollectAndCount(NewCollector(NewSource(reg, nil), 4096), "flusherd_watch_events_total"); n != 0 {
		t.Errorf("%d watcher metrics without a backend", n)
	}
}

// onlyMetric is a collector of c's metrics named name (one, for ToFloat64).
func onlyMetric(c prometheus.Collector, name string) prometheus.Collector {
	return prometheus.CollectorFunc(func(ch chan<- prometheus.Metric) {
		all := make(chan prometheus.Metric)
		go func() { c.Collect(all); close(all) }()
		for m := range all {
			if strings.Contains(m.Desc().String(), `"`+name+`"`) {
				ch <- m
			}
		}
	})
}

type fakeBackend struct{ ctr watch.Counters }

func (b *fakeBackend) Name() string                    { return "inotify" }
func (b *fakeBackend) Start(context.Context) error     { return nil }
func (b *fakeBackend) Run(context.Context)             {}
func (b *fakeBackend) Close() error                    { return nil }
func (b *fakeBackend) Counters() *watch.Counters       { return &b.ctr }
func (b *fakeBackend) Quiesce(context.Context)         {}
func (b *fakeBackend) Settle(context.Context) error    { return nil }
func (b *fakeBackend) TreeOf(string) (tree.Tree, bool) { return tree.Tree{}, false }
func (b *fakeBackend) Trees() []watch.TreeUse          { return nil }
func (b *fakeBackend) OnDevice(uint64) bool            { return false }

// TestServe: Serve answers on an ephemeral port with the flusherd, Go and
// process metrics, and stops, closing the listener and leaving no
// goroutine behind, when its context ends.
func TestServe(t *testing.T) {
	defer goleak.VerifyNone(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, ln, NewRegistry(newFake(), 4096), Probes{}, nil) }()

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	get := func(path string) (int, string, string) {
		t.Helper()
		resp, err := client.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(body)
	}
	code, ctype, body := get("/metrics")
	if code != http.StatusOK || !strings.HasPrefix(ctype, "text/plain") {
		t.Errorf("GET /metrics: %d %q", code, ctype)
	}
	for _, want := range []string{
		"flusherd_written_bytes_total{bdi=\"8:0\"} 2.2001664e+08\n",
		"flusherd_watch_backend_info{backend=\"fanotify\"} 1\n",
		"# TYPE go_goroutines gauge\n",
		"# TYPE process_open_fds gauge\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("GET /metrics lacks %q", want)
		}
	}
	if code, _, body := get("/"); code != http.StatusOK || !strings.Contains(body, "/metrics") {
		t.Errorf("GET /: %d %q", code, body)
	}
	if code, _, _ := get("/nothing"); code != http.StatusNotFound {
		t.Errorf("GET /nothing: %d, want 404", code)
	}
	resp, err := client.Post("http://"+addr+"/metrics", "text/plain", bytes.NewReader(nil))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /metrics: %d, want 405", resp.StatusCode)
	}

	// An idle keep-alive connection is open; cancel must still stop it.
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve returned %v after cancel, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return within 10s of cancel")
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Error("the port still accepts connections after Serve returned")
	}
	tr.CloseIdleConnections()
}

// TestServeCancelledBefore: a context that is already done makes Serve
// return at once and close the listener.
func TestServeCancelledBefore(t *testing.T) {
	defer goleak.VerifyNone(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Serve(ctx, ln, prometheus.NewRegistry(), Probes{}, nil); err != nil {
		t.Errorf("Serve = %v, want nil", err)
	}
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Error("the listener is still open")
	}
}

// TestServeListenerError: an error of the listener ends Serve with it.
func TestServeListenerError(t *testing.T) {
	defer goleak.VerifyNone(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	err = Serve(context.Background(), ln, prometheus.NewRegistry(), Probes{}, nil)
	if err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("Serve on a closed listener = %v, want the accept error", err)
	}
}

// TestManPageListsEveryMetric: every metric of the exposition (the golden
// file's TYPE lines) is defined in flusherd(8)'s METRICS, as "**name**".
func TestManPageListsEveryMetric(t *testing.T) {
	doc, err := os.ReadFile("../doc/flusherd.8.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(doc), "\n# METRICS\n")
	if !ok {
		t.Fatal("doc/flusherd.8.md has no section \"# METRICS\"")
	}
	if i := strings.Index(sec, "\n# "); i >= 0 {
		sec = sec[:i]
	}
	g, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for line := range strings.Lines(string(g)) {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "#" || f[1] != "TYPE" {
			continue
		}
		n++
		if !strings.Contains(sec, "**"+f[2]+"**") {
			t.Errorf("flusherd(8), METRICS: the metric %s is not defined (as **%s**)", f[2], f[2])
		}
	}
	if n == 0 {
		t.Fatalf("%s has no TYPE line", golden)
	}
}

// notExported are the stats files' lines no metric's help text names,
// each with the metric that carries it or why none does: every other line
// must be named in a help text, in parentheses ("(key)", "(key, ...)",
// "(..., key)" or "(...; key)").
var notExported = map[string]string{
	"BdiDirtyThresh":   "the kernel's thresholds, read from /proc/vmstat: node_exporter exports them",
	"DirtyThresh":      "the kernel's thresholds, read from /proc/vmstat: node_exporter exports them",
	"BackgroundThresh": "the kernel's thresholds, read from /proc/vmstat: node_exporter exports them",
	"b_dirty":          "flusherd_inodes{list=\"b_dirty\"}",
	"b_io":             "flusherd_inodes{list=\"b_io\"}",
	"b_more_io":        "flusherd_inodes{list=\"b_more_io\"}",
	"b_more_io_wait":   "flusherd_inodes{list=\"b_more_io_wait\"}",
	"failed_files":     "flusherd_inodes{list=\"failed\"}",
	"b_dirty_time":     "always 0: the kernel's layout, flusherd has no lazytime list",
	"bdi_list":         "always 1: the kernel's layout",
	"state":            "the kernel's layout: the bdi's state bits",
	"writeback_errors": "flusherd_writeback_errors_total, by kind",
	"retry_pause_ms":   "flusherd_retry_pause_seconds",
	"backend":          "flusherd_watch_backend_info{backend}",
	"events":           "flusherd_watch_events_total",
	"overflows":        "flusherd_watch_overflows_total",
	"unwatched_dirs":   "flusherd_watch_unwatched_directories",
	"tree":             "the trees' roots: not figures",
}

// TestEveryStatsLineExported: each line of a device's stats file and of
// watch/stats is either named in a metric's help text or listed in
// notExported with the metric that carries it (or why none does).
func TestEveryStatsLineExported(t *testing.T) {
	dir := t.TempDir()
	var s bdi.Stats
	var text bytes.Buffer
	if err := s.Format(&text, 4096); err != nil {
		t.Fatal(err)
	}
	ctr := &watch.Counters{}
	if err := watch.WriteStats(dir, "fanotify", ctr, []watch.TreeUse{{Backend: "fanotify", Root: "/srv", Served: true}}); err != nil {
		t.Fatal(err)
	}
	ws, err := os.ReadFile(filepath.Join(dir, "watch", "stats"))
	if err != nil {
		t.Fatal(err)
	}
	text.Write(ws)
	ch := make(chan *prometheus.Desc, 64)
	go func() { NewCollector(newFake(), 4096).Describe(ch); close(ch) }()
	var help strings.Builder
	for d := range ch {
		help.WriteString(d.String())
	}
	n := 0
	for line := range strings.Lines(text.String()) {
		key, _, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n++
		if _, ok := notExported[key]; ok {
			continue
		}
		if h := help.String(); !strings.Contains(h, "("+key+")") && !strings.Contains(h, "("+key+",") && !strings.Contains(h, ", "+key+")") && !strings.Contains(h, "; "+key+")") {
			t.Errorf("the stats line %q is in no metric's help text, and not in notExported", key)
		}
	}
	if n < 20 {
		t.Fatalf("only %d stats lines read", n)
	}
}

// TestProbes: /healthz and /readyz answer 200 "ok" while their check
// passes and 503 with its reason while it fails, read at each request;
// without a check the endpoint is not served.
func TestProbes(t *testing.T) {
	var live, ready error
	h := Handler(prometheus.NewRegistry(), Probes{
		Live:  func() error { return live },
		Ready: func() error { return ready },
	}, nil)
	get := func(method, path string) (int, string) {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		return rec.Code, rec.Body.String()
	}
	for _, c := range []struct {
		name        string
		live, ready error
		path        string
		code        int
		body        string
	}{
		{"healthy", nil, errors.New("the initial scan is running"), "/healthz", 200, "ok\n"},
		{"unhealthy", errors.New("bdi 7:0: writeback goroutine wedged"), nil, "/healthz", 503, "bdi 7:0: writeback goroutine wedged\n"},
		{"not ready", nil, errors.New("the initial scan is running"), "/readyz", 503, "the initial scan is running\n"},
		{"ready", errors.New("bdi 7:0: writeback goroutine wedged"), nil, "/readyz", 200, "ok\n"},
	} {
		live, ready = c.live, c.ready
		if code, body := get("GET", c.path); code != c.code || body != c.body {
			t.Errorf("%s: GET %s = %d %q, want %d %q", c.name, c.path, code, body, c.code, c.body)
		}
	}
	live = errors.New("wedged")
	if code, _ := get("HEAD", "/healthz"); code != 503 {
		t.Errorf("HEAD /healthz while unhealthy = %d, want 503", code)
	}
	if code, _ := get("POST", "/readyz"); code != http.StatusMethodNotAllowed {
		t.Errorf("POST /readyz = %d, want 405", code)
	}
	none := Handler(prometheus.NewRegistry(), Probes{}, nil)
	for _, path := range []string{"/healthz", "/readyz"} {
		rec := httptest.NewRecorder()
		none.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != http.StatusNotFound {
			t.Errorf("GET %s without probes = %d, want 404", path, rec.Code)
		}
	}
}
