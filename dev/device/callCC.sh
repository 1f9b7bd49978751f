#!/usr/bin/env bash
# Issue 8's bar on an H200 with the least device time: the five issue shapes in both precisions
# beside FLA in the same call (FlashQLA left out: its wheels need a call of their own, callBR1.sh),
# then time per token at T=524288 (both precisions). Env: BIN (the binary, default deltanet), TAG,
# PER_TOKEN (the T of the per-token table).
# run(command="bash .dev/all/callCC.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py"], needs_h200=true)
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=${TAG:-cc}; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
echo "binary: ${BIN:-deltanet}" | tee $R/binary.txt
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
shapes_beside_fla
per_token ${PER_TOKEN:-524288}
pack
