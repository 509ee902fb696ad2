package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"flusherd/control"
	"flusherd/internal/cli"
)

// Status prints the daemon's status (control "status": a line per tree,
// then the devices) as tables or JSON and returns the exit code. With
// interval > 0 it prints it again every interval until ctx ends, clearing
// the screen first as watch(1) does (JSON: one object a line).
func Status(ctx context.Context, statsDir string, asJSON bool, interval time.Duration, stdout, stderr io.Writer) int {
	for {
		resp, err := control.Call(control.SocketPath(statsDir), control.Request{Op: "status"}, 30*time.Second)
		if err == nil && !resp.OK {
			err = errors.New(resp.Error)
		}
		if err == nil && resp.Status == nil {
			err = errors.New("the daemon gave no status (an older flusherd?)")
		}
		if err != nil {
			return callFailed("status", statsDir, err, stderr)
		}
		switch {
		case asJSON && interval > 0:
			if err := json.NewEncoder(stdout).Encode(resp.Status); err != nil {
				return cli.ExitFailed
			}
		case asJSON:
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(resp.Status); err != nil {
				return cli.ExitFailed
			}
		default:
			if interval > 0 {
				fmt.Fprintf(stdout, "\033[H\033[2J") // home, clear: as watch(1)
				fmt.Fprintf(stdout, "Every %s: flusherd status    %s\n\n", interval, time.Now().Format(time.DateTime))
			}
			FormatStatus(stdout, *resp.Status)
		}
		if interval <= 0 {
			return cli.ExitOK
		}
		select {
		case <-ctx.Done():
			return cli.ExitOK
		case <-time.After(interval):
		}
	}
}

// FormatStatus writes st as two tables: the trees (root, mode, expire,
// tracked files, dirty bytes, the oldest dirty age against the expire,
// bytes written, errors, blocked and failed files, and the exposure of
// the last 10 minutes: p50/p99/max), then the devices (with the window of
// writeback in flight: "-" when not bounded).
func FormatStatus(w io.Writer, st control.Status) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TREE\tMODE\tEXPIRE\tTRACKED\tDIRTY\tOLDEST/EXPIRE\tWRITTEN\tERRORS\tBLOCKED\tFAILED\tEXPOSURE p50/p99/max (10m)")
	for _, t := range st.Trees {
		root := strconv.Quote(string(t.Root))
		if !t.Served {
			root += " (gone)"
		}
		oldest := "-"
		if t.Dirty > 0 {
			oldest = fmt.Sprintf("%s/%s", seconds(t.OldestDirtySeconds), seconds(t.ExpireSeconds))
		}
		exposure := "-"
		if t.Exposure.Count > 0 {
			exposure = fmt.Sprintf("%s/%s/%s (%d)", seconds(t.Exposure.P50Seconds), seconds(t.Exposure.P99Seconds), seconds(t.Exposure.MaxSeconds), t.Exposure.Count)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d\t%d\t%d\t%s\n", root, t.Mode, seconds(t.ExpireSeconds), t.Tracked,
			sizeOf(t.DirtyBytes), oldest, sizeOf(t.WrittenBytes), t.Errors, t.Blocked, t.Failed, exposure)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tTRACKED\tDIRTY\tWRITEBACK\tWINDOW\tPACE\tWRITTEN\tERRORS\tFAILED\tSTUCK\tPROBING\tSWEPT\tFOUND")
	for _, d := range st.Devices {
		probing := "no"
		if d.Probing {
			probing = "yes"
		}
		window := "-"
		if d.WindowBytes > 0 {
			window = sizeOf(d.WindowBytes)
		}
		pace := "-"
		if d.PaceBytesPerSec > 0 {
			pace = sizeOf(d.PaceBytesPerSec) + "/s"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%d\t%d\n", d.Bdi, d.Tracked, sizeOf(d.DirtyBytes), sizeOf(d.WritebackBytes),
			window, pace, sizeOf(d.WrittenBytes), d.Errors, d.FailedFiles, d.StuckCalls, probing, d.SweepCandidates, d.SweepFound)
	}
	tw.Flush()
}

// seconds formats s seconds as a duration rounded for reading ("2.5s",
// "1m30s").
func seconds(s float64) string {
	d := time.Duration(s * float64(time.Second))
	switch {
	case d >= time.Minute:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// sizeOf formats n bytes with a binary unit ("0", "4.0KiB", "1.5GiB").
func sizeOf(n uint64) string {
	if n < 1024 {
		return strconv.FormatUint(n, 10)
	}
	v, unit := float64(n)/1024, "KiB"
	for _, u := range []string{"MiB", "GiB", "TiB"} {
		if v < 1024 {
			break
		}
		v, unit = v/1024, u
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + unit
}
