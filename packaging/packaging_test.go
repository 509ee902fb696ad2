package packaging

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"flusherd/config"
	"flusherd/internal/testfs"
)

// The files of the Debian package, with their modes; directories are all
// 0755 and everything belongs to root:root. The README and the documents
// of docs/ are added by docsInDeb.
var debFiles = map[string]os.FileMode{
	"./usr/sbin/flusherd":                                                  0o755,
	"./lib/systemd/system/flusherd.service":                                0o644,
	"./etc/flusherd/flusherd.toml":                                         0o644,
	"./usr/share/doc/flusherd/flusherd-metrics.conf":                       0o644,
	"./usr/share/doc/flusherd/docs/storm.png":                              0o644,
	"./usr/share/doc/flusherd/copyright":                                   0o644,
	"./usr/share/doc/flusherd/changelog.gz":                                0o644,
	"./usr/share/doc/flusherd/examples/prometheus/flusherd-rules.yml":      0o644,
	"./usr/share/doc/flusherd/examples/prometheus/flusherd-rules.test.yml": 0o644,
	"./usr/share/lintian/overrides/flusherd":                               0o644,
	"./usr/share/man/man8/flusherd.8.gz":                                   0o644,
	"./usr/share/man/man5/flusherd.toml.5.gz":                              0o644,
	"./usr/share/bash-completion/completions/flusherd":                     0o644,
	"./usr/share/zsh/vendor-completions/_flusherd":                         0o644,
	"./usr/share/fish/vendor_completions.d/flusherd.fish":                  0o644,
}

// docsInDeb returns the README's and docs/*.md's paths in the package,
// each with its source: gzipped when over 4 KiB, as dh_compress does.
func docsInDeb(t *testing.T) map[string]string {
	t.Helper()
	mds, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(mds) < 6 {
		t.Fatalf("docs/ has only %q", mds)
	}
	docs := map[string]string{}
	for _, src := range append(mds, "../README.md") {
		fi, err := os.Stat(src)
		if err != nil {
			t.Fatal(err)
		}
		p := "./usr/share/doc/flusherd/" + strings.TrimPrefix(src, "../")
		if fi.Size() > 4096 {
			p += ".gz"
		}
		docs[p] = src
	}
	return docs
}

// The maintainer that the tests build the package with (DEBFULLNAME and
// DEBEMAIL).
const (
	testMaintainerName = "Package Test"
	testMaintainerMail = "package-test@example.org"
)

var (
	debOnce sync.Once
	debPath string
	debErr  error
)

// needTools skips the test when a tool is missing, or fails it under
// CI=true, naming the Debian package that has it.
func needTools(t *testing.T, tools map[string]string) {
	t.Helper()
	for tool, pkg := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s (Debian package %s) is needed to build and check the Debian package: %v", tool, pkg, err)
			}
			t.Skipf("%s (Debian package %s) not found; skipping", tool, pkg)
		}
	}
}

// builtDeb builds the package with build-deb.sh once for the tests of this
// package (as testMaintainer) and returns its path. It needs dpkg-deb and
// dpkg, and is skipped with -short.
func builtDeb(t *testing.T) string {
	t.Helper()
	needTools(t, map[string]string{"dpkg-deb": "dpkg", "dpkg": "dpkg"})
	testfs.SkipShort(t, "builds the Debian package")
	debOnce.Do(func() {
		outdir, err := os.MkdirTemp("", "flusherd-packaging-deb")
		if err != nil {
			debErr = err
			return
		}
		cmd := exec.Command("bash", "build-deb.sh", outdir)
		cmd.Env = append(os.Environ(), "DEBFULLNAME="+testMaintainerName, "DEBEMAIL="+testMaintainerMail)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			debErr = fmt.Errorf("build-deb.sh: %v\n%s", err, stderr.String())
			return
		}
		debPath = strings.TrimSpace(string(out))
		if ents, _ := os.ReadDir(outdir); len(ents) != 1 || filepath.Join(outdir, ents[0].Name()) != debPath {
			debErr = fmt.Errorf("build-deb.sh printed %q; OUTDIR holds %v", debPath, ents)
		}
	})
	if debErr != nil {
		t.Fatal(debErr)
	}
	return debPath
}

