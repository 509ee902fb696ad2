package bdi

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite golden files")

func TestStatsGolden(t *testing.T) {
	s := Stats{
		BdiWriteback: 3, BdiReclaimable: 1000, BdiDirtyThresh: 1219097, DirtyThresh: 1219097,
		BackgroundThresh: 608804, BdiDirtied: 54715, BdiWritten: 53715, BdiWriteBandwidth: 102400,
		BDirty: 17, BIO: 2, BMoreIO: 1, BMoreIOWait: 4, BdiList: 1, State: WBRegistered | WBHasDirtyIO,
		PlugRequests: 3000, PlugMerges: 120, PlugBatches: 17, RetryPauseMs: 40, WritebackErrors: 2, InodesGone: 1, Rescans: 3, FailedFiles: 2, Throttled: 5, DetachedCalls: 7, ListLockMaxUs: 120, LoopStallMaxUs: 2500,
	}
	var buf bytes.Buffer
	if err := s.Format(&buf, 4096); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "stats.golden")
	if *update {
		os.WriteFile(golden, buf.Bytes(), 0o644)
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(string(want), buf.String()); d != "" {
		t.Errorf("stats format (-golden +got)\n%s", d)
	}
}

// TestStatsKernelPrefix: the kernel's fields come first, in its order and
// padding; flusherd's own are b_more_io_wait (after b_more_io) and the
// lines after state.
func TestStatsKernelPrefix(t *testing.T) {
	kernel, err := os.ReadFile(filepath.Join("testdata", "kernel-stats"))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	(&Stats{}).Format(&buf, 4096)
	keys := func(b []byte) []string {
		var out []string
		for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
			out = append(out, string(l[:20])) // name and padding
		}
		return out
	}
	var ours []string
	for _, k := range keys(buf.Bytes()) {
		if k != "b_more_io_wait:     " {
			ours = append(ours, k)
		}
	}
	kk := keys(kernel)
	if d := cmp.Diff(kk, ours[:len(kk)]); d != "" {
		t.Errorf("kernel fields differ (-kernel +ours)\n%s", d)
	}
}
