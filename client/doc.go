// Package client is the side of flusherd's commands that ask the running
// daemon through its control socket (stats, dirty, sync) and print the
// answer for a person or a script; package main parses their flags.
package client
