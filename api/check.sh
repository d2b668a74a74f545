#!/usr/bin/env bash
# The Go module's and the proto's checks, run by tests/run.sh:
# 1. buf lint of proto/ (buf.yaml: STANDARD, every exception justified there);
# 2. buf breaking: dipam.v1 against the previous commit (below), so that no field is
#    renumbered, retyped or removed by accident;
# 3. the committed Go code is what the pinned generators make of proto/ now;
# 4. gofmt, go vet, `go mod tidy -diff` and the unit tests of api/ and examples/go-agent
#    (the example's tests against a real dipamd run in tests/lifecycle/tests/agent/agent_api.rs).
#
# The previous commit: $DIPAM_BREAKING_AGAINST if set (a commit, or "none" to skip the check
# on purpose); else, on a branch other than main, where it forks from main (merge-base), and
# on main, HEAD's first parent. A shallow clone is deepened by one commit first (git fetch
# --deepen=1). When there is still no previous commit (the first commit, a clone of depth 1
# whose remote cannot be reached, or no git checkout at all) the check cannot run: with CI
# set that fails, naming the fix (a deeper clone, or DIPAM_BREAKING_AGAINST); otherwise it is
# skipped, saying so.
set -euo pipefail
. "$(dirname "$0")/tools.sh"
cd "$repo"
start=$(date +%s)

buf lint

previous() {
  git rev-parse --git-dir >/dev/null 2>&1 || return 1
  if [ "$(git rev-parse --is-shallow-repository)" = true ]; then
    git fetch -q --deepen=1 2>/dev/null || true
  fi
  local main
  for main in main origin/main; do
    if git rev-parse -q --verify "$main^{commit}" >/dev/null &&
      [ "$(git rev-parse "$main")" != "$(git rev-parse HEAD)" ]; then
      git merge-base HEAD "$main" 2>/dev/null && return 0
    fi
  done
  git rev-parse -q --verify 'HEAD^1^{commit}'
}
against=${DIPAM_BREAKING_AGAINST:-$(previous || true)}
if [ "$against" = none ]; then
  echo "buf breaking: skipped (DIPAM_BREAKING_AGAINST=none)"
elif [ -z "$against" ]; then
  why="buf breaking: no previous commit to compare proto/ with (first commit, shallow clone or no git checkout): clone with history (--depth 2 or more) or set DIPAM_BREAKING_AGAINST=<commit>"
  if [ -n "${CI:-}" ]; then
    echo "$why" >&2
    exit 1
  fi
  echo "SKIPPED $why" >&2
else
  old=$(mktemp -d)
  trap 'rm -rf "$old"' EXIT
  # The previous commit's proto/ as it was; a commit before proto/ existed has nothing to
  # break.
  if git archive "$against" proto 2>/dev/null | tar -x -C "$old"; then
    buf breaking proto --against "$old/proto"
    echo "buf breaking: dipam.v1 is compatible with $(git rev-parse --short "$against")"
  else
    echo "buf breaking: $(git rev-parse --short "$against") has no proto/; nothing to compare"
  fi
fi

fresh=$(mktemp -d)
trap 'rm -rf "$fresh" ${old:+"$old"}' EXIT
buf generate -o "$fresh"
generated() { (cd "$1" && find . -name '*.pb.go' | sort); }
stale=
[ "$(generated "$fresh/api")" = "$(generated api)" ] || stale=1
for f in $(generated "$fresh/api"); do
  cmp -s "$fresh/api/$f" "api/$f" || stale=1
done
if [ -n "$stale" ]; then
  echo "api/: the committed Go code differs from what proto/ generates: run api/generate.sh and commit" >&2
  diff -ru -x '*_test.go' -x '*.mod' -x '*.sum' -x '*.sh' -x '*.md' -x client.go -x doc.go \
    -x errors.go -x watch.go "api" "$fresh/api" | head -60 >&2 || true
  exit 1
fi

for m in api examples/go-agent; do
  unformatted=$(gofmt -l "$m")
  [ -z "$unformatted" ] || {
    echo "gofmt: $unformatted" >&2
    exit 1
  }
  (cd "$m" && go mod tidy -diff && go vet ./...)
done
(cd api && go test ./...)
echo "api/check.sh: passed in $(($(date +%s) - start))s"
