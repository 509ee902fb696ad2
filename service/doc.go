// Package service is flusherd's daemon beyond wiring. Its lifecycle
// (Daemon): the stats directory claimed, start-up progress told to
// systemd (EXTEND_TIMEOUT_USEC), READY=1 and the initial scan, the
// watchdog's health pings, reload on SIGHUP with retry on a shortage,
// and the stop's sequence with its deadlines and report. Its requests:
// the control socket's sync, dirty list and stats, and the plan of a
// reload's tree changes. Timers go through a Clock, so that tests run
// them in virtual time (testing/synctest). Package main (cmd/flusherd)
// builds the parts and wires them to the signals, the socket and the
// metrics.
package service
