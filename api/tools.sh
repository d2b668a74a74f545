# Sourced by api/generate.sh and api/check.sh. Puts Go and the pinned buf, protoc-gen-go and
# protoc-gen-go-grpc first in PATH: tests/peers/pins pins them, tests/peers/build.sh builds
# them from the Go module proxy into $DIPAM_TEST_CACHE/peers (a no-op once built, with a cold
# Go cache too) and records where in peers.json.
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  PATH=$PATH:/usr/local/go/bin
fi
# The machine's Go, never a toolchain a go.mod would download.
export GOTOOLCHAIN=local
bash "$repo/tests/peers/build.sh" buf protoc-gen-go protoc-gen-go-grpc >&2
tools=$(/usr/bin/python3 - "${DIPAM_TEST_CACHE:-/var/cache/dipam-tests}/peers/peers.json" <<'PY'
import json, os, sys
peers = json.load(open(sys.argv[1]))
print(":".join(os.path.dirname(peers[n]["path"]) for n in ("buf", "protoc-gen-go", "protoc-gen-go-grpc")))
PY
)
PATH=$tools:$PATH
