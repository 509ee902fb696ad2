package config

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"flusherd/tree"
)

// decoder turns the generic TOML tree into a Config, collecting errors.
type decoder struct {
	src  *source
	errs []*Error
}

func (d *decoder) errorf(key, format string, args ...any) {
	d.errs = append(d.errs, d.src.errorf(key, format, args...))
}

// oldKeys are keys still read under their old names, which an unknown
// key's error does not offer (a config that uses one is told its new name).
var oldKeys = map[string]bool{"writeback.max_inflight": true}

// field decodes one key's value; key is the full dotted key.
type field func(key string, v any)

// table decodes the keys of table m (at dotted key prefix) with fields,
// reporting unknown keys.
func (d *decoder) table(prefix string, v any, fields map[string]field) {
	m, ok := v.(map[string]any)
	if !ok {
		d.errorf(prefix, "want a table, got %s", describe(v))
		return
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		key := joinKey(prefix, k)
		f, ok := fields[k]
		if !ok {
			var want []string
			for name := range maps.Keys(fields) {
				if !oldKeys[joinKey(prefix, name)] {
					want = append(want, name)
				}
			}
			slices.Sort(want)
			d.errorf(key, "unknown key, want one of %s", strings.Join(want, ", "))
			continue
		}
		f(key, m[k])
	}
}

// config decodes the top-level table m into a Config: each section in
// turn (in the order of their names), then the defaults that follow other
// keys, then the [[watch]] entries.
func (d *decoder) config(m map[string]any) *Config {
	c := Default()
	var g given
	var watches []any
	d.table("", m, map[string]field{
		"writeback": func(key string, v any) {
			d.table(key, v, d.writebackFields(c, &g))
		},
		"plug": func(key string, v any) {
			d.table(key, v, d.plugFields(c, &g))
		},
		"watcher": func(key string, v any) {
			d.table(key, v, map[string]field{
				"backend":         d.str(&c.Watcher.Backend),
				"rescan_interval": d.duration(&c.Watcher.RescanInterval),
				"sweep_interval":  d.sweepInterval(&c.Watcher),
			})
		},
		"stats": func(key string, v any) {
			d.table(key, v, map[string]field{"dir": d.absPath(&c.Stats.Dir)})
		},
		"log": func(key string, v any) {
			d.table(key, v, map[string]field{"level": d.str(&c.Log.Level), "format": d.str(&c.Log.Format)})
		},
		"metrics": func(key string, v any) {
			d.table(key, v, map[string]field{"listen": d.str(&c.Metrics.Listen)})
		},
		"watch": func(key string, v any) {
			watches = d.watchArray(key, v)
		},
	})
	d.followingDefaults(c, g)
	for i, v := range watches {
		c.Watch = append(c.Watch, d.watch(i, v, c.Writeback.DirtyExpireInterval))
	}
	return c
}

// given records keys whose presence sets other keys' defaults.
type given struct {
	maxPause    bool // writeback.max_pause
	oldInflight bool // writeback.max_inflight
	newInflight bool // plug.max_inflight_bytes
}

