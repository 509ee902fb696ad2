// Package kubernetes holds daemonset.yaml, flusherd as a Kubernetes
// DaemonSet, and its test: strict decoding into the API's types, so that
// a misspelled field or a wrong type fails without a cluster.
package kubernetes
