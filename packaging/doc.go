// Package packaging holds no code: its tests check the Debian package that
// build-deb.sh makes, the configuration file it installs
// (packaging/flusherd.toml against systemd/flusherd.toml) and the man
// pages in doc/ against the flusherd command line.
package packaging
