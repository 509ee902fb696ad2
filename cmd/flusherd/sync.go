package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"flusherd/bdi"
	"flusherd/control"
	"flusherd/inode"
	"flusherd/watch"
)

const exitUnreachable = 3

// socketPath is where the daemon with this config listens.
func socketPath(statsDir string) string { return filepath.Join(statsDir, "flusherd.sock") }

func cmdSync(args []string, stdout, stderr io.Writer) int {
	fset := newFlagSet("sync", "sync [--config FILE] [--stats-dir DIR] PATH...",
		"flusherd sync /srv/db/wal /srv/db/data.1", stderr)
	var c commonFlags
	c.register(fset)
	timeout := fset.Duration("timeout", 0, "give up after this long (0: wait as long as it takes)")
	if err := fset.Parse(args); err != nil {
		return parseExit(err)
	}
	if fset.NArg() == 0 {
		fmt.Fprintln(stderr, "flusherd sync: name at least one file")
		fset.Usage()
		return exitUsage
	}
	cfg, err := loadConfig(c, nil)
	if err != nil {
		fmt.Fprintf(stderr, "flusherd sync: %v\n", err)
		return exitUsage
	}
	var paths []string
	for _, p := range fset.Args() {
		abs, err := filepath.Abs(p)
		if err != nil {
			fmt.Fprintf(stderr, "flusherd sync: %v\n", err)
			return exitUsage
		}
		paths = append(paths, abs)
	}
	resp, err := control.Call(socketPath(cfg.Stats.Dir), control.Request{Op: "sync", Paths: paths}, *timeout)
	if err != nil {
		fmt.Fprintf(stderr, "flusherd sync: %v\n", err)
		if errors.Is(err, control.ErrUnreachable) {
			return exitUnreachable
		}
		return exitFailed
	}
	failed := false
	for _, f := range resp.Files {
		if f.Error != "" {
			fmt.Fprintf(stderr, "flusherd sync: %s: %s\n", f.Path, f.Error)
			failed = true
		}
	}
	if resp.Error != "" {
		fmt.Fprintf(stderr, "flusherd sync: %s\n", resp.Error)
		failed = true
	}
	if failed || !resp.OK {
		return exitFailed
	}
	return exitOK
}

// syncHandler serves "sync" requests: each named file, which must be a
// regular file in a watched tree, is written with fdatasync by its device's
// writeback goroutine (WB_SYNC_ALL work, reason "sync", FlushPlug).
func syncHandler(reg *bdi.Registry, wat watch.Backend) control.Handler {
	return func(ctx context.Context, req control.Request) control.Response {
		if req.Op != "sync" {
			return control.Response{Error: fmt.Sprintf("unknown op %q", req.Op)}
		}
		if len(req.Paths) == 0 {
			return control.Response{Error: "sync: no paths"}
		}
		files := make([]control.FileResult, len(req.Paths))
		type slot struct {
			work  *bdi.Work
			index []int
		}
		works := map[*bdi.Writeback]*slot{}
		for i, p := range req.Paths {
			files[i].Path = p
			if !filepath.IsAbs(p) {
				files[i].Error = "not an absolute path"
				continue
			}
			p = filepath.Clean(p)
			key, regular, err := inode.Stat(p)
			switch {
			case err != nil:
				files[i].Error = err.Error()
				continue
			case !regular:
				files[i].Error = "not a regular file"
				continue
			}
			tree, ok := wat.TreeOf(p)
			if !ok {
				files[i].Error = "not in a watched tree"
				continue
			}
			wb, err := reg.Device(key.Dev, p)
			if err != nil {
				files[i].Error = err.Error()
				continue
			}
			s := works[wb]
			if s == nil {
				s = &slot{work: &bdi.Work{SyncMode: bdi.SyncAll, Reason: "sync"}}
				works[wb] = s
			}
			s.work.Files = append(s.work.Files, bdi.FileRef{Key: key, Path: p, Tree: tree.Tree})
			s.index = append(s.index, i)
		}
		for wb, s := range works {
			wb.Queue(s.work)
		}
		for _, s := range works {
			select {
			case <-s.work.Done():
			case <-ctx.Done():
				return control.Response{Error: "daemon shutting down"}
			}
			for j, i := range s.index {
				if err := s.work.Errs[j]; err != nil {
					files[i].Error = err.Error()
				}
			}
		}
		ok := true
		for _, f := range files {
			if f.Error != "" {
				ok = false
			}
		}
		return control.Response{OK: ok, Files: files}
	}
}