var debControlFiles = map[string]os.FileMode{
	"control":   0o644,
	"conffiles": 0o644,
	"md5sums":   0o644,
	"postinst":  0o755,
	"prerm":     0o755,
	"postrm":    0o755,
}

// splitConfig splits a configuration file into its header (the comment
// lines before the first table), its body (from the first table up to the
// line watchLine) and the watch block (from watchLine to the end).
func splitConfig(t *testing.T, name, watchLine string) (header, body, watch []string) {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	first := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "[") })
	w := slices.Index(lines, watchLine)
	if first < 0 || w < first {
		t.Fatalf("%s: want the tables, then a line %q: not found", name, watchLine)
	}
	return lines[:first], lines[first:w], lines[w:]
}

// TestPackagedConfig checks that packaging/flusherd.toml, the package's
// conffile, is systemd/flusherd.toml with the [[watch]] entry commented
// out and its own header: every setting and comment is the same.
func TestPackagedConfig(t *testing.T) {
	_, exBody, exWatch := splitConfig(t, "../systemd/flusherd.toml", "[[watch]]")
	pkHeader, pkBody, pkWatch := splitConfig(t, "flusherd.toml", "#[[watch]]")

	if d := lineDiff(exBody, pkBody); d != "" {
		t.Errorf("packaging/flusherd.toml differs from systemd/flusherd.toml before [[watch]] (copy the change over):\n%s", d)
	}
	var commented []string
	for _, l := range exWatch {
		if l != "" {
			l = "#" + l
		}
		commented = append(commented, l)
	}
	if d := lineDiff(commented, pkWatch); d != "" {
		t.Errorf("packaging/flusherd.toml: the [[watch]] block is not systemd/flusherd.toml's, commented out line by line:\n%s", d)
	}

	var text []string
	for _, l := range pkHeader {
		if !strings.HasPrefix(l, "#") && l != "" {
			t.Errorf("packaging/flusherd.toml: header line %q is not a comment", l)
		}
		text = append(text, strings.Fields(strings.TrimPrefix(l, "#"))...)
	}
	joined := strings.Join(text, " ")
	for _, want := range []string{
		"No directory tree is watched until you add a [[watch]] entry",
		"flusherd check-config /etc/flusherd/flusherd.toml",
		"/etc/flusherd/flusherd.d/NAME.toml",
		"systemctl reload flusherd",
		`Durations need a unit ("500ms", "5s"); sizes take B, KiB, MiB or GiB.`,
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("packaging/flusherd.toml: the header does not say %q", want)
		}
	}

	// The same settings, and no tree.
	parse := func(name string) *config.Config {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		c, err := config.Parse(name, data)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ex, pk := parse("../systemd/flusherd.toml"), parse("flusherd.toml")
	if len(pk.Watch) != 0 {
		t.Errorf("packaging/flusherd.toml has %d [[watch]] entries; want none", len(pk.Watch))
	}
	if ex.Writeback != pk.Writeback || ex.Plug != pk.Plug || ex.Watcher != pk.Watcher ||
		ex.Stats != pk.Stats || ex.Log != pk.Log || ex.Metrics != pk.Metrics {
		t.Errorf("packaging/flusherd.toml and systemd/flusherd.toml parse to different settings:\n%+v\n%+v", pk, ex)
	}
}

// lineDiff describes the first line where got differs from want, or
// returns "".
func lineDiff(want, got []string) string {
	line := func(ls []string, i int) string {
		if i >= len(ls) {
			return "(end)"
		}
		return strconv.Quote(ls[i])
	}
	for i := range max(len(want), len(got)) {
		if i >= len(want) || i >= len(got) || want[i] != got[i] {
			return fmt.Sprintf("line %d of the part: want %s, got %s", i+1, line(want, i), line(got, i))
		}
	}
	return ""
}

func TestMain(m *testing.M) {
	code := m.Run()
	if debPath != "" {
		os.RemoveAll(filepath.Dir(debPath))
	}
	os.Exit(code)
}

