#!/usr/bin/env bash
# Issue 8's bar on an H200, of the landed build (`deltanet_base` when staged as callCH.sh's header
# says, else `deltanet`): callCC.sh's work (the five issue shapes in both precisions beside FLA,
# then time per token from T=16384 to 524288), so that callCH.sh can follow on the same warm machine.
# run(command="bash .dev/all/callCI.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=ci; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
BIN=deltanet; [ -x ./deltanet_base ] && BIN=deltanet_base
echo "binary: $BIN" | tee $R/binary.txt
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
issue_shapes 2>&1 | tee $R/shapes.txt
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > $R/pip.txt 2>&1
export PYTHONPATH=/tmp/site
timeout 150 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6 | tee $R/fla.txt
pack
per_token 16384 131072 262144 524288
pack
