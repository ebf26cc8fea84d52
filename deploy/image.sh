#!/usr/bin/env bash
# Builds the image of athenz-k8s-identity with buildah FROM scratch, offline: no base image, no
# registry, only the static binaries of deploy/build-binaries.sh. Prints the image's reference as
# its last line.
#
#   deploy/image.sh [--binaries DIR]      # DIR: binaries already built by build-binaries.sh
#
# Output: the image in the local containers storage (podman sees it: `podman run <ref> ...`) and
# an OCI archive, target/image/athenz-k8s-identity-<version>.oci.tar (`skopeo copy
# oci-archive:<file> docker://<registry>/...` pushes it). Needs buildah (apt-get install buildah
# podman skopeo) and what build-binaries.sh needs. Environment: IMAGE_NAME (default
# ghcr.io/athenz-k8s-identity/athenz-k8s-identity, the name deploy/kustomization.yaml uses),
# IMAGE_TAG (default the workspace version).
#
# The layout (kept in step with deploy/Dockerfile by tests/tests/image_layout.rs):
#   /usr/local/bin/athenz-daemons            the five daemons in one binary (athenz-daemons)
#   /usr/local/bin/athenz-{identity-agent,jwt-service,callback,initializer,control-sia} -> athenz-daemons
#   /usr/local/bin/athenz-sia, athenz-volume-driver
#   user 65532:65532, PATH=/usr/local/bin, org.opencontainers.image.* labels
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

binaries=""
while [ $# -gt 0 ]; do
  case "$1" in
    --binaries) binaries="${2:?--binaries needs a directory}"; shift 2 ;;
    *) echo "image.sh: unknown argument $1 (usage: image.sh [--binaries DIR])" >&2; exit 2 ;;
  esac
done
command -v buildah >/dev/null || {
  echo "image.sh: buildah is missing: apt-get install buildah podman skopeo" >&2
  exit 1
}

version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)"
source_url="$(sed -n '/^\[workspace.package\]/,/^\[/s/^repository = "\(.*\)"/\1/p' Cargo.toml)"
name="${IMAGE_NAME:-ghcr.io/athenz-k8s-identity/athenz-k8s-identity}"
tag="${IMAGE_TAG:-$version}"
ref="$name:$tag"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || revision="$revision-dirty"
# the commit's time, not the build's: the same commit gives the same labels
created="$(git log -1 --format=%cI 2>/dev/null || date -u +%Y-%m-%dT%H:%M:%SZ)"

started=$SECONDS
if [ -z "$binaries" ]; then
  binaries="$root/target/image/bin"
  deploy/build-binaries.sh "$binaries"
fi
for f in athenz-daemons athenz-sia athenz-volume-driver; do
  [ -x "$binaries/$f" ] || { echo "image.sh: $binaries/$f is missing" >&2; exit 1; }
done

ctr="$(buildah from --quiet scratch)"
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
# a directory's contents, links kept as links
buildah copy --quiet "$ctr" "$binaries/" /usr/local/bin/ >/dev/null
buildah config \
  --user 65532:65532 \
  --env PATH=/usr/local/bin \
  --workingdir / \
  --label org.opencontainers.image.title=athenz-k8s-identity \
  --label "org.opencontainers.image.description=Athenz identities for Kubernetes pods: node agent, volume and CSI drivers, SIA, jwt-service, provider callback, admission webhook" \
  --label "org.opencontainers.image.source=$source_url" \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$revision" \
  --label "org.opencontainers.image.created=$created" \
  --label org.opencontainers.image.licenses=Apache-2.0 \
  "$ctr"
buildah commit --quiet --format oci "$ctr" "$ref" >/dev/null

archive="$root/target/image/athenz-k8s-identity-$tag.oci.tar"
rm -f "$archive"
buildah push --quiet "$ref" "oci-archive:$archive:$ref" >/dev/null
size="$(du -sb "$binaries" | cut -f1)"
echo "image.sh: $ref built in $((SECONDS - started)) s; binaries $size bytes; archive $archive" >&2
echo "$ref"