// writebackFields are the keys of [writeback].
func (d *decoder) writebackFields(c *Config, g *given) map[string]field {
	wb := &c.Writeback
	return map[string]field{
		"dirty_writeback_interval": d.duration(&wb.DirtyWritebackInterval),
		"dirty_expire_interval":    d.duration(&wb.DirtyExpireInterval),
		"min_pause":                d.duration(&wb.MinPause),
		"max_pause": func(key string, v any) {
			g.maxPause = true
			d.duration(&wb.MaxPause)(key, v)
		},
		"write_chunk": func(key string, v any) {
			if v == "auto" {
				wb.WriteChunkAuto = true
				return
			}
			if str, ok := v.(string); ok {
				if _, err := parseSize(str); err != nil {
					d.errorf(key, "bad size %q: %v; or \"auto\" (from the device's bandwidth)", str, err)
					return
				}
			}
			d.size(&wb.WriteChunk)(key, v)
		},
		"dirty_background_bytes": d.size(&wb.DirtyBackgroundBytes),
		"dirty_background_ratio": d.integer(&wb.DirtyBackgroundRatio),
		"range_bytes":            d.size(&wb.RangeBytes),
		// The key plug.max_inflight_bytes had before.
		"max_inflight": func(key string, v any) {
			g.oldInflight = true
			d.size(&c.Plug.MaxInflightBytes)(key, v)
		},
		"requeue_blocked":  d.str(&wb.RequeueBlocked),
		"attempt_timeout":  d.duration(&wb.AttemptTimeout),
		"shutdown_timeout": d.duration(&wb.ShutdownTimeout),
		"target_latency":   d.duration(&wb.TargetLatency),
		"max_tracked_inodes": func(key string, v any) {
			switch v {
			case "auto":
				wb.MaxTrackedInodes = MaxTrackedAuto
				return
			case "unlimited":
				wb.MaxTrackedInodes = MaxTrackedUnlimited
				return
			}
			n, ok := v.(int64)
			if !ok || n < 1 {
				d.errorf(key, "want a count of files of at least 1, \"auto\" (from the memory limit) or \"unlimited\", got %s", describe(v))
				return
			}
			wb.MaxTrackedInodes = n
		},
	}
}

// plugFields are the keys of [plug].
func (d *decoder) plugFields(c *Config, g *given) map[string]field {
	return map[string]field{
		"enabled":          d.boolean(&c.Plug.Enabled),
		"max_pending":      d.integer(&c.Plug.MaxPending),
		"queue_depth":      d.integer(&c.Plug.QueueDepth),
		"integrity_syncfs": d.integer(&c.Plug.IntegritySyncfs),
		"max_inflight_bytes": func(key string, v any) {
			g.newInflight = true
			d.size(&c.Plug.MaxInflightBytes)(key, v)
		},
	}
}

// followingDefaults sets the defaults that follow other keys (max_pause,
// max_inflight_bytes) where the file did not set them, and refuses the
// in-flight bound under both its names.
func (d *decoder) followingDefaults(c *Config, g given) {
	wb := &c.Writeback
	if !g.maxPause {
		wb.MaxPause = wb.DirtyWritebackInterval
	}
	if g.oldInflight && g.newInflight {
		d.errorf("writeback.max_inflight", "plug.max_inflight_bytes is given too: keep that one (writeback.max_inflight is its old name)")
	}
	if !g.oldInflight && !g.newInflight && !wb.WriteChunkAuto {
		// The default follows a larger write_chunk.
		c.Plug.MaxInflightBytes = max(c.Plug.MaxInflightBytes, wb.WriteChunk)
	}
}

// watchArray returns the entries of the [[watch]] array v.
func (d *decoder) watchArray(key string, v any) []any {
	var watches []any
	switch v := v.(type) {
	case []map[string]any:
		for _, x := range v {
			watches = append(watches, x)
		}
	case []any:
		watches = v
	default:
		d.errorf(key, "want an array of tables ([[watch]]), got %s", describe(v))
	}
	return watches
}

// watch decodes [[watch]] entry i, v; expire is its default expire.
func (d *decoder) watch(i int, v any, expire time.Duration) Watch {
	key := fmt.Sprintf("watch[%d]", i)
	w := Watch{Tree: tree.Tree{Recursive: true, Mode: tree.ModeWriteback, Expire: expire}}
	pathSet, pathBad := false, false
	d.table(key, v, map[string]field{
		"path": func(key string, v any) {
			pathSet = true
			if _, ok := v.(string); !ok {
				pathBad = true // (one error: not also "empty")
			}
			d.str(&w.Root)(key, v)
		},
		"recursive": d.boolean(&w.Recursive),
		"mode":      d.str((*string)(&w.Mode)),
		"expire":    d.duration(&w.Expire),
	})
	switch {
	case !pathSet:
		if _, isTable := v.(map[string]any); isTable {
			// (Where the entry is: its path has no line.)
			e := d.src.errorf(key, "missing: every [[watch]] needs a path")
			e.Key, e.at = e.Key+".path", e.at+".path"
			d.errs = append(d.errs, e)
		}
	case pathBad:
	case w.Root == "":
		d.errorf(key+".path", "must not be empty")
	default:
		d.abs(key+".path", &w.Root)
	}
	return w
}

