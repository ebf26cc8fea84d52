#!/usr/bin/env bash
# Packages the Helm chart, deploy/helm/athenz-k8s-identity, as DEST/athenz-k8s-identity-<version>.tgz
# (`helm package`), after checking that the chart's version and appVersion (Chart.yaml) are the
# workspace's version (Cargo.toml, [workspace.package]): the chart and the image are one release.
#
#   deploy/package-chart.sh [--check] [DEST]     # DEST: default target/image
#
# --check: only the version check (no helm needed); deploy/image.sh runs it before its builds.
# The helm binary: $HELM when set (it must be executable), else the repository's own, which
# harness/real-node/kube/build.sh builds into target/kube/<KUBE_VERSION>/bin (athenz_devstack's
# cluster::default_kube_bin(); KUBE_VERSION from harness/devstack/src/cluster/mod.rs), else `helm` on
# PATH. With none of them it says so and skips the packaging (exit 0): the chart is also
# installable from the source tree.
#
# -e: stop at the first failing step, so a failed check or `helm package` fails the release
# build instead of leaving a stale or mismatched chart; -u: an unset variable is a bug here, not
# an empty string; -o pipefail: a pipeline fails when any of its commands does.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

check_only=0
dest=""
while [ $# -gt 0 ]; do
  case "$1" in
    --check) check_only=1; shift ;;
    -*) echo "package-chart.sh: unknown argument $1 (usage: package-chart.sh [--check] [DEST])" >&2; exit 2 ;;
    *) [ -z "$dest" ] || { echo "package-chart.sh: one DEST only" >&2; exit 2; }; dest="$1"; shift ;;
  esac
done
dest="${dest:-$root/target/image}"

chart="deploy/helm/athenz-k8s-identity"
version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)"
[ -n "$version" ] || { echo "package-chart.sh: no version in Cargo.toml's [workspace.package]" >&2; exit 1; }
# top-level keys only (no indentation), quotes optional
chart_field() { sed -n "s/^$1:[[:space:]]*\"\{0,1\}\([^\"[:space:]]*\)\"\{0,1\}[[:space:]]*\$/\1/p" "$chart/Chart.yaml"; }
chart_version="$(chart_field version)"
app_version="$(chart_field appVersion)"
if [ "$chart_version" != "$version" ] || [ "$app_version" != "$version" ]; then
  echo "package-chart.sh: $chart/Chart.yaml has version '$chart_version' and appVersion" \
    "'$app_version'; the workspace's version (Cargo.toml) is '$version': set both to it" >&2
  exit 1
fi
[ "$check_only" = 0 ] || exit 0

helm=""
if [ -n "${HELM:-}" ]; then
  [ -x "$HELM" ] || { echo "package-chart.sh: HELM=$HELM is not an executable file" >&2; exit 1; }
  helm="$HELM"
else
  kube_version="$(sed -n 's/^pub const KUBE_VERSION: &str = "\(.*\)";$/\1/p' harness/devstack/src/cluster/mod.rs 2>/dev/null || true)"
  kube_bin="target/kube/$kube_version/bin"
  # (not while harness/real-node/kube/build.sh is writing it: it holds $kube_bin.lock)
  if [ -n "$kube_version" ] && [ -x "$kube_bin/helm" ] \
    && { [ ! -e "$kube_bin.lock" ] || flock --nonblock --shared "$kube_bin.lock" true; }; then
    helm="$root/$kube_bin/helm"
  elif command -v helm >/dev/null; then
    helm="$(command -v helm)"
  fi
fi
if [ -z "$helm" ]; then
  echo "package-chart.sh: SKIPPED packaging the Helm chart: no helm found (set HELM=/path/to/helm," \
    "or build the repository's with harness/real-node/kube/build.sh, into target/kube/${kube_version:-<KUBE_VERSION>}/bin)" >&2
  exit 0
fi

mkdir -p "$dest"
package="$dest/athenz-k8s-identity-$version.tgz"
rm -f "$package"
# helm reports on stdout; this script's callers keep stdout for their own result
"$helm" package "$chart" --destination "$dest" >&2
[ -f "$package" ] || { echo "package-chart.sh: helm package did not write $package" >&2; exit 1; }
echo "package-chart.sh: $package (helm: $helm)" >&2
