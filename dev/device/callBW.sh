#!/usr/bin/env bash
# Time per token, B=1, T = 16K .. 512K in both precisions (the bench's workspace is now the
# fused path's, so T=524288 fits an H100's memory); the environment's tunings pass through.
# run(command="bash .dev/all/callBW.sh", carry=[".dev/all"])
cd "$(dirname "$0")"
TAG=bw; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
env | grep DELTANET_ | tee $R/env.txt
per_token 16384 65536 131072 262144 524288
pack