func (d *decoder) duration(dst *time.Duration) field {
	return func(key string, v any) {
		s, ok := v.(string)
		if !ok {
			switch v.(type) {
			case int64, float64:
				d.errorf(key, "bad duration %v: a duration must be a string with a unit, e.g. \"%vs\"", v, v)
			default:
				d.errorf(key, "want a duration string like \"5s\", got %s", describe(v))
			}
			return
		}
		x, err := ParseDuration(s)
		if err != nil {
			d.errorf(key, "%v", err)
			return
		}
		*dst = x
	}
}

// sweepInterval decodes watcher.sweep_interval: "auto" or a duration
// ("0": off).
func (d *decoder) sweepInterval(w *Watcher) field {
	dur := d.duration(&w.SweepInterval)
	return func(key string, v any) {
		if v == "auto" {
			w.SweepAuto = true
			return
		}
		w.SweepAuto = false
		dur(key, v)
	}
}

// ParseDuration parses a duration as the configuration writes it: Go's
// time.ParseDuration syntax, surrounding spaces ignored. Its errors say
// what is wrong: a number without a unit (but a bare zero, "0", is
// zero, as in time.ParseDuration), a value too large for time.Duration
// (about 292 years), or other syntax.
func ParseDuration(s string) (time.Duration, error) {
	t := strings.TrimSpace(s)
	if f, err := strconv.ParseFloat(t, 64); err == nil && f == 0 {
		return 0, nil
	} else if err == nil {
		t = strings.TrimPrefix(t, "-") // (the example is not to be refused as negative next)
		return 0, fmt.Errorf("bad duration %q: a duration needs a unit, e.g. \"%ss\" or \"%sms\"", s, t, t)
	}
	x, err := time.ParseDuration(t)
	switch {
	case err != nil && durationSyntax.MatchString(t):
		// Well formed: too large for time.Duration.
		return 0, fmt.Errorf("bad duration %q: too large, at most %s", s, time.Duration(math.MaxInt64))
	case err != nil:
		return 0, fmt.Errorf("bad duration %q: want a number with a unit (ns, us, ms, s, m, h), e.g. \"5s\" or \"1m30s\"", s)
	}
	return x, nil
}

// durationSyntax is time.ParseDuration's syntax: a string it matches and
// ParseDuration refuses is out of range.
var durationSyntax = regexp.MustCompile(`^[-+]?((\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+$`)

func (d *decoder) size(dst *int64) field {
	return func(key string, v any) {
		switch v := v.(type) {
		case int64:
			*dst = v
		case string:
			n, err := parseSize(v)
			if err != nil {
				d.errorf(key, "bad size %q: %v", v, err)
				return
			}
			*dst = n
		default:
			d.errorf(key, "want a size like \"4MiB\" or an integer number of bytes, got %s", describe(v))
		}
	}
}

func (d *decoder) str(dst *string) field {
	return func(key string, v any) {
		s, ok := v.(string)
		if !ok {
			d.errorf(key, "want a string, got %s", describe(v))
			return
		}
		*dst = s
	}
}

// absPath is str for a path, made absolute from the working directory
// (as [[watch]] paths are), so that every later use (the daemon's, a
// client's from elsewhere, check-config's output) names one directory.
// An empty string is left for Validate to name.
func (d *decoder) absPath(dst *string) field {
	return func(key string, v any) {
		d.str(dst)(key, v)
		if *dst != "" {
			d.abs(key, dst)
		}
	}
}

