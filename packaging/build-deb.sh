#!/usr/bin/env bash
# Builds the flusherd Debian package with dpkg-deb:
#
#   bash packaging/build-deb.sh OUTDIR
#
# writes OUTDIR/flusherd_<version>_<arch>.deb. The version comes from
# `git describe --tags --always --dirty`: a tag v1.2.0 gives 1.2.0, commits
# after it 1.2.0+3.gabc1234, and a checkout with no tag
# 0.0~git<commit date, UTC, YYYYMMDD.hhmmss>.<short commit> (Debian versions
# must start with a digit); uncommitted changes add ".dirty". Outside a git
# checkout the version is 0.0.0; FLUSHERD_VERSION, if set, is the version
# instead. The same string is compiled into the binary (`flusherd version`). The architecture is `dpkg --print-architecture`
# (DEB_HOST_ARCH overrides it, to cross-build).
#
# The Maintainer field (and the changelog's signature) is
# "$DEBFULLNAME <$DEBEMAIL>", the variables Debian's tools (dch, debmake)
# read; DEBEMAIL may also hold "Name <address>" by itself. Without DEBEMAIL
# it is the committer of the commit built (git log -1 --format='%cn <%ce>'),
# so that the same commit gives the same package; outside a git checkout
# DEBEMAIL is required. The address must be a real mail address: lintian
# fails a host such as localhost (bogus-mail-host).
#
# The layout follows what debhelper makes: the changelog as
# changelog.gz (a native package: the version has no Debian revision),
# documents over 4 KiB gzipped as dh_compress does (not those under
# examples/), the systemd maintainer-script snippets of dh_installsystemd,
# and a lintian override file that gives the reason for each override.
#
# Needs go, dpkg-deb, gzip and go-md2man (installed with `go install` if it
# is not on PATH). No root: the files are recorded as root:root by
# `dpkg-deb --root-owner-group`.
set -euo pipefail

if (($# != 1)); then
	echo "usage: $0 OUTDIR" >&2
	exit 2
fi
mkdir -p "$1"
outdir=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."

# The go-md2man version installed when none is on PATH.
md2man_module=github.com/cpuguy83/go-md2man/v2@v2.0.7

# --- Version -----------------------------------------------------------------
debversion() {
	local desc date sha dirty=""
	if ! desc=$(git describe --tags --always --dirty 2>/dev/null); then
		echo 0.0.0
		return
	fi
	if git describe --tags >/dev/null 2>&1 && [[ $desc =~ ^v?[0-9] ]]; then
		# A tag: v1.2.0[-3-gabc1234][-dirty] -> 1.2.0[+3.gabc1234][.dirty];
		# any other hyphen (v1.3.0-rc1) becomes ~, which sorts before the
		# release, as it should.
		sed -E 's/^v//; s/-dirty$/.dirty/; s/-([0-9]+)-g([0-9a-f]+)/+\1.g\2/; s/-/~/g' <<<"$desc"
		return
	fi
	[[ $desc == *-dirty ]] && dirty=.dirty
	date=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d.%H%M%S)
	sha=$(git rev-parse --short HEAD)
	echo "0.0~git$date.$sha$dirty"
}
version=${FLUSHERD_VERSION:-$(debversion)}
if ! [[ $version =~ ^[0-9][A-Za-z0-9.+~]*$ ]]; then
	echo "$0: $version (from FLUSHERD_VERSION or git describe) is not a usable Debian version" >&2
	exit 1
fi

# --- Maintainer --------------------------------------------------------------
if [ -n "${DEBEMAIL:-}" ]; then
	if [[ $DEBEMAIL == *"<"*">" ]]; then
		maintainer=$DEBEMAIL
	else
		maintainer="${DEBFULLNAME:-flusherd maintainers} <$DEBEMAIL>"
	fi
elif ! maintainer=$(git log -1 --format='%cn <%ce>' 2>/dev/null); then
	echo "$0: not a git checkout: set DEBEMAIL (and DEBFULLNAME) to the maintainer's address" >&2
	exit 1
fi
# "Name <user@host.domain>", the host not a local name.
mail_re='^[^<>@]*[^<>@ ] <[^<>@ ]+@([A-Za-z0-9-]+[.])+[A-Za-z0-9-]+>$'
local_re='@(.*[.])?(localhost|localdomain|local)>$'
if ! [[ $maintainer =~ $mail_re ]] || [[ $maintainer =~ $local_re ]]; then
	echo "$0: maintainer \"$maintainer\" is not \"Name <address>\" with a mail domain: set DEBFULLNAME and DEBEMAIL" >&2
	exit 1
fi

arch=${DEB_HOST_ARCH:-$(dpkg --print-architecture)}
case $arch in
amd64 | arm64 | riscv64 | s390x) goarch=$arch ;;
i386) goarch=386 ;;
armhf) goarch=arm GOARM=7 && export GOARM ;;
armel) goarch=arm GOARM=5 && export GOARM ;;
ppc64el) goarch=ppc64le ;;
mips64el) goarch=mips64le ;;
loong64) goarch=loong64 ;;
*)
	echo "$0: no Go architecture known for the Debian architecture $arch" >&2
	exit 1
	;;
