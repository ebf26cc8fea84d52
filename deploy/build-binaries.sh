#!/usr/bin/env bash
# Builds the binaries the image ships for one platform into OUT_DIR, the same way for
# deploy/image.sh and deploy/Dockerfile:
#
#   deploy/build-binaries.sh [--arch amd64|arm64] [OUT_DIR]
#
#   - linux/amd64 (the default; OUT_DIR default target/image/bin) or linux/arm64 (OUT_DIR default
#     target/image/bin-arm64), cross-built on any host: target aarch64-unknown-linux-gnu, linked
#     by gcc-aarch64-linux-gnu;
#   - static (glibc's crt-static, so the image needs no libc: FROM scratch);
#   - the locked dependencies and the release profiles of Cargo.toml: `dist` (whole-program
#     LTO) for athenz-daemons, the one binary of the six daemons; `release-small` for the SIA,
#     which runs in every pod, and the volume driver, which kubelet execs per mount;
#   - each binary's dependency list embedded by `cargo auditable` (section .dep-v0), which
#     `cargo audit bin`, Trivy and Grype read; symbols stripped;
#   - one link per daemon, named as the manifests call it, to athenz-daemons.
# Needs: the Rust toolchain, cargo-auditable (`cargo install cargo-auditable --locked --version 0.7.7`), binutils.
# arm64 needs a rustc with the aarch64-unknown-linux-gnu standard library: `rustc` on PATH when it
# has it (`rustup target add aarch64-unknown-linux-gnu`), else Debian's (apt-get install rustc-web
# libstd-rust-web-dev:arm64, after dpkg --add-architecture arm64), and the cross C toolchain for
# aws-lc and the static link (apt-get install gcc-aarch64-linux-gnu libc6-dev:arm64).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
arch=amd64
if [ "${1:-}" = "--arch" ]; then
  arch="${2:?--arch needs amd64 or arm64}"
  shift 2
fi
case "$arch" in
  amd64) target=x86_64-unknown-linux-gnu; default_out="$root/target/image/bin" ;;
  arm64) target=aarch64-unknown-linux-gnu; default_out="$root/target/image/bin-arm64" ;;
  *) echo "build-binaries.sh: --arch $arch: the image is built for amd64 and arm64 only" >&2; exit 2 ;;
esac
out="${1:-$default_out}"
cd "$root"

built="${CARGO_TARGET_DIR:-target}"
strip=strip
if [ "$arch" = arm64 ]; then
  # the first rustc that has the target's standard library: PATH's, then Debian's
  rustc_for_target=""
  for candidate in "$(command -v rustc || true)" /usr/bin/rustc; do
    [ -n "$candidate" ] && [ -x "$candidate" ] || continue
    sysroot="$("$candidate" --print sysroot 2>/dev/null)" || continue
    if [ -d "$sysroot/lib/rustlib/$target/lib" ]; then rustc_for_target="$candidate"; break; fi
  done
  [ -n "$rustc_for_target" ] || {
    echo "build-binaries.sh: no rustc has the $target standard library: rustup target add $target," \
      "or dpkg --add-architecture arm64 && apt-get update && apt-get install rustc-web libstd-rust-web-dev:arm64" >&2
    exit 1
  }
  for tool in aarch64-linux-gnu-gcc aarch64-linux-gnu-strip; do
    command -v "$tool" >/dev/null || {
      echo "build-binaries.sh: $tool is missing: apt-get install gcc-aarch64-linux-gnu libc6-dev:arm64" >&2
      exit 1
    }
  done
  export RUSTC="$rustc_for_target"
  # the linker of the target's binaries, and the C compiler of aws-lc's (the cc crate's names)
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
  export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
  export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
  strip=aarch64-linux-gnu-strip
  # a target directory of its own: its build scripts are another rustc's (nothing to share with
  # amd64's), and deploy/image.sh builds both platforms at once, which one directory's lock
  # would serialize
  built="$built/cross-arm64"
  export CARGO_TARGET_DIR="$built"
  echo "build-binaries.sh: linux/arm64 with $("$RUSTC" --version)" >&2
fi
started=$SECONDS
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
"$strip" --strip-unneeded "$out"/athenz-*
for d in "${daemons[@]}"; do ln -s athenz-daemons "$out/$d"; done
ls -l "$out" >&2
echo "build-binaries.sh: linux/$arch binaries in $out built in $((SECONDS - started)) s" >&2
