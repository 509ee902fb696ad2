package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"flusherd/control"
)

func cmdDirty(args []string, stdout, stderr io.Writer) int {
	fset := newFlagSet("dirty", "dirty [--config FILE] [--stats-dir DIR] [--top N] [--json]\n\n"+
		"The files the running daemon tracks, oldest dirty data first: age of the dirty\n"+
		"data, device, list (b_dirty, b_io, b_more_io, b_more_io_wait, or failed: data\n"+
		"lost after a failed writeback), dirty and writeback pages (cachestat, now),\n"+
		"attempts since last clean, and the last error. --top defaults to 20; when more\n"+
		"files are tracked, a line on standard error says how many.",
		"flusherd dirty --top 10\n  flusherd dirty --json | jq '.[] | select(.list == \"b_more_io_wait\")'", stdout, stderr)
	var c commonFlags
	c.register(fset)
	top := fset.Int("top", 20, "show the N oldest files (0: all)")
	asJSON := fset.Bool("json", false, "print a JSON array (the control socket's DirtyFile objects)")
	if code, stop := parseFlags(fset, args); stop {
		return code
	}
	if *top < 0 {
		fmt.Fprintln(stderr, "flusherd dirty: --top must not be negative")
		return exitUsage
	}
	cfg, err := loadClientConfig(c)
	if err != nil {
		fmt.Fprintf(stderr, "flusherd dirty: %v\n", err)
		return exitUsage
	}
	resp, err := control.Call(socketPath(cfg.Stats.Dir), control.Request{Op: "dirty", Top: *top}, 30*time.Second)
	if err != nil {
		fmt.Fprintf(stderr, "flusherd dirty: %v\n", err)
		if errors.Is(err, control.ErrUnreachable) {
			fmt.Fprint(stderr, unreachableHint("dirty", cfg.Stats.Dir))
			return exitUnreachable
		}
		return exitFailed
	}
	if !resp.OK {
		fmt.Fprintf(stderr, "flusherd dirty: %s\n", resp.Error)
		return exitFailed
	}
	if more := resp.DirtyTotal - len(resp.Dirty); more > 0 {
		// On stderr: the list on stdout stays what it was (a table, or
		// a JSON array), and a count of it does not go unexplained.
		files := "files"
		if more == 1 {
			files = "file"
		}
		fmt.Fprintf(stderr, "flusherd dirty: %d more tracked %s not shown (the %d oldest are; --top 0 shows all)\n", more, files, len(resp.Dirty))
	}
	if *asJSON {
		files := resp.Dirty
		if files == nil {
			files = []control.DirtyFile{}
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(files); err != nil {
			return exitFailed
		}
		return exitOK
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
	return exitOK
}
