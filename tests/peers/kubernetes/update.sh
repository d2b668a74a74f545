#!/usr/bin/env bash
# Regenerates this wrapper module for another Kubernetes release: go.mod requires
# k8s.io/kubernetes VERSION and replaces each staging module that release's own go.mod points
# at ./staging/... with its published v0.Y.Z; `go mod tidy` then fills go.sum (tools.go names
# the components). Change the version in tests/peers/pins to match (build.sh refuses a
# mismatch).
#
# Usage: update.sh v1.Y.Z
set -euo pipefail
version=${1:?usage: update.sh v1.Y.Z}
here=$(cd "$(dirname "$0")" && pwd)
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
mod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
[ -f "$mod" ] || { echo "no go.mod for k8s.io/kubernetes@$version" >&2; exit 1; }
staging="v0.${version#v1.}"
go_line=$(sed -n 's/^go \(.*\)$/\1/p' "$mod")
{
  sed -n '1,/^module /{/^module /d;p}' "$here/go.mod"
  echo "module dipam.test/kubernetes-peers"
  echo
  echo "go $go_line"
  echo
  echo "require k8s.io/kubernetes $version"
  echo
  echo "replace ("
  grep -E '=> \./staging' "$mod" | awk -v v="$staging" '{print "\t" $1 " => " $1 " " v}'
  echo ")"
} >"$here/go.mod.new"
mv "$here/go.mod.new" "$here/go.mod"
rm -f "$here/go.sum"
(cd "$here" && go mod tidy)
