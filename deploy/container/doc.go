// Package container holds flusherd's container image (Containerfile,
// build.sh, the image's flusherd.toml) and its test: the image built with
// podman and run as a DaemonSet runs it, with the seccomp profile of
// deploy/seccomp, the exact capabilities and a loop-mounted tree.
package container
