#!/usr/bin/env bash
# Builds the image of athenz-k8s-identity with buildah FROM scratch, offline: no base image, no
# registry, only the static binaries of deploy/build-binaries.sh, for linux/amd64 and linux/arm64
# (the arm64 binaries cross-built on this host), as one OCI image index. Prints the index's
# digest (sha256:<hex>) and then, as its last line, the image's reference.
#
#   deploy/image.sh [--arch LIST] [--binaries ARCH=DIR]...
#     --arch LIST           the platforms, comma-separated: amd64,arm64 (the default; the release),
#                           or one of them (a faster build for a one-architecture test)
#     --binaries ARCH=DIR   that platform's binaries, already built by build-binaries.sh
#
# Output: in the local containers storage, the index under the reference (a manifest list:
# `podman manifest inspect <ref>`; `podman run <ref>` picks this host's platform) and each
# platform's image as <ref>-linux-<arch>; an OCI archive of the index with every platform,
# target/image/athenz-k8s-identity-<tag>.oci.tar (`skopeo copy --all oci-archive:<file>
# docker://<registry>/...` pushes it with every platform; without --all skopeo copies only this
# host's). Needs buildah (apt-get install buildah podman skopeo) and what build-binaries.sh needs
# for each platform. Environment: IMAGE_NAME (default
# ghcr.io/athenz-k8s-identity/athenz-k8s-identity, the name deploy/kustomization.yaml uses),
# IMAGE_TAG (default the workspace version).
#
# Beside the archive, in target/image/ (<tag> is IMAGE_TAG, the workspace version by default):
#   athenz-k8s-identity-<tag>.digest     the index's digest, one line: a `skopeo copy --all` of
#                                        the archive to a registry keeps every manifest, so
#                                        <registry>/...@<digest> pulls exactly this index, and
#                                        each node the image of its platform
#   athenz-k8s-identity-<tag>.linux-<arch>.digest    each platform's image manifest's digest
#   athenz-k8s-identity-<tag>.linux-<arch>.cdx.json  each platform's SBOM, CycloneDX 1.5, made by
#                                        deploy/sbom.py from the dependency lists its binaries
#                                        embed (.dep-v0); the image component is that platform's
#                                        manifest (pkg:oci/...@<digest>?arch=<arch>)
#   build-binaries-<arch>.log            each platform's binaries' build (they build at once)
#   athenz-k8s-identity-<version>.tgz    the Helm chart (deploy/package-chart.sh), when a helm
#                                        binary is found (HELM, or harness/real-node/kube/build.sh's); said
#                                        plainly when skipped. Chart.yaml's version and
#                                        appVersion must be the workspace version, checked first.
#
# The layout, on every platform (kept in step with deploy/Dockerfile by harness/e2e/tests/deploy/image_layout.rs):
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

arches="amd64,arm64"
declare -A given=()
usage="usage: image.sh [--arch amd64,arm64] [--binaries ARCH=DIR]..."
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arches="${2:?--arch needs a list: amd64,arm64}"; shift 2 ;;
    --binaries)
      spec="${2:?--binaries needs ARCH=DIR}"
      [[ "$spec" == *=* ]] || { echo "image.sh: --binaries $spec is not ARCH=DIR ($usage)" >&2; exit 2; }
      given["${spec%%=*}"]="${spec#*=}"
      shift 2 ;;
    *) echo "image.sh: unknown argument $1 ($usage)" >&2; exit 2 ;;
  esac
done
IFS=, read -r -a platforms <<< "$arches"
[ "${#platforms[@]}" -gt 0 ] || { echo "image.sh: --arch names no platform ($usage)" >&2; exit 2; }
declare -A seen=()
for arch in "${platforms[@]}"; do
  case "$arch" in
    amd64 | arm64) ;;
    *) echo "image.sh: --arch: $arch is not amd64 or arm64" >&2; exit 2 ;;
  esac
  [ -z "${seen[$arch]:-}" ] || { echo "image.sh: --arch names $arch twice" >&2; exit 2; }
  seen[$arch]=1
done
for arch in "${!given[@]}"; do
  [ -n "${seen[$arch]:-}" ] || { echo "image.sh: --binaries $arch=...: $arch is not in --arch $arches" >&2; exit 2; }
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
declare -A binaries=() builders=()
mkdir -p "$root/target/image"
build_log() { echo "$root/target/image/build-binaries-$1.log"; }
for arch in "${platforms[@]}"; do
  if [ -n "${given[$arch]:-}" ]; then
    binaries[$arch]="${given[$arch]}"
    continue
  fi
  # build-binaries.sh's default directories: amd64's where it always was
  if [ "$arch" = amd64 ]; then
    binaries[$arch]="$root/target/image/bin"
  else
    binaries[$arch]="$root/target/image/bin-$arch"
  fi
  # every platform at once, each in the background with its own log: much of a build is one
  # core's whole-program LTO, so two platforms take little longer than one
  deploy/build-binaries.sh --arch "$arch" "${binaries[$arch]}" > "$(build_log "$arch")" 2>&1 &
  builders[$arch]=$!
done
if [ "${#builders[@]}" -gt 0 ]; then
  echo "image.sh: building the binaries of linux/{${!builders[*]}} at once (logs: $(build_log '<arch>'))" >&2
