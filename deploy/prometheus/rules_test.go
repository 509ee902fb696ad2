package prometheus

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"flusherd/internal/testfs"
	"flusherd/metrics"
	"flusherd/watch"
)

const (
	rulesFile = "flusherd-rules.yml"
	testsFile = "flusherd-rules.test.yml"
)

// promtool returns the path of promtool: under CI=true a missing promtool
// fails the test, elsewhere it skips it.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("promtool (Debian package prometheus) is needed to check the Prometheus rules: %v", err)
		}
		t.Skipf("promtool not found (Debian package prometheus); skipping: %v", err)
	}
	return p
}

// runPromtool runs promtool with args in dir and returns its output and
// whether it exited 0.
func runPromtool(t *testing.T, bin, dir string, args ...string) (string, bool) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("promtool %s: %v", strings.Join(args, " "), err)
	}
	return string(out), err == nil
}

// rule is one rule of the rules file, as read by readRules.
type rule struct {
	kind, name string // kind: "record" or "alert"
	expr       string
	// The lines of the file (0-based) that hold the expr key and its
	// value (exprStart up to, not including, exprEnd), and the for key's
	// line (-1: none).
	exprStart, exprEnd, forLine int
}

var (
	ruleStart = regexp.MustCompile(`^( *)- (record|alert): *(\S+)\s*$`)
	keyLine   = regexp.MustCompile(`^( *)(expr|for): *(.*)$`)
)

func indent(l string) int { return len(l) - len(strings.TrimLeft(l, " ")) }

// readRules reads the rules from the rules file's lines. It knows the
// file's layout only: one "- record:" or "- alert:" line per rule, then
// its expr, inline or as a "|" block, and its for.
func readRules(t *testing.T, lines []string) []rule {
	t.Helper()
	var rules []rule
	for i, l := range lines {
		m := ruleStart.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		r := rule{kind: m[2], name: m[3], exprStart: -1, forLine: -1}
		for j := i + 1; j < len(lines); j++ {
			l := lines[j]
			if s := strings.TrimSpace(l); s == "" || strings.HasPrefix(s, "#") {
				continue
			}
			if indent(l) <= len(m[1]) {
				break // the next rule, or the next group
			}
			km := keyLine.FindStringSubmatch(l)
			if km == nil || len(km[1]) != len(m[1])+2 {
				continue // not a key of this rule
			}
			if km[2] == "for" {
				r.forLine = j
				continue
			}
			r.exprStart, r.exprEnd = j, j+1
			if v := strings.TrimSpace(km[3]); v != "|" && v != "|-" {
				r.expr = v
				continue
			}
			var block []string
			for ; r.exprEnd < len(lines); r.exprEnd++ {
				b := lines[r.exprEnd]
				if strings.TrimSpace(b) != "" && indent(b) <= len(km[1]) {
					break
				}
				block = append(block, strings.TrimSpace(b))
			}
			r.expr = strings.TrimSpace(strings.Join(block, " "))
		}
		if r.exprStart < 0 || r.expr == "" {
			t.Fatalf("%s: this test finds no expr for the rule %s", rulesFile, r.name)
		}
		rules = append(rules, r)
	}
	if len(rules) == 0 {
		t.Fatalf("%s: no rule found", rulesFile)
	}
	return rules
}

func rulesLines(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(string(data), "\n")
}

