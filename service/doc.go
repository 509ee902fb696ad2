// Package service holds what flusherd's daemon decides beyond wiring: the
// control socket's requests (a sync fanned out to the devices' writeback
// goroutines, the dirty list, the stats) and the plan of a reload's tree
// changes. Package main (cmd/flusherd) wires it to the signals, the
// socket and systemd.
package service
