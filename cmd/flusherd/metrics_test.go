package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"flusherd/internal/testfs"
)

// freePort returns a TCP address on the loopback that was free a moment
// ago.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// scrape fetches and parses http://addr/metrics.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	return mfs
}

// value returns the value of the sample of family name whose labels
// include all of labels (name, value pairs), and whether there is one.
func value(mfs map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	mf := mfs[name]
	if mf == nil {
		return 0, false
	}
next:
	for _, m := range mf.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				found = found || lp.GetName() == labels[i] && lp.GetValue() == labels[i+1]
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		}
		return m.GetUntyped().GetValue(), true
	}
	return 0, false
}

// TestMetrics: with metrics.listen set, the daemon serves /metrics, and
// /healthz and /readyz answer "ok" once it is ready; data
// written into a watched tree shows up as written bytes of its device and
// the lists drain. A second daemon whose address is taken logs the error
// and runs on without metrics.
func TestMetrics(t *testing.T) {
	t.Parallel()
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4"})
	data := filepath.Join(mnt.Dir, "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "200ms"
dirty_expire_interval = "500ms"
[metrics]
listen = %q
[[watch]]
path = %q
`, addr, data))
	if !strings.Contains(d.log.String(), "serving metrics") {
		t.Errorf("no \"serving metrics\" in the log:\n%s", d.log.String())
	}
	// Ready (the initial scan is done) and live.
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != "ok\n" {
			t.Errorf("GET %s = %s %q, want 200 \"ok\"", path, resp.Status, body)
		}
	}
	mfs := scrape(t, addr)
	if v, ok := value(mfs, "flusherd_watch_backend_info", "backend", "fanotify"); !ok || v != 1 {
		t.Errorf("flusherd_watch_backend_info{backend=\"fanotify\"} = %v, %v; want 1 (root uses fanotify)", v, ok)
	}
	if _, ok := value(mfs, "go_goroutines"); !ok {
		t.Error("no go_goroutines")
	}

	const size = 1 << 20
	if err := os.WriteFile(filepath.Join(data, "f"), make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
	var written, dirty, events float64
	// flusherd_written_bytes_total counts a write once verified: up to 30 s
	// (bdi's verifyBound) after its attempt, at its 5 s expiry, while the
	// system has dirty pages.
	if !poll(60*time.Second, func() bool {
		mfs = scrape(t, addr)
		written, _ = value(mfs, "flusherd_written_bytes_total", "bdi", mnt.MajMin)
		dirty, _ = value(mfs, "flusherd_inodes", "bdi", mnt.MajMin, "list", "b_dirty")
		events, _ = value(mfs, "flusherd_watch_events_total")
		return written >= size && dirty == 0 && events > 0
	}) {
		t.Fatalf("after 60s: flusherd_written_bytes_total{bdi=%q} %v (want >= %d), b_dirty %v (want 0), watch events %v",
			mnt.MajMin, written, size, dirty, events)
	}
	if v, ok := value(mfs, "flusherd_writeback_errors_total", "bdi", mnt.MajMin, "kind", "io_error"); !ok || v != 0 {
		t.Errorf("flusherd_writeback_errors_total{kind=\"io_error\"} = %v, %v; want 0", v, ok)
	}

	// The address is taken (by d): the second daemon runs without metrics.
	other := t.TempDir()
	d2 := startDaemon(t, fmt.Sprintf("[metrics]\nlisten = %q\n[[watch]]\npath = %q\n", addr, other))
	if log := d2.log.String(); !strings.Contains(log, "ERROR") || !strings.Contains(log, "cannot listen for metrics") {
		t.Errorf("no error about the taken address in the log:\n%s", log)
	}
	d2.stop(t)
	d.stop(t)
	// After the exit the port is free again.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Errorf("the metrics address is still taken after the exit: %v", err)
	} else {
		ln.Close()
	}
}
