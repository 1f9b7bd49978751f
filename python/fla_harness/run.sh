#!/usr/bin/env bash
# Runs FLA's tests/ops/test_gdn.py (extracted by prepare.sh into .gpu/fla_tests) with
# conftest.py beside it, which routes FLA's two entry points to deltanet; in a fresh folder
# under /tmp, so that nothing is written into the tree. fla and deltanet must be importable.
#   bash python/fla_harness/run.sh [pytest arguments]
# Environment: PYTHON (default python3), DELTANET_FLA_TESTS (default .gpu/fla_tests), and the
# conftest's DELTANET_FLA_SUMMARY, DELTANET_FLA_DEADLINE_S, DELTANET_FLA_HARNESS_CPU.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tests=${DELTANET_FLA_TESTS:-$here/../../.gpu/fla_tests}
[ -f "$tests/tests/ops/test_gdn.py" ] || { echo "no $tests/tests/ops/test_gdn.py: run prepare.sh" >&2; exit 2; }
run=$(mktemp -d /tmp/fla_gdn.XXXXXX)
cp -r "$tests/." "$run/"
cp "$here/conftest.py" "$run/tests/ops/conftest.py"
export FLA_DISABLE_BACKEND_DISPATCH=1  # before FLA's own conftest imports fla (see conftest.py)
unset FLA_CI_ENV
cd "$run"
exec "${PYTHON:-python3}" -m pytest tests/ops/test_gdn.py -p no:cacheprovider -rA "$@"
