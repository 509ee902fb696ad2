//go:build race

package main

// The tests run under the race detector: the daemon they start is built
// with it too (TestMain), so that a data race in the daemon fails the test
// whose daemon saw it.
func init() { daemonRace = true }
