#!/usr/bin/env bash
# Builds the binaries of a real Kubernetes node from published Go modules:
#   kube                     multicall: kube-apiserver, kube-controller-manager,
#                            kube-scheduler, kubelet, kube-proxy, kubectl, etcd
#                            (harness/real-node/kube, k8s.io/kubernetes at one pinned version)
#   containerd, containerd-shim-runc-v2, ctr
#                            (harness/real-node/kube-tools, a separate module so containerd's
#                            dependency versions never move Kubernetes' ones)
#   coredns                  cluster DNS (harness/real-node/kube-dns, a module of its own too)
#   helm                     the Helm CLI for deploy/helm (harness/real-node/helm, a module of its own)
#   kustomize                the kustomize CLI, for `kustomize edit set image` (harness/real-node/kustomize)
#   csi-sanity, csi-sanity-controller
#                            the CSI driver conformance suite and the controller it needs
#                            (harness/real-node/csi-sanity)
# (No csi-node-driver-registrar: the module proxy answers 403 for it, and the
# agent registers its CSI driver with kubelet itself.)
# plus one symlink per kube component, so each can be started under its name.
#
# Usage: harness/real-node/kube/build.sh [--kube-version vX.Y.Z] [--out DIR] [--update-pin] [--no-tools] [--e2e]
#                                        [--kwok] [--unless-building]
#
#   --kube-version  Kubernetes release; default: the one harness/real-node/kube/go.mod pins.
#                   Another version gets a go.mod generated from that release's
#                   own go.mod under target/kube/<version>/mod (the committed
#                   go.mod/go.sum are left alone) and is built with -modfile.
#   --update-pin    rewrite the committed harness/real-node/kube/go.mod/go.sum for
#                   --kube-version instead (to move the pin).
#   --out           output directory; default target/kube/<version>/bin.
#   --no-tools      build kube only.
#   --e2e           also build Kubernetes' e2e suite, e2e.test (the test binary of
#                   k8s.io/kubernetes/test/e2e, from harness/real-node/kube-e2e at the pinned version) into
#                   target/kube/<version>/e2e: `athenz-devstack cluster storage-e2e` runs it.
#                   About 9 minutes on 2 cores once kube is built; not part of harness/setup.
#   --kwok          also build kwok's controller (sigs.k8s.io/kwok at the version
#                   harness/real-node/kwok/go.mod pins) into target/kwok/kwok:
#                   `athenz-devstack cluster scale` runs it. About 2.5 minutes on 2 cores cold.
#   --unless-building
#                   when another build of the same --out is under way, leave it to that
#                   build and exit 0 at once (harness/setup: CI starts this build in the
#                   background, then the tests, which wait for it where they need it).
#
# One build of an --out at a time: a build holds DIR.lock (flock) until it ends, and a second
# one waits for it (then finds everything built). The tests wait on the same lock before they
# use DIR (athenz_devstack::cluster::default_kube_bin), so tests started beside a build use its
# binaries once it is done, never half-written ones.
#
# Go's module and build caches are kept (never cleaned), so a rebuild with
# nothing changed only re-checks them. Builds run at nice 19: the machines are
# shared and a cold build takes tens of minutes on two cores.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
tools="$repo/harness/real-node/kube-tools"

kube_version=""
out=""
update_pin=0
with_tools=1
with_e2e=0
with_kwok=0
unless_building=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --kube-version) kube_version=${2:?--kube-version needs a value}; shift 2 ;;
    --kube-version=*) kube_version=${1#*=}; shift ;;
    --out) out=${2:?--out needs a value}; shift 2 ;;
    --out=*) out=${1#*=}; shift ;;
    --update-pin) update_pin=1; shift ;;
    --no-tools) with_tools=0; shift ;;
    --e2e) with_e2e=1; shift ;;
    --kwok) with_kwok=1; shift ;;
    --unless-building) unless_building=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

# Static binaries, as Kubernetes' and containerd's release builds of these
# components are: they run on any host (and in any container) without a libc.
# -buildvcs=false: stamping this repository's git state into the binaries
# would relink them after every commit of unrelated code.
export CGO_ENABLED=0
# each build's wall time is printed: a cold build's figures (docs/development.md) come from here
gobuild() {
  local started=$SECONDS
  nice -n 19 go build -trimpath -buildvcs=false "$@"
  echo "build.sh:   built in $((SECONDS - started)) s"
}

