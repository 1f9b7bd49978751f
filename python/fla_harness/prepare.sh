#!/usr/bin/env bash
# Extracts FLA's own GDN tests from a git dir of fla-org/flash-linear-attention into the
# git-ignored .gpu/fla_tests/ (FLA's code is never copied into this repository):
#   .gpu/fla_tests/tests/conftest.py       FLA's test conftest (poisons FLA's torch.empty scratch)
#   .gpu/fla_tests/tests/ops/test_gdn.py   the tests
#   .gpu/fla_tests/REVISION                the commit they came from
# Usage: bash python/fla_harness/prepare.sh [FLA_GIT_DIR [REVISION]]
# Defaults: the fetch tool's mirror, and the commit the harness was written against (README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
GIT_DIR_FLA=${1:-/work/.mirror/fla-org+flash-linear-attention/repo}
REV=${2:-bc3b101dcb713ddc5bd8924b66754eb68b5ccf89}
OUTDIR=.gpu/fla_tests
commit=$(git --git-dir "$GIT_DIR_FLA" rev-parse --verify "$REV^{commit}")
rm -rf "$OUTDIR"
mkdir -p "$OUTDIR/tests/ops"
for f in tests/conftest.py tests/ops/test_gdn.py; do
  git --git-dir "$GIT_DIR_FLA" show "$commit:$f" > "$OUTDIR/$f"
done
{
  echo "$commit"
  git --git-dir "$GIT_DIR_FLA" log -1 --format='%ci %s' "$commit"
  git --git-dir "$GIT_DIR_FLA" show "$commit:fla/__init__.py" | grep -m1 __version__ || true
} > "$OUTDIR/REVISION"
cat "$OUTDIR/REVISION"
du -sh "$OUTDIR"
