package kubernetes

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"flusherd/config"
)

// manifest is daemonset.yaml's objects.
type manifest struct {
	ns *corev1.Namespace
	cm *corev1.ConfigMap
	ds *appsv1.DaemonSet
}

// decode reads the YAML documents of data into the API types of their
// kinds, strictly: an unknown field, a wrong type or an unknown kind is an
// error.
func decode(data []byte) (*manifest, error) {
	m := &manifest{}
	for i, doc := range bytes.Split(data, []byte("\n---\n")) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		var obj any
		switch tm.APIVersion + " " + tm.Kind {
		case "v1 Namespace":
			m.ns = &corev1.Namespace{}
			obj = m.ns
		case "v1 ConfigMap":
			m.cm = &corev1.ConfigMap{}
			obj = m.cm
		case "apps/v1 DaemonSet":
			m.ds = &appsv1.DaemonSet{}
			obj = m.ds
		default:
			return nil, fmt.Errorf("document %d: unexpected %s %s", i+1, tm.APIVersion, tm.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i+1, tm.Kind, err)
		}
	}
	if m.ns == nil || m.cm == nil || m.ds == nil {
		return nil, fmt.Errorf("want a Namespace, a ConfigMap and a DaemonSet")
	}
	return m, nil
}

func read(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile("daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestManifest: daemonset.yaml decodes strictly, and its DaemonSet is what
// docs/kubernetes.md says: the exact capabilities and not privileged, the
// seccomp profile, each tree a read-only hostPath with HostToContainer
// propagation at the path its [[watch]] entry names, the configuration
// from the ConfigMap (a valid drop-in of the image's configuration), the
// stats directory on an emptyDir, the probes on the health endpoints of
// the metrics port the image listens on, scrape annotations, requests and
// limits, and a grace period longer than shutdown_timeout.
func TestManifest(t *testing.T) {
	m, err := decode(read(t))
	if err != nil {
		t.Fatal(err)
	}
	ds := m.ds
	pod := ds.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil || sc.SeccompProfile == nil {
		t.Fatal("no securityContext with capabilities and a seccomp profile")
	}
	if sc.Privileged == nil || *sc.Privileged || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("privileged or privilege escalation not set to false")
	}
	if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		!slices.Equal(sc.Capabilities.Add, []corev1.Capability{"SYS_ADMIN", "DAC_READ_SEARCH", "FOWNER"}) {
		t.Errorf("capabilities drop %v add %v; want ALL, then SYS_ADMIN, DAC_READ_SEARCH, FOWNER", sc.Capabilities.Drop, sc.Capabilities.Add)
	}
	if sc.SeccompProfile.Type != corev1.SeccompProfileTypeLocalhost || sc.SeccompProfile.LocalhostProfile == nil ||
		*sc.SeccompProfile.LocalhostProfile != "flusherd.json" {
		t.Errorf("seccomp profile %+v; want Localhost flusherd.json (deploy/seccomp)", sc.SeccompProfile)
	}
	if pod.HostUsers == nil || !*pod.HostUsers {
		t.Error("hostUsers is not true: fanotify's capabilities count in the node's user namespace only")
	}

	// The port and the probes, against the image's metrics.listen.
	img, err := config.Load("../container/flusherd.toml")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := strings.Cut(img.Metrics.Listen, ":")
	if len(c.Ports) != 1 || strconv.Itoa(int(c.Ports[0].ContainerPort)) != port || c.Ports[0].Name != "metrics" {
		t.Errorf("ports %+v; want one named metrics, the image's metrics.listen %q", c.Ports, img.Metrics.Listen)
	}
	for _, p := range []struct {
		what  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "metrics" {
			t.Errorf("%s probe %+v; want GET %s on the metrics port", p.what, p.probe, p.path)
		}
	}
	a := ds.Spec.Template.Annotations
	if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != port || a["prometheus.io/path"] != "/metrics" {
		t.Errorf("scrape annotations %v", a)
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[r]; !ok {
			t.Errorf("no %s request", r)
		}
		if _, ok := c.Resources.Limits[r]; !ok {
			t.Errorf("no %s limit", r)
		}
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || *g <= int64(img.Writeback.ShutdownTimeout.Seconds()) {
		t.Errorf("terminationGracePeriodSeconds %v; want more than shutdown_timeout (%v)", g, img.Writeback.ShutdownTimeout)
	}

	// Volumes by mount path.
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, vm := range c.VolumeMounts {
		mounts[vm.MountPath] = vm
	}
	if vm, ok := mounts["/etc/flusherd/flusherd.d"]; !ok || vols[vm.Name].ConfigMap == nil || vols[vm.Name].ConfigMap.Name != m.cm.Name {
		t.Errorf("the ConfigMap %s is not mounted at /etc/flusherd/flusherd.d", m.cm.Name)
	}
	if vm, ok := mounts[img.Stats.Dir]; !ok || vols[vm.Name].EmptyDir == nil {
		t.Errorf("no emptyDir at stats.dir %s", img.Stats.Dir)
	}

	// The ConfigMap's drop-ins beside the image's configuration.
	dir := t.TempDir()
	main, err := os.ReadFile("../container/flusherd.toml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "flusherd.toml"), main, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "flusherd.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range m.cm.Data {
		if err := os.WriteFile(filepath.Join(dir, "flusherd.d", name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := config.LoadValues(filepath.Join(dir, "flusherd.toml"))
	if err != nil {
		t.Fatalf("the ConfigMap as drop-ins of the image's configuration: %v", err)
	}
	if len(cfg.Watch) == 0 {
		t.Error("the ConfigMap names no tree")
	}
	for _, w := range cfg.Watch {
		vm, ok := mounts[w.Tree.Root]
		hp := vols[vm.Name].HostPath
		switch {
		case !ok:
			t.Errorf("tree %s: no volume mounted there", w.Tree.Root)
		case hp == nil:
			t.Errorf("tree %s: not a hostPath volume", w.Tree.Root)
		case vm.MountPropagation == nil || *vm.MountPropagation != corev1.MountPropagationHostToContainer:
			t.Errorf("tree %s: mountPropagation %v, want HostToContainer (filesystems mounted later under it)", w.Tree.Root, vm.MountPropagation)
		case !vm.ReadOnly:
			t.Errorf("tree %s: not read-only (flusherd never writes to its trees)", w.Tree.Root)
		}
	}
}

// TestManifestTypos: the strict decoding fails on daemonset.yaml with a
// misspelled field or a value of the wrong type planted.
func TestManifestTypos(t *testing.T) {
	data := string(read(t))
	for _, c := range []struct{ old, new string }{
		{"mountPropagation:", "mountPropogation:"},
		{"localhostProfile:", "localProfile:"},
		{"containerPort: 9469", `containerPort: "9469"`},
		{"periodSeconds: 10", "periodSeconds: ten"},
		{"readOnlyRootFilesystem: true", "readOnlyRootFilesystem: [true]"},
		{"  trees.toml: |", "  trees.toml:\n    path: /srv/data\n  other: |"},
	} {
		if !strings.Contains(data, c.old) {
			t.Fatalf("daemonset.yaml has no %q to change", c.old)
		}
		if _, err := decode([]byte(strings.Replace(data, c.old, c.new, 1))); err == nil {
			t.Errorf("%q for %q: decoded without error", c.new, c.old)
		} else {
			t.Logf("%q: %v", c.new, err)
		}
	}
}