fi
failed=""
for arch in "${!builders[@]}"; do
  if wait "${builders[$arch]}"; then
    tail -n 1 "$(build_log "$arch")" >&2
  else
    tail -n 40 "$(build_log "$arch")" >&2
    failed="$failed linux/$arch"
  fi
done
[ -z "$failed" ] || { echo "image.sh: the binaries of$failed failed to build (logs above: $(build_log '<arch>'))" >&2; exit 1; }
for arch in "${platforms[@]}"; do
  for f in athenz-daemons athenz-sia athenz-volume-driver; do
    [ -x "${binaries[$arch]}/$f" ] || { echo "image.sh: ${binaries[$arch]}/$f is missing" >&2; exit 1; }
  done
done

out="$root/target/image"
archive="$out/athenz-k8s-identity-$tag.oci.tar"
digest_file="$out/athenz-k8s-identity-$tag.digest"
# the archive is written here and put in place last, when its digests, SBOMs and chart are
# written (devstack builds the image only when the archive is missing: a failed run must not
# leave one)
partial="$archive.partial"
ctr=""
committed=0
finished=0
# what this build writes beside the archive, removed with it when the build fails
outputs=("$digest_file")
for arch in "${platforms[@]}"; do
  outputs+=("$out/athenz-k8s-identity-$tag.linux-$arch.digest" "$out/athenz-k8s-identity-$tag.linux-$arch.cdx.json")
done
# the local names this build owns: the index and each platform's image
remove_local_images() {
  buildah manifest rm "$ref" >/dev/null 2>&1 || true
  buildah rmi "$ref" >/dev/null 2>&1 || true
  for arch in amd64 arm64; do buildah rmi "$ref-linux-$arch" >/dev/null 2>&1 || true; done
}
# a failed run leaves no container, no partial archive, no digest or SBOM without their archive,
# and no image under $ref that lacks its digest and SBOM
cleanup() {
  [ -z "$ctr" ] || buildah rm "$ctr" >/dev/null 2>&1 || true
  rm -f "$partial"
  if [ "$committed" = 1 ] && [ "$finished" = 0 ]; then
    rm -f "${outputs[@]}"
    remove_local_images
  fi
}
trap cleanup EXIT
committed=1
# an earlier build's index (or, before the index, its single image) under the same names
remove_local_images

for arch in "${platforms[@]}"; do
  ctr="$(buildah from --quiet scratch)"
  # a directory's contents, links kept as links
  buildah copy --quiet "$ctr" "${binaries[$arch]}/" /usr/local/bin/ >/dev/null
  buildah config \
    --os linux \
    --arch "$arch" \
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
  buildah commit --quiet --format oci "$ctr" "$ref-linux-$arch" >/dev/null
  buildah rm "$ctr" >/dev/null
  ctr=""
done
buildah manifest create "$ref" >/dev/null
for arch in "${platforms[@]}"; do
  # the platform comes from the image's configuration (buildah config --os/--arch above)
  buildah manifest add "$ref" "containers-storage:$ref-linux-$arch" >/dev/null
done

# none of an earlier build's files may stand beside this build's archive
mkdir -p "$out"
rm -f "$archive" "$partial" "$out/athenz-k8s-identity-$tag".*.digest "$out/athenz-k8s-identity-$tag".*.cdx.json \
  "$digest_file" "$out/athenz-k8s-identity-$tag.cdx.json"
buildah manifest push --quiet --all "$ref" "oci-archive:$partial:$ref" >/dev/null
# the index's digest and each platform's, read from the archive and checked against its blobs
digest="$(python3 deploy/sbom.py digest "$partial")"
declare -A platform_digest=()
while read -r platform platform_sha; do
  platform_digest[${platform#linux/}]="$platform_sha"
done < <(python3 deploy/sbom.py platforms "$partial")
summary=""
for arch in "${platforms[@]}"; do
  [ -n "${platform_digest[$arch]:-}" ] || { echo "image.sh: the index has no linux/$arch manifest" >&2; exit 1; }
  # every file the platform's image holds (the links are to athenz-daemons); one without its
  # dependency list fails the build
  binary_files=()
  while IFS= read -r -d '' f; do binary_files+=("$f"); done \
    < <(find "${binaries[$arch]}" -type f -print0 | LC_ALL=C sort -z)
  python3 deploy/sbom.py sbom --name "$name" --version "$tag" --digest "${platform_digest[$arch]}" \
    --arch "$arch" --timestamp "$created" \
    --output "$out/athenz-k8s-identity-$tag.linux-$arch.cdx.json" "${binary_files[@]}"
  echo "${platform_digest[$arch]}" > "$out/athenz-k8s-identity-$tag.linux-$arch.digest"
  size="$(du -sb "${binaries[$arch]}" | cut -f1)"
  summary="$summary linux/$arch ${platform_digest[$arch]} ($size bytes of binaries);"
done
echo "$digest" > "$digest_file"
deploy/package-chart.sh "$out"
mv "$partial" "$archive"
finished=1
echo "image.sh: $ref built in $((SECONDS - started)) s: index $digest ($digest_file);$summary" \
  "archive $archive; SBOMs $out/athenz-k8s-identity-$tag.linux-<arch>.cdx.json" >&2
# stdout: the digest, then the reference, last (harness/e2e/tests/deploy/image.rs reads the last line)
echo "$digest"
echo "$ref"
