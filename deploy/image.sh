#!/usr/bin/env bash
# Builds the image of athenz-k8s-identity with buildah FROM scratch, offline: no base image, no
# registry, only the static binaries of deploy/build-binaries.sh. Prints the image's digest
# (sha256:<hex>, the manifest digest of the OCI archive below) and then, as its last line, the
# image's reference.
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
# Beside the archive, in target/image/ (<tag> is IMAGE_TAG, the workspace version by default):
#   athenz-k8s-identity-<tag>.digest     the digest, one line: a `skopeo copy` of the archive to a
#                                        registry keeps the manifest, so <registry>/...@<digest>
#                                        pulls exactly this image
#   athenz-k8s-identity-<tag>.cdx.json   the SBOM, CycloneDX 1.5, made by deploy/sbom.py from
#                                        the dependency lists the binaries embed (.dep-v0)
#   athenz-k8s-identity-<version>.tgz    the Helm chart (deploy/package-chart.sh), when a helm
#                                        binary is found (HELM, or harness/real-node/kube/build.sh's); said
#                                        plainly when skipped. Chart.yaml's version and
#                                        appVersion must be the workspace version, checked first.
#
# The layout (kept in step with deploy/Dockerfile by harness/e2e/tests/deploy/image_layout.rs):
#   /usr/local/bin/athenz-daemons            the six daemons in one binary (athenz-daemons)
#   /usr/local/bin/athenz-{identity-agent,jwt-service,callback,initializer,control-sia,node-authorizer} -> athenz-daemons
#   /usr/local/bin/athenz-sia, athenz-volume-driver
#   user 65532:65532, PATH=/usr/local/bin, org.opencontainers.image.* labels
# -e: stop at the first failing step, so no image, digest or SBOM of a failed build is printed
# as the release; -u: an unset variable is a bug here, not an empty string; -o pipefail: a
# pipeline fails when any of its commands does.
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
command -v python3 >/dev/null || {
  echo "image.sh: python3 is missing (deploy/sbom.py writes the SBOM): apt-get install python3" >&2
  exit 1
}
# before minutes of builds: the chart and the image must be one release
deploy/package-chart.sh --check

# one build at a time in this checkout (target/image.lock, held to the end): CI builds the image
# in the background while the tests that use it start, and those wait here, then find it built
mkdir -p "$root/target"
exec {image_lock}>"$root/target/image.lock"
if ! flock --nonblock "$image_lock"; then
  echo "image.sh: waiting for the image build under way ($root/target/image.lock)" >&2
  flock "$image_lock"
fi

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

out="$root/target/image"
archive="$out/athenz-k8s-identity-$tag.oci.tar"
digest_file="$out/athenz-k8s-identity-$tag.digest"
sbom="$out/athenz-k8s-identity-$tag.cdx.json"
# the archive is written here and put in place last, when its digest, SBOM and chart are written
# (devstack builds the image only when the archive is missing: a failed run must not leave one)
partial="$archive.partial"
committed=0
finished=0
# a failed run leaves no container, no partial archive, no digest or SBOM without their archive,
# and no image under $ref that lacks its digest and SBOM
cleanup() {
  buildah rm "$ctr" >/dev/null 2>&1 || true
  rm -f "$partial"
  if [ "$committed" = 1 ] && [ "$finished" = 0 ]; then
    rm -f "$digest_file" "$sbom"
    buildah rmi "$ref" >/dev/null 2>&1 || true
  fi
}
ctr="$(buildah from --quiet scratch)"
trap cleanup EXIT
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
committed=1

# none of an earlier build's files may stand beside this build's archive
mkdir -p "$out"
rm -f "$archive" "$digest_file" "$sbom" "$partial"
buildah push --quiet "$ref" "oci-archive:$partial:$ref" >/dev/null
# the manifest's digest, read from the archive's index.json and checked against the blob
digest="$(python3 deploy/sbom.py digest "$partial")"
# every file the image holds (the links are to athenz-daemons); one without its dependency list
# fails the build
binary_files=()
while IFS= read -r -d '' f; do binary_files+=("$f"); done \
  < <(find "$binaries" -type f -print0 | LC_ALL=C sort -z)
python3 deploy/sbom.py sbom --name "$name" --version "$tag" --digest "$digest" --timestamp "$created" \
  --output "$sbom" "${binary_files[@]}"
echo "$digest" > "$digest_file"
deploy/package-chart.sh "$out"
mv "$partial" "$archive"
finished=1
size="$(du -sb "$binaries" | cut -f1)"
echo "image.sh: $ref built in $((SECONDS - started)) s; binaries $size bytes; archive $archive;" \
  "digest $digest ($digest_file); SBOM $sbom" >&2
# stdout: the digest, then the reference, last (harness/e2e/tests/deploy/image.rs reads the last line)
echo "$digest"
echo "$ref"