esac

# Reproducible: every file gets the commit's time (dpkg-deb also clamps the
# archive's times to it), the man pages are gzipped without name or time.
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || date +%s)
fi
export SOURCE_DATE_EPOCH

# --- go-md2man ---------------------------------------------------------------
if command -v go-md2man >/dev/null; then
	md2man=$(command -v go-md2man)
else
	gobin=$(go env GOBIN)
	if [ -z "$gobin" ]; then
		gopath=$(go env GOPATH)
		gobin=${gopath%%:*}/bin
	fi
	if ! [ -x "$gobin/go-md2man" ]; then
		echo "go-md2man is not on PATH: go install $md2man_module" >&2
		GOFLAGS= go install "$md2man_module"
	fi
	md2man=$gobin/go-md2man
fi

# --- Staging tree ------------------------------------------------------------
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/flusherd
doc=$root/usr/share/doc/flusherd
install -d -m 0755 "$root" "$root/DEBIAN" "$root/usr/sbin" "$root/lib/systemd/system" \
	"$root/etc/flusherd" "$doc" "$root/usr/share/man/man5" "$root/usr/share/man/man8" \
	"$root/usr/share/lintian/overrides"

# A static binary (no cgo): the package depends on nothing.
CGO_ENABLED=0 GOOS=linux GOARCH=$goarch go build -trimpath \
	-ldflags "-s -w -X main.version=$version" -o "$root/usr/sbin/flusherd" ./cmd/flusherd
chmod 0755 "$root/usr/sbin/flusherd"

# The unit, with the packaged binary's path.
sed 's#^ExecStart=/usr/local/bin/flusherd #ExecStart=/usr/sbin/flusherd #' systemd/flusherd.service \
	>"$root/lib/systemd/system/flusherd.service"
if ! grep -q '^ExecStart=/usr/sbin/flusherd ' "$root/lib/systemd/system/flusherd.service" ||
	grep -q '/usr/local/bin/flusherd' "$root/lib/systemd/system/flusherd.service"; then
	echo "$0: systemd/flusherd.service has no 'ExecStart=/usr/local/bin/flusherd ...' line to point at /usr/sbin/flusherd" >&2
	exit 1
fi
chmod 0644 "$root/lib/systemd/system/flusherd.service"

