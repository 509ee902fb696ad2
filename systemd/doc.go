// Package systemd holds flusherd's systemd unit, its drop-ins and the
// example configuration, and the test that runs them for real: the Debian
// package installed in a container whose PID 1 is systemd, the daemon
// started, reloaded, watchdog-restarted and stopped by systemd under the
// shipped sandbox (unit_test.go). It has no Go code of its own.
package systemd