cd "$here"
pin=$(go run ./internal/genmod -pin)
kube_version=${kube_version:-$pin}
if [[ ! $kube_version =~ ^v1\.([0-9]+)\.([0-9]+)(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "build.sh: --kube-version $kube_version is not a release tag like v1.37.2" >&2
  exit 2
fi
minor=${BASH_REMATCH[1]}
out=${out:-$repo/target/kube/$kube_version/bin}
mkdir -p "$out"
out=$(cd "$out" && pwd)

exec {lock_fd}>"$out.lock"
if ! flock --nonblock "$lock_fd"; then
  if [[ $unless_building == 1 ]]; then
    echo "build.sh: a build of $out is under way; not building it again (what needs its binaries waits for it)"
    exit 0
  fi
  echo "build.sh: waiting for the build of $out under way ($out.lock)"
  flock "$lock_fd"
fi

# A release may need a newer Go than the one installed (GOTOOLCHAIN=local on
# these machines); the only other toolchain reachable is one from the module
# proxy, e.g. GOTOOLCHAIN=go1.27.3. Checked before `go mod tidy` would fail.
check_go() {
  local need have
  need=$(go mod edit -json "$1" | sed -n 's/^\t"Go": "\(.*\)",$/\1/p')
  have=$(go env GOVERSION); have=${have#go}
  if [[ -n $need && $(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1) != "$need" ]]; then
    echo "build.sh: k8s.io/kubernetes $kube_version needs Go $need, this go is $have;" \
      "export GOTOOLCHAIN=go<newer> (fetched from the module proxy) and retry" >&2
    exit 1
  fi
}

# Choose the go.mod: the committed one for the pinned version, a generated one
# otherwise. Generation only happens when its output would change, so repeated
# builds of the same version do not re-run `go mod tidy`.
modfile_flag=()
if [[ $kube_version != "$pin" ]]; then
  moddir="$repo/target/kube/$kube_version/mod"
  mkdir -p "$moddir"
  go run ./internal/genmod -version "$kube_version" -o "$moddir/go.mod.gen"
  check_go "$moddir/go.mod.gen"
  if [[ $update_pin == 1 ]]; then
    echo "build.sh: moving the pin from $pin to $kube_version in harness/real-node/kube/go.mod"
    cp "$moddir/go.mod.gen" go.mod
    nice -n 19 go mod tidy
    # the e2e suite's module (--e2e) follows the same pin
    go run ./internal/genmod -version "$kube_version" \
      -module github.com/athenz-k8s-identity/tests/kube-e2e -o ../kube-e2e/go.mod
    (cd ../kube-e2e && nice -n 19 go mod tidy)
  else
    if ! cmp -s "$moddir/go.mod.gen" "$moddir/go.mod.src" || [[ ! -s $moddir/go.sum ]]; then
      echo "build.sh: generating $moddir/go.mod for $kube_version"
      cp "$moddir/go.mod.gen" "$moddir/go.mod"
      rm -f "$moddir/go.sum"
      nice -n 19 go mod tidy -modfile="$moddir/go.mod"
      cp "$moddir/go.mod.gen" "$moddir/go.mod.src"
    fi
    modfile_flag=(-modfile="$moddir/go.mod")
  fi
fi

# Version stamps as Kubernetes' hack/lib/version.sh sets them, so
# `kubelet --version`, /version and kubectl report the release. The build date
# is the release commit's time (from the proxy's .info), not now: constant
# ldflags keep a rebuild a cache hit instead of a relink. The release commit is
# not known from the module proxy: gitCommit is cleared rather than left as
# the "$Format:%H$" placeholder of the source archive.
info=$(go mod download -json "k8s.io/kubernetes@$kube_version" | sed -n 's/^\t"Info": "\(.*\)",$/\1/p')
build_date=$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$info")
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  kube_ldflags+=" -X $pkg.gitTreeState=archive -X $pkg.buildDate=$build_date -X $pkg.gitCommit="
done

# entry points whose signatures changed in 1.34 (the kubelet's command, kubectl's -v) come from
# entry_current.go or, for older releases, entry_before_1_34.go
kube_tags=()
if (( minor < 34 )); then
  kube_tags=(-tags kube_before_1_34)
fi
echo "build.sh: kube $kube_version -> $out"
gobuild "${modfile_flag[@]}" "${kube_tags[@]}" -ldflags "$kube_ldflags" -o "$out/kube" .
components=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl etcd)
for c in "${components[@]}"; do
  ln -sfn kube "$out/$c"
done

binaries=(kube)
if [[ $with_tools == 1 ]]; then
  cd "$tools"
  ctrd=github.com/containerd/containerd/v2
  ctrd_version=$(go list -m -f '{{.Version}}' "$ctrd")
  ctrd_ldflags="-s -w -X $ctrd/version.Version=$ctrd_version -X $ctrd/version.Package=$ctrd"
  # no_btrfs: the btrfs snapshotter needs cgo and the btrfs headers;
  # urfave_cli_no_docs: as containerd's Makefile, drops man-page generation.
  echo "build.sh: containerd $ctrd_version -> $out"
  gobuild -tags 'no_btrfs urfave_cli_no_docs' -ldflags "$ctrd_ldflags" -o "$out/" \
    "$ctrd/cmd/containerd" "$ctrd/cmd/ctr"
  # The shim is built as containerd's Makefile builds it (no_grpc: it serves
  # ttrpc only), static like the rest.
  gobuild -tags 'no_btrfs urfave_cli_no_docs no_grpc' -ldflags "$ctrd_ldflags" -o "$out/" \
    "$ctrd/cmd/containerd-shim-runc-v2"
  binaries+=(containerd ctr containerd-shim-runc-v2)

  # Cluster DNS: CoreDNS from its own module (harness/real-node/kube-dns: its coremain with the Corefile's
  # plugins only), as kubeadm and kind deploy it.
  cd "$repo/harness/real-node/kube-dns"
  coredns_version=$(go list -m -f '{{.Version}}' github.com/coredns/coredns)
  echo "build.sh: coredns $coredns_version -> $out"
  gobuild -ldflags "-s -w" -o "$out/coredns" .
  binaries+=(coredns)

  # Helm, to render and install the chart (deploy/helm), from its own module (harness/real-node/helm).
  cd "$repo/harness/real-node/helm"
  helm_version=$(go list -m -f '{{.Version}}' helm.sh/helm/v3)
  # as Helm's Makefile stamps them: its version, and the Kubernetes version `helm template`
  # assumes (its client-go's 0.X is Kubernetes 1.X; unstamped it assumes 1.20)
  client_go=$(go list -m -f '{{.Version}}' k8s.io/client-go)
  helm_k8s_minor=$(echo "$client_go" | cut -d. -f2)
  helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    helm_ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$helm_k8s_minor"
  done
  echo "build.sh: helm $helm_version (for Kubernetes 1.$helm_k8s_minor) -> $out"
  gobuild -ldflags "$helm_ldflags" -o "$out/helm" helm.sh/helm/v3/cmd/helm
  binaries+=(helm)

  # the kustomize CLI (`kustomize edit set image`, which kubectl's kustomize lacks), from its own
  # module (harness/real-node/kustomize)
  cd "$repo/harness/real-node/kustomize"
  echo "build.sh: kustomize $(go list -m -f '{{.Version}}' sigs.k8s.io/kustomize/kustomize/v5) -> $out"
  gobuild -ldflags "-s -w" -o "$out/kustomize" sigs.k8s.io/kustomize/kustomize/v5
  binaries+=(kustomize)

  # csi-sanity, the CSI community's driver conformance suite, and the stand-in controller its
  # volume-creating node specs need, from their own module (harness/real-node/csi-sanity)
  cd "$repo/harness/real-node/csi-sanity"
  echo "build.sh: csi-sanity $(go list -m -f '{{.Version}}' github.com/kubernetes-csi/csi-test/v5) -> $out"
  gobuild -ldflags "-s -w" -o "$out/csi-sanity" github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity
  gobuild -ldflags "-s -w" -o "$out/csi-sanity-controller" ./controller
  binaries+=(csi-sanity csi-sanity-controller)
  cd "$tools"

fi

if [[ $with_e2e == 1 ]]; then
  if [[ $kube_version != "$pin" ]]; then
    echo "build.sh: --e2e builds the pinned version ($pin) only" >&2
    exit 2
  fi
  e2e_pin=$(cd "$here" && go run ./internal/genmod -pin -modfile ../kube-e2e/go.mod)
  if [[ $e2e_pin != "$pin" ]]; then
    echo "build.sh: harness/real-node/kube-e2e pins $e2e_pin, harness/real-node/kube $pin: run --update-pin" >&2
    exit 1
  fi
  cd "$repo/harness/real-node/kube-e2e"
  mkdir -p "$out/../e2e"
  echo "build.sh: e2e.test $kube_version -> $out/../e2e"
  started=$SECONDS
  nice -n 19 go test -c -trimpath -buildvcs=false -ldflags "$kube_ldflags" \
    -o "$out/../e2e/e2e.test" k8s.io/kubernetes/test/e2e
  echo "build.sh:   built in $((SECONDS - started)) s"
fi

if [[ $with_kwok == 1 ]]; then
  cd "$repo/harness/real-node/kwok"
  mkdir -p "$repo/target/kwok"
  echo "build.sh: kwok $(go list -m -f '{{.Version}}' sigs.k8s.io/kwok) -> $repo/target/kwok"
  gobuild -ldflags "-s -w" -o "$repo/target/kwok/kwok" sigs.k8s.io/kwok/cmd/kwok
fi

echo
echo "Built (Kubernetes $kube_version):"
for b in "${binaries[@]}"; do
  printf '  %-60s %6s MiB\n' "$out/$b" "$(( $(stat -c %s "$out/$b") / 1048576 ))"
done
for c in "${components[@]}"; do
  printf '  %-60s -> kube\n' "$out/$c"
done
