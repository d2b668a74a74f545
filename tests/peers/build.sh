#!/usr/bin/env bash
# Builds the real peers of tests/peers/pins (libcni's cnitool and the project's libcni driver,
# the reference plugins, azure-vnet-ipam, containerd 2, crictl, CRI-O) with the ordinary Go
# client from the Go module proxy, into $DIPAM_TEST_CACHE/peers (default
# /var/cache/dipam-tests/peers), one directory per module and version. Each binary gets a
# stamp holding its pin, so a second run is a no-op and a changed pin rebuilds only that one.
# Then writes peers.json there (atomically): {"NAME": {"module", "version", "path",
# "buildSeconds"}}, which the lifecycle tests read (tests/lifecycle/src/peers.rs).
#
# A peer that cannot be built: with CI set, the run fails (exit 1) naming each one and why,
# after trying the others; otherwise the reason goes to peers/NAME.unavailable, and the tests
# that need it say so.
#
# Usage: build.sh [NAME...]   (default: every pin). GOMODCACHE, GOCACHE, GOPROXY and the like
# are taken from the environment, so a cold build can be measured with empty caches.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${DIPAM_TEST_CACHE:-/var/cache/dipam-tests}
peers=$cache/peers
pins=${DIPAM_PEER_PINS:-$here/pins}
mkdir -p "$peers/logs"

# Go 1.26 is part of the machine; its default install directory may not be in PATH.
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  PATH=$PATH:/usr/local/go/bin
fi
# The machine's own Go, never one downloaded because a go.mod asks for a newer one: a pin
# that needs a newer Go must fail here, loudly, not fetch a toolchain.
export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false"

# Two runs at once (two test setups on one machine) must not build into each other.
exec 9>"$peers/.lock"
flock 9

failed=()
want=("$@")

wanted() {
  [ ${#want[@]} -eq 0 ] && return 0
  local w
  for w in "${want[@]}"; do [ "$w" = "$1" ] && return 0; done
  return 1
}

# The directory a module's download or build goes in: github.com/a/b@v1 -> github.com+a+b@v1.
key_dir() { printf '%s/%s@%s' "$peers" "${1//\//+}" "$2"; }

# The version of a module of this repository: a hash of its sources.
local_version() {
  (cd "$repo/$1" && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) -print0 |
    sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12 | sed 's/^/src-/')
}

# A writable copy of MODULE@VERSION's source in DIR/src (shared by the binaries of one
# module version), from `go mod download`.
module_source() {
  local module=$1 version=$2 dir=$3 src info
  [ -f "$dir/src/.complete" ] && return 0
  info=$(go mod download -json "$module@$version" || true)
  src=$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
  [ -n "$src" ] && [ -d "$src" ] || {
    echo "go mod download $module@$version gave no source directory: $info" >&2
    return 1
  }
  rm -rf "$dir/src" "$dir/src.tmp"
  cp -r "$src" "$dir/src.tmp"
  chmod -R u+w "$dir/src.tmp"
  mv "$dir/src.tmp" "$dir/src"
  touch "$dir/src/.complete"
}

# Builds one pin into OUT (a temporary file). Settings: KEY=VALUE (environment), tags=a,b.
build_one() {
  local name=$1 method=$2 module=$3 version=$4 pkg=$5 dir=$6 out=$7
  shift 7
  local envs=() goflags=(-trimpath) s
  for s in "$@"; do
    case $s in
      tags=*) goflags+=("-tags=${s#tags=}") ;;
      *=*) envs+=("$s") ;;
      *) echo "unknown build setting '$s' for $name" >&2 && return 1 ;;
    esac
  done
  case $method in
    install)
      local gobin=$dir/gobin.tmp
      rm -rf "$gobin" && mkdir -p "$gobin"
      # PACKAGE "." is the module's own main package (protoc-gen-go-grpc is a module).
      local target=$module/$pkg
      [ "$pkg" = . ] && target=$module
      env "${envs[@]}" GOBIN="$gobin" go install "${goflags[@]}" "$target@$version"
      mv "$gobin/$(basename "$target")" "$out" && rm -rf "$gobin"
      ;;
    download)
      module_source "$module" "$version" "$dir"
      (cd "$dir/src" && env "${envs[@]}" go build "${goflags[@]}" -o "$out" "./$pkg")
      ;;
    make)
      module_source "$module" "$version" "$dir"
      # The C helper's Makefile writes to ../bin next to its directory.
      (cd "$dir/src" && env "${envs[@]}" make -C "$pkg" >&2 &&
        cp "bin/$(basename "$pkg")" "$out")
      ;;
    local)
      (cd "$repo/$pkg" && env "${envs[@]}" go build "${goflags[@]}" -o "$out" .)
      ;;
    kubernetes)
      kubernetes_build "$module" "$version" "$pkg" "$out" "${envs[@]}" -- "${goflags[@]}"
      ;;
    cc)
      # A C program of the module (Kubernetes' pause), compiled as its Makefile does:
      # statically, so it runs alone in a scratch image.
      local src
      src=$(go mod download -json "$module@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
      [ -n "$src" ] && [ -f "$src/$pkg" ] || {
        echo "go mod download $module@$version has no $pkg" >&2
        return 1
      }
      gcc -Os -Wall -Werror -static "${envs[@]/#/-D}" -o "$out" "$src/$pkg"
      ;;
    *) echo "unknown method '$method' for $name" >&2 && return 1 ;;
  esac
}