// abs makes *p absolute (filepath.Abs); key names it in an error.
func (d *decoder) abs(key string, p *string) {
	abs, err := filepath.Abs(*p)
	if err != nil {
		d.errorf(key, "cannot make %q absolute: %v", *p, err)
		return
	}
	*p = abs
}

func (d *decoder) boolean(dst *bool) field {
	return func(key string, v any) {
		b, ok := v.(bool)
		if !ok {
			d.errorf(key, "want true or false, got %s", describe(v))
			return
		}
		*dst = b
	}
}

func (d *decoder) integer(dst *int) field {
	return func(key string, v any) {
		n, ok := v.(int64)
		if !ok {
			d.errorf(key, "want an integer, got %s", describe(v))
			return
		}
		if int64(int(n)) != n {
			d.errorf(key, "%d is out of range", n)
			return
		}
		*dst = int(n)
	}
}

// describe names a decoded TOML value's type (and value, if scalar) for
// error messages.
func describe(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("string %q", v)
	case int64:
		return fmt.Sprintf("integer %d", v)
	case float64:
		return fmt.Sprintf("float %v", v)
	case bool:
		return fmt.Sprintf("boolean %v", v)
	case map[string]any:
		return "a table"
	case []map[string]any, []any:
		return "an array"
	case time.Time:
		return "a datetime"
	default:
		return fmt.Sprintf("a %T", v)
	}
}

var sizeUnits = map[string]int64{
	"": 1, "B": 1,
	"K": 1 << 10, "KiB": 1 << 10,
	"M": 1 << 20, "MiB": 1 << 20,
	"G": 1 << 30, "GiB": 1 << 30,
}

// parseSize parses a whole number of bytes with an optional binary unit
// (see the package documentation).
// ParseSize parses a size as the configuration writes one: a whole number
// of bytes with an optional binary unit, "B", "KiB" or "K", "MiB" or "M",
// "GiB" or "G" (case-sensitive; "KB" and "MB" are refused as ambiguous).
// The error says what is wrong ("too large", a fraction, an unknown unit).
func ParseSize(s string) (int64, error) { return parseSize(s) }

func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	j := 0
	for j < len(t) && '0' <= t[j] && t[j] <= '9' {
		j++
	}
	if j == 0 {
		return 0, errors.New(`want a whole number with an optional unit B, KiB, MiB or GiB, e.g. "4MiB"`)
	}
	unit := strings.TrimSpace(t[j:])
	mult, ok := sizeUnits[unit]
	switch {
	case ok:
	case strings.HasPrefix(unit, "."):
		return 0, errors.New(`fractions are not allowed: write a whole number, in a smaller unit if need be ("1536KiB", not "1.5MiB")`)
	case slices.Contains([]string{"kB", "KB", "MB", "GB", "kb", "mb", "gb"}, unit):
		return 0, fmt.Errorf("ambiguous unit %q (powers of 1000 or of 1024?): write KiB, MiB or GiB (powers of 1024), or a number of bytes", unit)
	default:
		return 0, fmt.Errorf("unknown unit %q, want B, KiB, MiB or GiB (K, M, G also mean KiB, MiB, GiB)", unit)
	}
	n, err := strconv.ParseInt(t[:j], 10, 64)
	if err != nil || n > math.MaxInt64/mult {
		return 0, errors.New("too large")
	}
	return n * mult, nil
}

// formatSize writes n bytes with the largest binary unit that divides it.
func formatSize(n int64) string {
	if n == 0 {
		return "0"
	}
	for _, u := range []struct {
		name string
		mult int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// joinKey appends the TOML key part k to the dotted key prefix, quoting k
// unless it is a bare key.
func joinKey(prefix, k string) string {
	if !isBareKey(k) {
		k = strconv.Quote(k)
	}
	if prefix == "" {
		return k
	}
	return prefix + "." + k
}

func isBareKey(k string) bool {
	if k == "" {
		return false
	}
	for _, r := range k {
		if !isBareChar(r) {
			return false
		}
	}
	return true
}

func isBareChar(r rune) bool {
	return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '_' || r == '-'
}
