#!/usr/bin/env bash
# Regenerates the Go code of this module (agent/v1, dipam/v1) from proto/ with the pinned
# tools (api/tools.sh), as buf.gen.yaml says. Run it after changing a .proto, and commit the
# result: api/check.sh (in tests/run.sh) fails when the committed code differs.
set -euo pipefail
. "$(dirname "$0")/tools.sh"
cd "$repo"
buf generate
