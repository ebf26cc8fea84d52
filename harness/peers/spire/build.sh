#!/usr/bin/env bash
# SPIRE from its published Go modules, for `athenz-devstack cluster bench --systems spire`
# (harness/devstack/src/cluster/spire.rs builds its images from these): spire-server and spire-agent
# v1.13.3, the SPIFFE CSI driver v0.2.6, harness/peers/spire/probe (our Workload API client, on
# go-spiffe), and spire-controller-manager v0.6.4 with the CRDs its module publishes
# (module ./controller-manager, for `cluster bench --spire-entries controller-manager`). Static,
# as every image of the devstack is FROM scratch: spire-server links SQLite
# (cgo) statically against glibc; the rest are pure Go. Output: target/spire/static/.
#
# spiffe-csi v0.2.6 has no entry in the Go checksum database (sum.golang.org answers 404), so
# its hash is the one go.sum recorded when the module proxy served it (GONOSUMDB for it alone).
set -euo pipefail
cd "$(dirname "$0")"
out="${CARGO_TARGET_DIR:-$PWD/../../../target}/spire/static"
mkdir -p "$out"
export GONOSUMDB=github.com/spiffe/spiffe-csi
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/" \
  github.com/spiffe/spire/cmd/spire-agent github.com/spiffe/spiffe-csi/cmd/spiffe-csi-driver ./probe
CGO_ENABLED=1 go build -trimpath -tags "osusergo netgo sqlite_omit_load_extension" \
  -ldflags "-s -w -linkmode external -extldflags -static" -o "$out/" github.com/spiffe/spire/cmd/spire-server
(
  cd controller-manager
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/spire-controller-manager" \
    github.com/spiffe/spire-controller-manager/cmd
  # the CRDs it watches, as its module publishes them (the bench applies them before it starts)
  crds="$(go list -m -f '{{.Dir}}' github.com/spiffe/spire-controller-manager)/config/crd/bases"
  mkdir -p "$out/crds"
  for crd in clusterspiffeids clusterstaticentries clusterfederatedtrustdomains; do
    install -m 0644 "$crds/spire.spiffe.io_$crd.yaml" "$out/crds/"
  done
)
echo "harness/peers/spire/build.sh: $(ls "$out" | tr '\n' ' ')in $out"
