package watch

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestExchangedDirectoriesWatched: two directories of a tree, each with a
// subdirectory, swapped with renameat2(RENAME_EXCHANGE): a file written
// afterwards in either, or below either, under its new name, is reported.
// With inotify, each name's Rename comes after the other directory's
// Create of it, and must not drop the watch that Create added.
func TestExchangedDirectoriesWatched(t *testing.T) {
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			root := t.TempDir()
			a, b2 := filepath.Join(root, "a"), filepath.Join(root, "b")
			for _, d := range []string{filepath.Join(a, "sub"), filepath.Join(b2, "sub")} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			_, s := start(t, root, b)
			if err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b2, unix.RENAME_EXCHANGE); err != nil {
				t.Fatal(err)
			}
			for _, d := range []string{a, b2, filepath.Join(a, "sub"), filepath.Join(b2, "sub")} {
				p := filepath.Join(d, "f")
				eventually(t, p+" reported", func() bool {
					if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
						t.Fatal(err)
					}
					return s.has(p)
				})
			}
		})
	}
}
