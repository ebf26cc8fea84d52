#!/usr/bin/env bash
# Builds the binaries the image ships into OUT_DIR (default target/image/bin), the same way for
# deploy/image.sh and deploy/Dockerfile:
#   - static (glibc's crt-static, so the image needs no libc: FROM scratch);
#   - the locked dependencies and the release profiles of Cargo.toml: `dist` (whole-program
#     LTO) for athenz-daemons, the one binary of the six daemons; `release-small` for the SIA,
#     which runs in every pod, and the volume driver, which kubelet execs per mount;
#   - each binary's dependency list embedded by `cargo auditable` (section .dep-v0), which
#     `cargo audit bin`, Trivy and Grype read; symbols stripped;
#   - one link per daemon, named as the manifests call it, to athenz-daemons.
# Needs: the Rust toolchain, cargo-auditable (`cargo install cargo-auditable --locked --version 0.7.7`), binutils.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/target/image/bin}"
cd "$root"

target=x86_64-unknown-linux-gnu
built="${CARGO_TARGET_DIR:-target}"
daemons=(athenz-identity-agent athenz-jwt-service athenz-callback athenz-initializer athenz-control-sia athenz-node-authorizer)

command -v cargo-auditable >/dev/null || {
  echo "build-binaries.sh: cargo-auditable is missing: cargo install cargo-auditable --locked --version 0.7.7" >&2
  exit 1
}
# --target is what makes crt-static apply to the binaries only, not to build scripts and macros
export RUSTFLAGS="-C target-feature=+crt-static"
cargo auditable build --locked --target "$target" --profile release-small \
  -p athenz-sia -p athenz-volume-driver
cargo auditable build --locked --target "$target" --profile dist -p athenz-daemons

rm -rf "$out"
mkdir -p "$out"
install -m 0755 \
  "$built/$target/release-small/athenz-sia" \
  "$built/$target/release-small/athenz-volume-driver" \
  "$built/$target/dist/athenz-daemons" \
  "$out/"
# symbols only: the .dep-v0 section (the dependency list) stays
strip --strip-unneeded "$out"/athenz-*
for d in "${daemons[@]}"; do ln -s athenz-daemons "$out/$d"; done
ls -l "$out" >&2
