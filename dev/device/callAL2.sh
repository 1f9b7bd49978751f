#!/usr/bin/env bash
# The issues' five shapes: this build (as call AK), FLA and FlashQLA in one warm session
# (callAL1.sh installed FlashQLA's wheels just before).
# run(command="bash .dev/all/callAL2.sh", carry=[".dev/all", ".gpu/z3", ".gpu/fla", ".gpu/anchors.py"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=al; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/z3/*.whl $TOP/.gpu/fla/*.whl > $R/pip.txt 2>&1; echo "pip rc=$?"
export PYTHONPATH=/tmp/site
issue_shapes 2>&1 | tee $R/shapes.txt
pack
timeout 100 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -5 | tee $R/fla.txt
pack
timeout 250 python3 $TOP/.gpu/anchors.py --impl flashqla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/qla_shapes.json 2>&1 | tail -5 | tee $R/qla.txt
pack