// TestDeb builds the package with build-deb.sh and checks its files, their
// modes and owners, its control fields, conffiles and maintainer scripts,
// and the unit, configuration, man pages and binary in it.
func TestDeb(t *testing.T) {
	deb := builtDeb(t)
	debFiles := maps.Clone(debFiles)
	docs := docsInDeb(t)
	for p := range docs {
		debFiles[p] = 0o644
	}

	dpkgDeb := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("dpkg-deb", args...).Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				err = errors.New(err.Error() + ": " + string(ee.Stderr))
			}
			t.Fatalf("dpkg-deb %s: %v", strings.Join(args, " "), err)
		}
		return string(out)
	}

	// Control fields and the file name.
	field := func(name string) string { return strings.TrimSpace(dpkgDeb("-f", deb, name)) }
	version := field("Version")
	if !regexp.MustCompile(`^[0-9][A-Za-z0-9.+~]*$`).MatchString(version) {
		t.Errorf("Version %q is not a Debian version without a revision", version)
	}
	if err := exec.Command("git", "rev-parse", "HEAD").Run(); err != nil {
		if version != "0.0.0" {
			t.Errorf("Version %q outside a git checkout; want 0.0.0", version)
		}
	} else if err := exec.Command("git", "describe", "--tags").Run(); err != nil {
		// No tag: 0.0~git<commit date>.<commit>.
		if !regexp.MustCompile(`^0\.0~git[0-9]{8}\.[0-9]{6}\.[0-9a-f]{7,}(\.dirty)?$`).MatchString(version) {
			t.Errorf("Version %q of a checkout without tags; want 0.0~gitYYYYMMDD.hhmmss.<commit>[.dirty]", version)
		}
	}
	archOut, err := exec.Command("dpkg", "--print-architecture").Output()
	if err != nil {
		t.Fatal(err)
	}
	arch := strings.TrimSpace(string(archOut))
	if want := "flusherd_" + version + "_" + arch + ".deb"; filepath.Base(deb) != want {
		t.Errorf("package file %s; want %s", filepath.Base(deb), want)
	}
	for name, want := range map[string]string{
		"Package":      "flusherd",
		"Architecture": arch,
		"Maintainer":   testMaintainerName + " <" + testMaintainerMail + ">",
		"Recommends":   "systemd",
		"Depends":      "",
		"Pre-Depends":  "",
		"Section":      "admin",
		"Priority":     "optional",
	} {
		if got := field(name); got != want {
			t.Errorf("control field %s: %q; want %q", name, got, want)
		}
	}
	if d := field("Description"); !strings.HasPrefix(d, "userspace writeback flusher") || !strings.Contains(d, "\n") {
		t.Errorf("Description %q: want a synopsis and a long description", d)
	}
	if got := strings.TrimSpace(dpkgDeb("-I", deb, "conffiles")); got != "/etc/flusherd/flusherd.toml" {
		t.Errorf("conffiles: %q; want /etc/flusherd/flusherd.toml", got)
	}
	info := dpkgDeb("-I", deb)
	for name := range debControlFiles {
		if !regexp.MustCompile(`(?m)^ +[0-9]+ bytes, +[0-9]+ lines +\*? +` + name + `\b`).MatchString(info) {
			t.Errorf("dpkg-deb -I does not list the control file %s:\n%s", name, info)
		}
	}

	// The files: the listing of dpkg-deb -c, every entry root:root.
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(dpkgDeb("-c", deb)), "\n") {
		f := strings.Fields(l)
		if len(f) != 6 {
			t.Errorf("dpkg-deb -c: unexpected line %q", l)
			continue
		}
		perm, owner, name := f[0], f[1], f[5]
		seen[name] = true
		if owner != "root/root" {
			t.Errorf("%s belongs to %s; want root/root", name, owner)
		}
		switch mode, ok := debFiles[name]; {
		case strings.HasSuffix(name, "/"):
			if perm != "drwxr-xr-x" {
				t.Errorf("directory %s: %s; want drwxr-xr-x", name, perm)
			}
		case !ok:
			t.Errorf("unexpected file in the package: %s", name)
		case perm != "-"+mode.String()[1:]:
			t.Errorf("%s: %s; want -%s", name, perm, mode.String()[1:])
		}
	}
	for name := range debFiles {
		if !seen[name] {
			t.Errorf("%s is not in the package", name)
		}
	}
	for name := range debFiles {
		// Its directories: ./usr/sbin/flusherd needs ./usr/sbin/, ./usr/, ./
		for d := name; d != "."; {
			d = d[:strings.LastIndex(d, "/")]
			if !seen[d+"/"] {
				t.Errorf("directory %s/ is not in the package", d)
				seen[d+"/"] = true // once
			}
		}
	}

	// The control files' modes, and the maintainer scripts' syntax.
	ctrl := readTar(t, "--ctrl-tarfile", deb)
	for name, mode := range debControlFiles {
		f, ok := ctrl["./"+name]
		switch {
		case !ok:
			t.Errorf("control file %s is missing", name)
		case f.mode != mode || f.uid != 0 || f.gid != 0:
			t.Errorf("control file %s: mode %v, owner %d:%d; want %v, 0:0", name, f.mode, f.uid, f.gid, mode)
		}
	}
	for _, name := range []string{"postinst", "prerm", "postrm"} {
		want, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if got := ctrl["./"+name].data; !bytes.Equal(got, want) {
			t.Errorf("control file %s is not packaging/%s", name, name)
		}
	}

	// The contents.
	files := readTar(t, "--fsys-tarfile", deb)
	unit, err := os.ReadFile("../systemd/flusherd.service")
	if err != nil {
		t.Fatal(err)
	}
	wantUnit := strings.Replace(string(unit), "\nExecStart=/usr/local/bin/flusherd ", "\nExecStart=/usr/sbin/flusherd ", 1)
	gotUnit := string(files["./lib/systemd/system/flusherd.service"].data)
	if !strings.Contains(gotUnit, "\nExecStart=/usr/sbin/flusherd run --config /etc/flusherd/flusherd.toml\n") {
		t.Errorf("the packaged unit has no line ExecStart=/usr/sbin/flusherd run --config /etc/flusherd/flusherd.toml")
	}
	if gotUnit != wantUnit {
		t.Errorf("the packaged unit is not systemd/flusherd.service with ExecStart=/usr/sbin/flusherd")
	}
	sources := map[string]string{
		"./etc/flusherd/flusherd.toml":                                         "flusherd.toml",
		"./usr/share/doc/flusherd/flusherd-metrics.conf":                       "../systemd/flusherd-metrics.conf",
		"./usr/share/doc/flusherd/docs/storm.png":                              "../docs/storm.png",
		"./usr/share/doc/flusherd/examples/prometheus/flusherd-rules.yml":      "../deploy/prometheus/flusherd-rules.yml",
		"./usr/share/doc/flusherd/examples/prometheus/flusherd-rules.test.yml": "../deploy/prometheus/flusherd-rules.test.yml",
		"./usr/share/lintian/overrides/flusherd":                               "lintian-overrides",
	}
	maps.Copy(sources, docs)
	for pkgPath, src := range sources {
		want, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		got := files[pkgPath].data
		if strings.HasSuffix(pkgPath, ".gz") {
			got = gunzip(t, pkgPath, got)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s in the package is not %s", pkgPath, src)
		}
	}
	// The changelog: one entry for this version, signed by the maintainer
	// and dated with the commit's time.
	changelog := string(gunzip(t, "changelog.gz", files["./usr/share/doc/flusherd/changelog.gz"].data))
	if want := "flusherd (" + version + ") unstable; urgency=medium\n\n  * Package of the flusherd source "; !strings.HasPrefix(changelog, want) {
		t.Errorf("changelog.gz does not start with %q:\n%s", want, changelog)
	}
	trailer := regexp.MustCompile(`\n -- (.*)  ((Mon|Tue|Wed|Thu|Fri|Sat|Sun), [0-9]{2} [A-Z][a-z]{2} [0-9]{4} [0-9:]{8} \+0000)\n$`).FindStringSubmatch(changelog)
	if trailer == nil || trailer[1] != testMaintainerName+" <"+testMaintainerMail+">" {
		t.Errorf("changelog.gz does not end with the line \" -- %s <%s>  <date>\":\n%s", testMaintainerName, testMaintainerMail, changelog)
	}
	copyright := string(files["./usr/share/doc/flusherd/copyright"].data)
	if !strings.Contains(copyright, "==== Go go1.") {
		t.Errorf("copyright does not give Go's license")
	}
	for _, mod := range []string{"github.com/BurntSushi/toml", "go.uber.org/zap", "golang.org/x/sys"} {
		if !strings.Contains(copyright, "==== "+mod+" ") {
			t.Errorf("copyright does not give the license of %s", mod)
		}
	}
	for pkgPath, title := range map[string]string{
		"./usr/share/man/man8/flusherd.8.gz":      ".TH flusherd 8 ",
		"./usr/share/man/man5/flusherd.toml.5.gz": ".TH flusherd.toml 5 ",
	} {
		page := gunzip(t, pkgPath, files[pkgPath].data)
		if !strings.Contains(string(page), "\n"+title) || !strings.Contains(string(page), `"flusherd `+version+`"`) {
			t.Errorf("%s: no title line %q... with the version %s", pkgPath, title, version)
		}
	}
	md5sums := string(ctrl["./md5sums"].data)
	for name := range debFiles {
		if !strings.Contains(md5sums, "  "+strings.TrimPrefix(name, "./")+"\n") {
			t.Errorf("md5sums does not list %s", name)
		}
	}

	// The binary: static, and it knows its version.
	bin := filepath.Join(t.TempDir(), "flusherd")
	if err := os.WriteFile(bin, files["./usr/sbin/flusherd"].data, 0o755); err != nil {
		t.Fatal(err)
	}
	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("/usr/sbin/flusherd has a program interpreter: it is not static")
		}
	}
	ef.Close()
	if out, err := exec.Command(bin, "version").Output(); err != nil || string(out) != "flusherd "+version+"\n" {
		t.Errorf("flusherd version: %q, %v; want \"flusherd %s\"", out, err, version)
	}
}

