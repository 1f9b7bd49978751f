#!/usr/bin/env bash
# The final build of 2026-12-04 (eighth stop; kernels as call AO's 8156980): the issue's shapes
# in both precisions with FLA beside, one call, for the README's table; the vectors once more.
# run(command="bash .dev/all/callAQ.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=aq; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
run selftest 60 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
issue_shapes 2>&1 | tee $R/shapes.txt
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site timeout 150 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6 | tee $R/fla.txt
pack
