package client

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"flusherd/control"
	"flusherd/internal/cli"
)

// Dirty prints the tracked files of the daemon whose stats directory is
// statsDir (those under the absolute paths under, if any), the top oldest
// (0: all), as a table or a JSON array, and returns the exit code.
func Dirty(statsDir string, under []string, top int, asJSON bool, stdout, stderr io.Writer) int {
	req := control.Request{Op: "dirty", Top: top}
	for _, p := range under {
		req.Paths = append(req.Paths, control.Name(p))
	}
	resp, err := control.Call(control.SocketPath(statsDir), req, 30*time.Second)
	if err != nil {
		return callFailed("dirty", statsDir, err, stderr)
	}
	if !resp.OK {
		fmt.Fprintf(stderr, "flusherd dirty: %s\n", resp.Error)
		return cli.ExitFailed
	}
	for _, p := range under {
		if slices.Contains(resp.Outside, control.Name(p)) {
			fmt.Fprintf(stderr, "flusherd dirty: note: %s is not in a watched tree\n", strconv.Quote(p))
		} else if _, err := os.Lstat(p); err != nil {
			// Still listed: a tracked file may have been deleted.
			fmt.Fprintf(stderr, "flusherd dirty: note: %v (listing the tracked files under that name)\n", err)
		}
	}
	if more := resp.DirtyTotal - len(resp.Dirty); more > 0 {
		// On stderr: the list on stdout stays what it was (a table, or
		// a JSON array), and a count of it does not go unexplained.
		files := "files"
		if more == 1 {
			files = "file"
		}
		shown := fmt.Sprintf("the %d oldest are", len(resp.Dirty))
		if len(resp.Dirty) == 1 {
			shown = "the oldest is"
		}
		fmt.Fprintf(stderr, "flusherd dirty: %d more tracked %s not shown (%s; --top 0 shows all)\n", more, files, shown)
	}
	if asJSON {
		files := resp.Dirty
		if files == nil {
			files = []control.DirtyFile{}
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(files); err != nil {
			return cli.ExitFailed
		}
		return cli.ExitOK
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "AGE\tBDI\tLIST\tDIRTY\tWRITEBACK\tATTEMPTS\tLAST_ERROR\tPATH")
	for _, f := range resp.Dirty {
		last := f.LastError
		if last == "" {
			last = "-"
		}
		if f.Busy {
			last += " (busy)"
		}
		list := f.List
		if f.Probing {
			list += " (probing)"
		}
		// Pages, by cachestat; "?" when they could not be read and
		// none were seen before (PagesUnknown).
		dirty, wbp := strconv.FormatUint(f.DirtyPages, 10), strconv.FormatUint(f.WritebackPages, 10)
		if f.PagesUnknown {
			dirty, wbp = "?", "?"
		}
		fmt.Fprintf(tw, "%.1fs\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", f.AgeSeconds, f.Bdi, list, dirty, wbp, f.Retries, last, strconv.Quote(string(f.Path)))
	}
	tw.Flush()
	return cli.ExitOK
}