# Kubernetes' components, from the wrapper module tests/peers/kubernetes (its go.mod says why
# one is needed). The pin's version must be the one that module requires, or the binaries
# would not be the pinned release. The version is stamped as Kubernetes' own build does
# (hack/lib/version.sh): without it every component reports v0.0.0 and kubectl and the
# kubelet's node status say so.
kubernetes_build() {
  local module=$1 version=$2 pkg=$3 out=$4 wrapper=$here/kubernetes
  shift 4
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1") && shift; done
  shift
  [ "$module" = k8s.io/kubernetes ] || {
    echo "method kubernetes builds k8s.io/kubernetes only, not $module" >&2
    return 1
  }
  grep -qx "require k8s.io/kubernetes $version" "$wrapper/go.mod" || {
    echo "$wrapper/go.mod does not require k8s.io/kubernetes $version: run $wrapper/update.sh $version" >&2
    return 1
  }
  local minor=${version#v1.}
  minor=${minor%%.*}
  local x ldflags="-s -w"
  for x in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $x.gitVersion=$version -X $x.gitMajor=1 -X $x.gitMinor=$minor"
    ldflags+=" -X $x.gitTreeState=clean -X $x.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$wrapper" && env "${envs[@]}" go build "$@" -ldflags "$ldflags" -o "$out" "$module/$pkg")
}

json_str() {
  local s=${1//\\/\\\\}
  printf '"%s"' "${s//\"/\\\"}"
}

entries=()
while read -r name method module version pkg settings; do
  case $name in '' | '#'*) continue ;; esac
  [ "$method" = local ] && version=$(local_version "$pkg")
  dir=$(key_dir "$module" "$version")
  bin=$dir/bin/$name
  stamp=$dir/.built-$name
  spec="$name $method $module $version $pkg $settings"
  if wanted "$name"; then
    if [ -x "$bin" ] && [ "$(head -n 1 "$stamp" 2>/dev/null)" = "$spec" ]; then
      echo "peer $name: cached ($module@$version, built in $(sed -n 2p "$stamp")s)"
    else
      echo "peer $name: building $module@$version ./$pkg"
      mkdir -p "$dir/bin"
      log=$peers/logs/$name.log
      start=$(date +%s)
      # In a subshell of its own, outside any `if`: bash ignores errexit in a function called
      # as a condition, and every step of a build must stop it.
      set +e
      # shellcheck disable=SC2086 # settings are words
      (set -e && build_one "$name" "$method" "$module" "$version" "$pkg" "$dir" "$bin.tmp" \
        $settings) >"$log" 2>&1
      rc=$?
      set -e
      if [ $rc -eq 0 ] && [ -x "$bin.tmp" ]; then
        mv "$bin.tmp" "$bin"
        secs=$(($(date +%s) - start))
        printf '%s\n%s\n' "$spec" "$secs" >"$stamp"
        rm -f "$peers/$name.unavailable"
        echo "peer $name: built in ${secs}s"
      else
        rm -f "$bin.tmp" "$stamp"
        why="$name ($module@$version ./$pkg) could not be built: $(tail -n 15 "$log")"
        failed+=("$why")
        printf '%s\n' "$why" >"$peers/$name.unavailable"
        echo "peer $name: FAILED after $(($(date +%s) - start))s (log: $log)" >&2
      fi
    fi
  fi
  # peers.json lists every pin that is built, whichever were asked for this time.
  if [ -x "$bin" ] && [ "$(head -n 1 "$stamp" 2>/dev/null)" = "$spec" ]; then
    entries+=("$(json_str "$name"): {\"module\": $(json_str "$module"), \"version\": $(json_str "$version"), \"path\": $(json_str "$bin"), \"buildSeconds\": $(sed -n 2p "$stamp")}")
  fi
done <"$pins"

tmp=$peers/peers.json.tmp.$$
{
  echo "{"
  for i in "${!entries[@]}"; do
    sep=,
    [ "$i" -eq $((${#entries[@]} - 1)) ] && sep=
    echo "  ${entries[$i]}$sep"
  done
  echo "}"
} >"$tmp"
mv "$tmp" "$peers/peers.json"
echo "peers: ${#entries[@]} recorded in $peers/peers.json"

if [ ${#failed[@]} -gt 0 ]; then
  for why in "${failed[@]}"; do echo "peer not built: $why" >&2; done
  if [ -n "${CI:-}" ]; then
    echo "CI is set: a missing peer fails the run (the tests that need it cannot run)" >&2
    exit 1
  fi
fi
