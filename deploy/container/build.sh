#!/usr/bin/env bash
# Builds flusherd's container image with podman (or buildah), no network:
#
#   bash deploy/container/build.sh [TAG]
#
# TAG defaults to localhost/flusherd:<version>; the version is `git describe
# --tags --always --dirty` (FLUSHERD_VERSION overrides it), compiled into the
# binary and the labels. GOARCH picks the architecture (default: the host's).
set -euo pipefail
cd "$(dirname "$0")/../.."
version=${FLUSHERD_VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo 0.0.0)}
version=${version#v}
tag=${1:-localhost/flusherd:$version}
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
# The commit's time, so that a rebuild of one commit labels it the same.
created=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null || echo 1970-01-01T00:00:00Z)
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$ctx/flusherd" ./cmd/flusherd
cp deploy/container/flusherd.toml "$ctx/"
cp -r deploy/container/flusherd.d "$ctx/"
builder=podman
command -v podman >/dev/null || builder=buildah
"$builder" build --quiet --network=none --layers=false -f deploy/container/Containerfile \
	--build-arg VERSION="$version" --build-arg REVISION="$revision" --build-arg CREATED="$created" \
	-t "$tag" "$ctx" >/dev/null
echo "$tag"