// TestRulesPromtool runs `promtool check rules` on the rules and `promtool
// test rules` on their tests; both must pass. It also checks that this
// file's reading of the rules (used by the other tests) finds as many as
// promtool does, and every alert the issue asks for.
func TestRulesPromtool(t *testing.T) {
	bin := promtool(t)
	out, ok := runPromtool(t, bin, ".", "check", "rules", rulesFile)
	if !ok {
		t.Fatalf("promtool check rules %s failed:\n%s", rulesFile, out)
	}
	t.Logf("promtool check rules %s:\n%s", rulesFile, out)
	rules := readRules(t, rulesLines(t))
	if m := regexp.MustCompile(`SUCCESS: (\d+) rules found`).FindStringSubmatch(out); m == nil || m[1] != strconv.Itoa(len(rules)) {
		t.Errorf("promtool check rules says %q; this test reads %d rules", strings.TrimSpace(out), len(rules))
	}
	var alerts []string
	for _, r := range rules {
		if r.kind == "alert" {
			alerts = append(alerts, r.name)
		}
	}
	for _, want := range []string{"FlusherdDown", "FlusherdDirtyDataTooOld", "FlusherdStuckCalls",
		"FlusherdFilesFailed", "FlusherdFilesBlocked", "FlusherdDeviceProbing"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("%s has no alert %s (alerts: %q)", rulesFile, want, alerts)
		}
	}
	out, ok = runPromtool(t, bin, ".", "test", "rules", testsFile)
	if !ok {
		t.Fatalf("promtool test rules %s failed:\n%s", testsFile, out)
	}
	t.Logf("promtool test rules %s:\n%s", testsFile, out)
}

// TestRulesTestsCanFail checks that the promtool tests test every rule:
// with a rule's expression replaced by one that yields nothing, and, for
// an alert, by one that always fires, or with its for set to 0s,
// `promtool test rules` must fail.
func TestRulesTestsCanFail(t *testing.T) {
	bin := promtool(t)
	testfs.SkipShort(t, "runs promtool 30 times")
	lines := rulesLines(t)
	rules := readRules(t, lines)
	tests, err := os.ReadFile(testsFile)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, testsFile), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	mutate := func(r rule, what string, edit func([]string) []string) {
		t.Helper()
		mutated := edit(slices.Clone(lines))
		if err := os.WriteFile(filepath.Join(dir, rulesFile), []byte(strings.Join(mutated, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
		out, ok := runPromtool(t, bin, dir, "test", "rules", testsFile)
		switch {
		case ok:
			t.Errorf("%s: with %s, promtool test rules still passes: the tests do not check it\n%s", r.name, what, out)
		case !strings.Contains(out, "exp:") || !strings.Contains(out, "got:"):
			// Not a failed expectation: the mutated file did not load.
			t.Fatalf("%s with %s: promtool test rules failed without a failed expectation:\n%s", r.name, what, out)
		}
	}
	setExpr := func(r rule, expr string) func([]string) []string {
		return func(ls []string) []string {
			key := strings.Repeat(" ", indent(ls[r.exprStart])) + "expr: " + expr
			return slices.Replace(ls, r.exprStart, r.exprEnd, key)
		}
	}
	for _, r := range rules {
		mutate(r, "an expr that yields nothing", setExpr(r, "vector(1) == 0"))
		if r.kind != "alert" {
			continue
		}
		mutate(r, "an expr that always fires", setExpr(r, "vector(1)"))
		if r.forLine < 0 {
			t.Errorf("alert %s has no for: it fires on the first evaluation that sees the condition", r.name)
			continue
		}
		mutate(r, "for: 0s", func(ls []string) []string {
			ls[r.forLine] = strings.Repeat(" ", indent(ls[r.forLine])) + "for: 0s"
			return ls
		})
	}
}

// exposition returns the series that flusherd's metrics registry (its
// collector, and the Go and process collectors) exports for one device
// and a watcher: the label sets of each metric family by name.
func exposition(t *testing.T) map[string][]map[string]string {
	t.Helper()
	reg := metrics.NewRegistry(source{}, 4096)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string][]map[string]string{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			ls := map[string]string{}
			for _, lp := range m.GetLabel() {
				ls[lp.GetName()] = lp.GetValue()
			}
			series[mf.GetName()] = append(series[mf.GetName()], ls)
		}
	}
	return series
}

// source is a metrics.Source with one device, all zero, and a watcher.
type source struct{}

