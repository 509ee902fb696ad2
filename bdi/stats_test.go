package bdi

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestRemoveStaleTemps: the temporary files of WriteFileAtomic that a
// killed process left (renameio's ".stats<digits>" and the older
// ".stats-<digits>"), at any depth, are removed; the stats files, other
// names, directories and symlinks are not; and WriteFileAtomic itself
// leaves none behind.
func TestRemoveStaleTemps(t *testing.T) {
	dir := t.TempDir()
	if err := WriteFileAtomic(filepath.Join(dir, "bdi", "7:0", "stats"), func(w io.Writer) error { _, err := io.WriteString(w, "x\n"); return err }); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(filepath.Join(dir, "bdi", "7:0", "stats"), func(w io.Writer) error { return errors.New("fails") }); err == nil {
		t.Fatal("a failing write was not reported")
	}
	if n, err := RemoveStaleTemps(dir); n != 0 || err != nil {
		t.Fatalf("after WriteFileAtomic alone: %d removed (%v), want none left behind", n, err)
	}
	stale := []string{".stats123", "bdi/7:0/.stats-4567", "bdi/7:0/.stats98765432", "watch/.stats1"}
	kept := []string{"bdi/7:0/stats", "watch/stats", ".statsx1", "bdi/.dirty123", "stats123", ".stats-"}
	for _, p := range append(append([]string{}, stale...), kept...) {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, ".stats55"), 0o755); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(outside, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, ".stats77")); err != nil {
		t.Fatal(err)
	}
	n, err := RemoveStaleTemps(dir)
	if err != nil || n != len(stale) {
		t.Errorf("RemoveStaleTemps = %d, %v; want %d, nil", n, err, len(stale))
	}
	for _, p := range stale {
		if _, err := os.Lstat(filepath.Join(dir, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: still there (%v)", p, err)
		}
	}
	for _, p := range append(kept, ".stats55", ".stats77") {
		if _, err := os.Lstat(filepath.Join(dir, p)); err != nil {
			t.Errorf("%s: removed (%v)", p, err)
		}
	}
	if _, err := os.Stat(outside); err != nil {
		t.Errorf("the symlink's target: %v", err)
	}
	fi, err := os.Stat(filepath.Join(dir, "bdi", "7:0", "stats"))
	if err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("stats file mode %v (%v), want 0644", fi.Mode(), err)
	}
}
