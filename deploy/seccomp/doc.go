// Package seccomp holds flusherd.json, the seccomp profile of the
// container image (OCI runtime and Docker profile format: podman's
// --security-opt seccomp=, a Kubernetes Localhost profile): every system
// call not named fails with ENOSYS. Its tests check the file.
package seccomp