func (source) Devices() []metrics.Device        { return []metrics.Device{{Name: "8:0"}} }
func (source) Watch() (string, *watch.Counters) { return "fanotify", &watch.Counters{} }
func (source) Trees() []metrics.Tree            { return []metrics.Tree{{Root: "/srv"}} }

var (
	// A selector with label matchers: name{...}.
	selector = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}`)
	matcher  = regexp.MustCompile(`^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"\s*$`)
	// What is not a metric name: strings, ranges, matchers, and the label
	// lists of by, without, on, ignoring, group_left and group_right.
	notNames = regexp.MustCompile(`"[^"]*"|\[[^\]]*\]|\{[^}]*\}|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	ident    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	keywords = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan"}
	// Labels the scrape adds, not the exposition.
	targetLabels = []string{"instance", "job"}
)

// TestRulesUseExportedMetrics checks every metric name in the rules'
// expressions against the daemon's exposition (a scrape of
// metrics.NewRegistry): each must be exported, recorded by a rule of the
// file, or up (Prometheus's own, per target). The values of their label
// matchers (list="failed", kind=~"blocked|fs_unavailable") must be values
// the exposition has.
func TestRulesUseExportedMetrics(t *testing.T) {
	exported := exposition(t)
	if _, ok := exported["flusherd_probing"]; !ok || len(exported) < 30 {
		t.Fatalf("the scrape has only %d metric families", len(exported))
	}
	rules := readRules(t, rulesLines(t))
	recorded := map[string]bool{}
	for _, r := range rules {
		if r.kind == "record" {
			recorded[r.name] = true
		}
	}
	used := map[string]bool{}
	for _, r := range rules {
		for _, m := range ident.FindAllStringSubmatch(notNames.ReplaceAllString(r.expr, " "), -1) {
			name := strings.TrimSpace(m[0])
			if m[1] != "" || slices.Contains(keywords, strings.ToLower(name)) {
				continue // a function or aggregation, or a keyword
			}
			used[name] = true
			switch _, ok := exported[name]; {
			case ok, name == "up":
			case strings.Contains(name, ":"):
				if !recorded[name] {
					t.Errorf("%s: %s reads %s, which no rule of the file records", rulesFile, r.name, name)
				}
			default:
				t.Errorf("%s: %s reads %s, which flusherd does not export", rulesFile, r.name, name)
			}
		}
		for _, sel := range selector.FindAllStringSubmatch(r.expr, -1) {
			name, ms := sel[1], sel[2]
			if name == "up" {
				continue
			}
			for _, ms := range strings.Split(ms, ",") {
				m := matcher.FindStringSubmatch(ms)
				if m == nil {
					t.Errorf("%s: %s: this test cannot read the matcher %q", rulesFile, r.name, ms)
					continue
				}
				label, op, value := m[1], m[2], m[3]
				if slices.Contains(targetLabels, label) {
					continue
				}
				values := map[string]bool{}
				for _, ls := range exported[name] {
					if v, ok := ls[label]; ok {
						values[v] = true
					}
				}
				if len(values) == 0 {
					t.Errorf("%s: %s matches the label %s of %s, which has no such label", rulesFile, r.name, label, name)
					continue
				}
				want := []string{value}
				if op == "=~" || op == "!~" {
					if !regexp.MustCompile(`^[A-Za-z0-9_.:-]+(\|[A-Za-z0-9_.:-]+)*$`).MatchString(value) {
						t.Errorf("%s: %s: the regular expression %q is not a list of values that this test can check", rulesFile, r.name, value)
						continue
					}
					want = strings.Split(value, "|")
				}
				for _, v := range want {
					if !values[v] {
						t.Errorf("%s: %s matches %s{%s=%q}; %s has no such value", rulesFile, r.name, name, label, v, label)
					}
				}
			}
		}
	}
	t.Logf("metrics read by the rules: %q", slices.Sorted(func(yield func(string) bool) {
		for n := range used {
			if !yield(n) {
				return
			}
		}
	}))
}