// gunzip returns the gzip data's content.
func gunzip(t *testing.T, name string, data []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return out
}

type tarFile struct {
	mode     os.FileMode
	uid, gid int
	data     []byte
}

// readTar reads the control or data archive of a package (dpkg-deb
// --ctrl-tarfile or --fsys-tarfile) into memory.
func readTar(t *testing.T, which, deb string) map[string]tarFile {
	t.Helper()
	out, err := exec.Command("dpkg-deb", which, deb).Output()
	if err != nil {
		t.Fatalf("dpkg-deb %s: %v", which, err)
	}
	files := map[string]tarFile{}
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatalf("dpkg-deb %s: %v", which, err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = tarFile{mode: h.FileInfo().Mode().Perm(), uid: h.Uid, gid: h.Gid, data: data}
	}
}

// TestMaintainerScripts runs the maintainer scripts with DPKG_ROOT set (so
// they leave the running systemd alone) and stand-ins for
// deb-systemd-helper, deb-systemd-invoke and systemctl that log their
// arguments.
func TestMaintainerScripts(t *testing.T) {
	dir := t.TempDir()
	root, bin, logf := filepath.Join(dir, "root"), filepath.Join(dir, "bin"), filepath.Join(dir, "calls")
	for _, d := range []string{root, bin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tool := range []string{"deb-systemd-helper", "deb-systemd-invoke", "systemctl"} {
		stub := "#!/bin/sh\necho \"" + tool + " $*\" >>\"$CALLS\"\n"
		if err := os.WriteFile(filepath.Join(bin, tool), []byte(stub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run := func(script string, args ...string) []string {
		t.Helper()
		os.Remove(logf)
		cmd := exec.Command("sh", append([]string{"-e", script}, args...)...)
		cmd.Env = append(os.Environ(), "DPKG_ROOT="+root, "CALLS="+logf,
			"PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
			t.Fatalf("%s %s: %v, output %q", script, strings.Join(args, " "), err, out)
		}
		data, _ := os.ReadFile(logf)
		return strings.Split(strings.TrimSpace(string(data)), "\n")
	}
	want := func(what string, got, want []string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Errorf("%s: calls %q; want %q", what, got, want)
		}
	}

	want("postinst configure (first install)", run("postinst", "configure", ""), []string{
		"deb-systemd-helper unmask flusherd.service",
		"deb-systemd-helper --quiet was-enabled flusherd.service",
		"deb-systemd-helper enable flusherd.service",
	})
	want("prerm remove", run("prerm", "remove"), []string{""})
	want("postrm remove", run("postrm", "remove"), []string{""})

	mk := func(p string) {
		t.Helper()
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mk("run/flusherd/bdi/8:0/stats")
	mk("run/flusherd/flusherd.lock")
	if err := os.MkdirAll(filepath.Join(root, "etc/flusherd"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The postrm runs deb-systemd-helper only if /usr/bin/deb-systemd-helper
	// is there (init-system-helpers may be gone by then), as debhelper's
	// snippet does; the call goes to the stand-in on PATH.
	purgeCalls := []string{""}
	if fi, err := os.Stat("/usr/bin/deb-systemd-helper"); err == nil && fi.Mode()&0o111 != 0 {
		purgeCalls = []string{"deb-systemd-helper purge flusherd.service"}
	}
	want("postrm purge", run("postrm", "purge"), purgeCalls)
	for _, p := range []string{"etc/flusherd", "run/flusherd"} {
		if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after postrm purge, /%s: %v; want it gone", p, err)
		}
	}
	// A file of the administrator's keeps /etc/flusherd.
	mk("etc/flusherd/local.toml")
	run("postrm", "purge")
	if _, err := os.Stat(filepath.Join(root, "etc/flusherd/local.toml")); err != nil {
		t.Errorf("postrm purge removed a file it does not own: %v", err)
	}
	// Another daemon's claim on its tree (every daemon's claims are in
	// /run/flusherd/trees) stays; the rest of /run/flusherd goes.
	claim := "run/flusherd/trees/8:1:2-0123456789abcdef"
	mk(claim)
	mk("run/flusherd/bdi/8:0/stats")
	mk("run/flusherd/flusherd.sock")
	run("postrm", "purge")
	if _, err := os.Stat(filepath.Join(root, claim)); err != nil {
		t.Errorf("postrm purge removed another daemon's tree claim: %v", err)
	}
	for _, p := range []string{"run/flusherd/bdi", "run/flusherd/flusherd.sock"} {
		if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after postrm purge, /%s: %v; want it gone", p, err)
		}
	}
}

// docKeyTerm is a key's definition in flusherd.toml(5): "**table.key** = ".
var docKeyTerm = regexp.MustCompile(`(?m)^\*\*([a-z]+)\.([a-z_]+)\*\* = `)

// TestPackagedConfigHasEveryKey: every key that flusherd.toml(5) defines
// is in the packaged file, set or commented out, so that the file shows
// every setting there is (the man page says it does).
func TestPackagedConfigHasEveryKey(t *testing.T) {
	doc, err := os.ReadFile("../doc/flusherd.toml.5.md")
	if err != nil {
		t.Fatal(err)
	}
	pk, err := os.ReadFile("flusherd.toml")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range docKeyTerm.FindAllStringSubmatch(string(doc), -1) {
		n++
		if !regexp.MustCompile(`(?m)^#?` + m[2] + ` *=`).Match(pk) {
			t.Errorf("packaging/flusherd.toml has no line for %s.%s (set, or commented out)", m[1], m[2])
		}
	}
	if n < 20 {
		t.Fatalf("only %d keys found in doc/flusherd.toml.5.md", n)
	}
}

// TestMaintainerScriptsNoSystemctl: the maintainer scripts leave the
// unit's state to deb-systemd-helper and deb-systemd-invoke, as debhelper's
// snippets do; systemctl is only called for daemon-reload (what lintian's
// maintainer-script-calls-systemctl allows).
func TestMaintainerScriptsNoSystemctl(t *testing.T) {
	for _, name := range []string{"postinst", "prerm", "postrm"} {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "#") {
				continue
			}
			if regexp.MustCompile(`\bsystemctl\b`).MatchString(l) && !strings.Contains(l, "systemctl --system daemon-reload >/dev/null || true") {
				t.Errorf("packaging/%s:%d calls systemctl for more than daemon-reload: %q", name, i+1, l)
			}
		}
	}
}

// lintianTag is a line of lintian's output: "E: flusherd: tag [info]" (E
// error, W warning, I info, P pedantic, X experimental, O overridden).
var lintianTag = regexp.MustCompile(`^([EWIPXO]): flusherd(?: [a-z]+)?: (\S+)(.*)$`)

// TestLintian runs lintian on the package that build-deb.sh makes: no
// error and no warning may be reported, and every override of
// packaging/lintian-overrides must be used and give its reason (comment
// lines above it).
func TestLintian(t *testing.T) {
	needTools(t, map[string]string{"lintian": "lintian"})
	deb := builtDeb(t)
	cmd := exec.Command("lintian", "--display-info", "--show-overrides", "--fail-on", "none", deb)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("lintian: %v\n%s", err, out)
	}
	t.Logf("lintian --display-info --show-overrides %s:\n%s", filepath.Base(deb), out)
	overridden := 0
	for _, l := range strings.Split(string(out), "\n") {
		m := lintianTag.FindStringSubmatch(l)
		switch {
		case m == nil:
		case m[1] == "E" || m[1] == "W":
			t.Errorf("lintian: %s", l)
		case m[2] == "unused-override" || m[2] == "mismatched-override":
			t.Errorf("lintian: %s (packaging/lintian-overrides)", l)
		case m[1] == "O":
			overridden++
		}
	}

	// Each override has its reason above it.
	data, err := os.ReadFile("lintian-overrides")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	n := 0
	for i, l := range lines {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		n++
		if !strings.HasPrefix(l, "flusherd: ") {
			t.Errorf("packaging/lintian-overrides:%d: %q is not \"flusherd: tag [context]\"", i+1, l)
		}
		if i == 0 || !strings.HasPrefix(lines[i-1], "# ") {
			t.Errorf("packaging/lintian-overrides:%d: the override %q has no reason (a comment right above it)", i+1, l)
		}
	}
	if overridden != n {
		t.Errorf("lintian reports %d overridden tags; packaging/lintian-overrides has %d overrides", overridden, n)
	}
}

// intrawordEmphasis finds italics or bold that start inside a word in
// roff, as go-md2man makes of underscores or asterisks in a name
// (vm.dirty_background_* became vm.dirty\fIbackground\fP*).
// Font changes are first replaced by one byte: \x01 for \fP and \fR, \x02
// for \fI and \fB, so that a font change right after another is no match.
var (
	fontEnd, fontStart = regexp.MustCompile(`\\f[PR]`), regexp.MustCompile(`\\f[IB]`)
	intrawordEmphasis  = regexp.MustCompile("[A-Za-z0-9.]\x02")
)

// TestManPagesRender renders the package's man pages with
// `man --warnings` as lintian does: groff must print no warning, and no
// emphasis may start inside a word.
func TestManPagesRender(t *testing.T) {
	needTools(t, map[string]string{"man": "man-db"})
	deb := builtDeb(t)
	files := readTar(t, "--fsys-tarfile", deb)
	dir := t.TempDir()
	for _, page := range []string{"./usr/share/man/man8/flusherd.8.gz", "./usr/share/man/man5/flusherd.toml.5.gz"} {
		f, ok := files[page]
		if !ok {
			t.Errorf("%s is not in the package", page)
			continue
		}
		p := filepath.Join(dir, filepath.Base(page))
		if err := os.WriteFile(p, f.data, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("man", "--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z", p)
		cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8", "MANROFFSEQ=", "MANWIDTH=80")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil || stderr.Len() > 0 {
			t.Errorf("man --warnings -l %s: %v\n%s", page, err, stderr.String())
		}
		for i, l := range strings.Split(string(gunzip(t, page, f.data)), "\n") {
			if intrawordEmphasis.MatchString(fontStart.ReplaceAllString(fontEnd.ReplaceAllString(l, "\x01"), "\x02")) {
				t.Errorf("%s:%d: emphasis starts inside a word (an unescaped _ or * in doc/): %q", page, i+1, l)
			}
		}
	}
}

// TestBuildDebMaintainer: build-deb.sh refuses a maintainer address that
// lintian would call bogus, before it builds anything.
func TestBuildDebMaintainer(t *testing.T) {
	for _, env := range [][]string{
		{"DEBEMAIL=flusherd@localhost"},
		{"DEBEMAIL=flusherd@host.localdomain"},
		{"DEBEMAIL=flusherd"},
		{"DEBEMAIL=Name <flusherd@localhost>"},
		{"DEBEMAIL=<flusherd@example.org>"},
		{"DEBFULLNAME=Name", "DEBEMAIL=flusherd@mail.local"},
	} {
		cmd := exec.Command("bash", "build-deb.sh", t.TempDir())
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Errorf("build-deb.sh with %q succeeded; want a refusal", env)
			continue
		}
		if !strings.Contains(string(out), "set DEBFULLNAME and DEBEMAIL") {
			t.Errorf("build-deb.sh with %q: %v\n%s\nwant the message naming DEBFULLNAME and DEBEMAIL", env, err, out)
		}
	}
}
