#!/usr/bin/env bash
# The final build of the tenth stop, second of two calls: the issue's shapes in both precisions
# and FLA's on the same shapes and on T=16K..512K (time per token), in one call.
# run(command="bash .dev/all/callAZ2.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=az2; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
issue_shapes 2>&1 | tee $R/shapes.txt
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site timeout 150 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6 | tee $R/fla.txt
pack
PYTHONPATH=/tmp/site timeout 150 python3 $TOP/.gpu/anchors.py --impl fla --shapes "1,16384,16,32,128,128;1,131072,16,32,128,128;1,262144,16,32,128,128;1,524288,16,32,128,128" --json $R/fla_sweep.json 2>&1 | tail -5 | tee $R/fla_sweep.txt
pack
