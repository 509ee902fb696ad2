package main

import (
	"fmt"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// plot draws, one above the other, the burst file's dirty (solid) and
// dirty+writeback (dashed) MiB, and the probe's commit latency (log
// scale), against the seconds since the burst began, one colour per
// method.
func (r *stormRun) plot(path string, runs []*stormResult) error {
	pd := plot.New()
	pd.Title.Text = fmt.Sprintf("burst file page cache (%s burst at %s/s; solid: dirty, dashed: dirty+writeback)", sizeString(r.o.burst), sizeString(r.o.rate))
	pd.X.Label.Text = "seconds since the burst began"
	pd.Y.Label.Text = "MiB"
	pd.Legend.Top = true
	pl := plot.New()
	pl.Title.Text = fmt.Sprintf("probe %s: commit latency (%s; each drawn over its duration)", r.probe, r.probeWhat())
	pl.X.Label.Text = "seconds since the burst began"
	pl.Y.Label.Text = "ms (log scale)"
	pl.Y.Scale = plot.LogScale{}
	pl.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	xmax := 0.0
	for i, res := range runs {
		name := r.methodName(res.method)
		secs := func(at int64) float64 { return float64(at-res.burstStart) / 1e9 }
		dirty, both := make(plotter.XYs, len(res.samples)), make(plotter.XYs, len(res.samples))
		for j, s := range res.samples {
			dirty[j] = plotter.XY{X: secs(s.at), Y: float64(s.dirty) / (1 << 20)}
			both[j] = plotter.XY{X: secs(s.at), Y: float64(s.dirty+s.wb) / (1 << 20)}
		}
		// Each call is a flat step over its own duration at the height of
		// its fdatasync latency: a stall shows as the span it covered.
		lat := make(plotter.XYs, 0, 2*len(res.probes))
		for _, p := range res.probes {
			y := max(float64(p.sync)/1e6, 0.01)
			lat = append(lat, plotter.XY{X: secs(p.at), Y: y}, plotter.XY{X: secs(p.at + int64(p.pwrite+p.sync)), Y: y})
		}
		if len(res.samples) > 0 {
			xmax = max(xmax, secs(res.samples[len(res.samples)-1].at))
		}
		col := plotutil.Color(i)
		for _, l := range []struct {
			xy     plotter.XYs
			p      *plot.Plot
			dashed bool
		}{{dirty, pd, false}, {both, pd, true}, {lat, pl, false}} {
			if len(l.xy) == 0 {
				continue
			}
			line, err := plotter.NewLine(l.xy)
			if err != nil {
				return err
			}
			line.Color = col
			line.Width = vg.Points(1.2)
			if l.dashed {
				line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			} else {
				l.p.Legend.Add(name, line)
			}
			l.p.Add(line)
		}
	}
	// Room above the lines for the legend, and a decade below the
	// probe's lines for its legend.
	pd.Y.Min, pd.Y.Max = 0, float64(r.o.burst)/(1<<20)*1.3
	pl.Y.Min = 0.01
	pl.Legend.Top = false
	// The same time axis on both: from the probe's start.
	pd.X.Min, pl.X.Min = -probeLead.Seconds(), -probeLead.Seconds()
	pd.X.Max, pl.X.Max = xmax, xmax
	img := vgimg.New(vg.Points(960), vg.Points(840))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadTop: vg.Points(8), PadBottom: vg.Points(8), PadLeft: vg.Points(8), PadRight: vg.Points(12), PadY: vg.Points(24)}
	plots := [][]*plot.Plot{{pd}, {pl}}
	canvases := plot.Align(plots, tiles, dc)
	pd.Draw(canvases[0][0])
	pl.Draw(canvases[1][0])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
