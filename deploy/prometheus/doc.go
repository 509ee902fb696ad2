// Package prometheus holds flusherd's Prometheus rules,
// flusherd-rules.yml (recording rules for dashboards, alerting rules), and
// their promtool unit tests, flusherd-rules.test.yml. Its Go tests run
// promtool on both and check that every metric the rules read is one
// that flusherd exports. It has no Go code of its own.
package prometheus