install -m 0644 packaging/flusherd.toml "$root/etc/flusherd/flusherd.toml"
# Drop-ins (*.toml, read after flusherd.toml in lexical order): where the
# local trees and overrides go, so that the conffile is never edited and
# an upgrade never stops at its prompt.
install -d -m 0755 "$root/etc/flusherd/flusherd.d"
install -m 0644 systemd/flusherd-metrics.conf README.md "$doc/"
# The documents the README links to, and their one picture, at the paths
# the links name.
install -d -m 0755 "$doc/docs"
install -m 0644 docs/*.md docs/storm.png "$doc/docs/"
# Prometheus rules and their promtool tests: examples, to copy to the
# Prometheus server (Debian policy 12.6: examples/, left uncompressed).
install -d -m 0755 "$doc/examples" "$doc/examples/prometheus"
install -m 0644 deploy/prometheus/flusherd-rules.yml deploy/prometheus/flusherd-rules.test.yml \
	"$doc/examples/prometheus/"
install -m 0644 packaging/lintian-overrides "$root/usr/share/lintian/overrides/flusherd"
# Shell completions, where bash-completion, zsh and fish look for them.
install -D -m 0644 completions/flusherd.bash "$root/usr/share/bash-completion/completions/flusherd"
install -D -m 0644 completions/_flusherd "$root/usr/share/zsh/vendor-completions/_flusherd"
install -D -m 0644 completions/flusherd.fish "$root/usr/share/fish/vendor_completions.d/flusherd.fish"

# The changelog (Debian policy 12.7; a native package's is changelog.gz):
# one entry for the commit built, signed by the maintainer, dated with
# SOURCE_DATE_EPOCH.
if commit=$(git rev-parse HEAD 2>/dev/null); then
	built="at commit"$'\n'"    $commit"
	[[ $version == *.dirty ]] && built+=" with uncommitted changes"
else
	built="(not a git checkout)"
fi
{
	printf 'flusherd (%s) unstable; urgency=medium\n\n' "$version"
	printf '  * Package of the flusherd source %s.\n' "$built"
	printf '\n -- %s  %s\n' "$maintainer" "$(LC_ALL=C date -u -R -d "@$SOURCE_DATE_EPOCH")"
} >"$doc/changelog"
chmod 0644 "$doc/changelog"

# Man pages; the version goes into the footer.
for page in flusherd.8 flusherd.toml.5; do
	sect=${page##*.}
	sed "1s/\"flusherd\"/\"flusherd $version\"/" "doc/$page.md" | "$md2man" >"$tmp/$page"
	if ! grep -q '^\.TH ' "$tmp/$page"; then
		echo "$0: doc/$page.md: go-md2man made no .TH title line" >&2
		exit 1
	fi
	gzip -9n <"$tmp/$page" >"$root/usr/share/man/man$sect/$page.gz"
	chmod 0644 "$root/usr/share/man/man$sect/$page.gz"
done

# copyright: flusherd's own, then the notices of the Go modules compiled
# into the binary (their licence files, as downloaded for the build).
{
	cat <<-'EOF'
		flusherd - userspace writeback flusher for chosen directory trees

		Copyright: the flusherd developers
		License: the flusherd source tree states no license.

		/usr/sbin/flusherd also contains code from Go (its standard library
		and runtime) and from the Go modules below, each under its own
		license, reproduced after its name.
	EOF
	printf '\n==== Go %s (standard library and runtime)\n\n' "$(go env GOVERSION)"
	cat "$(go env GOROOT)/LICENSE"
	CGO_ENABLED=0 GOOS=linux GOARCH=$goarch go list -deps \
		-f '{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}} {{.Dir}}{{end}}{{end}}' ./cmd/flusherd |
		sort -u | while read -r path ver dir; do
		printf '\n==== %s %s\n\n' "$path" "$ver"
		found=
		for f in "$dir"/LICENSE* "$dir"/LICENCE* "$dir"/COPYING* "$dir"/NOTICE*; do
			[ -f "$f" ] || continue
			found=1
			if grep -q 'Apache License' "$f" && grep -q 'Version 2.0, January 2004' "$f"; then
				# Debian ships this text once, in base-files.
				echo "Licensed under the Apache License, Version 2.0: see /usr/share/common-licenses/Apache-2.0."
				continue
			fi
			cat "$f"
		done
		if [ -z "$found" ]; then
			echo "$0: no license file in $dir ($path)" >&2
			exit 1
		fi
	done
} >"$doc/copyright"
chmod 0644 "$doc/copyright"

# Compress what dh_compress would: files in the doc directory over 4 KiB,
# and changelogs, except the copyright, pictures and examples/.
find "$doc" -path "$doc/examples" -prune -o -type f \( -size +4k -o -name 'changelog*' \) \
	! -name copyright ! -iname '*.png' ! -name '*.gz' -print0 |
	while IFS= read -r -d '' f; do
		gzip -9n "$f"
	done

# --- Control files -----------------------------------------------------------
echo /etc/flusherd/flusherd.toml >"$root/DEBIAN/conffiles"
install -m 0755 packaging/postinst packaging/prerm packaging/postrm "$root/DEBIAN/"
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z |
	xargs -0 md5sum) >"$root/DEBIAN/md5sums"
installed_size=$(cd "$root" && du -sk --apparent-size --exclude=DEBIAN . | cut -f1)
cat >"$root/DEBIAN/control" <<EOF
Package: flusherd
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $installed_size
Recommends: systemd
Section: admin
Priority: optional
Description: userspace writeback flusher for chosen directory trees
 flusherd keeps per-device lists of the files in the directory trees it is
 told to watch that hold dirty page-cache data, and writes that data back
 on a schedule set per tree: the kernel's kupdate scheme (write what is
 older than an expiry, every interval), with bounds, retries and
 statistics that can be set and seen, without lowering the global
 vm.dirty_* sysctls for the whole machine.
 .
 The package installs a sandboxed systemd service that is enabled and
 started, and a configuration, /etc/flusherd/flusherd.toml, that watches
 no tree: the service runs idle until a [[watch]] entry is added there
 and the service is reloaded. Needs Linux 6.5 or later (cachestat).
EOF
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles" "$root/DEBIAN/md5sums"

find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
deb=$outdir/flusherd_${version}_$arch.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
