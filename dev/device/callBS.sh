#!/usr/bin/env bash
# After callBR.sh, on the same warm machine (it reads the WG_TRI setting callBR chose from
# /tmp/deltanet_wgtri; without it, the landed default): compute-sanitizer memcheck and racecheck
# over a selftest run (issue 8's bar: random problems of every option and the vector files), then
# time per token at B=1 from T=16K to 512K in both precisions (issue 8's flat-cost table).
# run(command="bash .dev/all/callBS.sh", carry=[".dev/all", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=bs; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
[ -f /tmp/deltanet_wgtri ] && export DELTANET_FUSED_WGTRI=$(cat /tmp/deltanet_wgtri)
echo "DELTANET_FUSED_WGTRI=${DELTANET_FUSED_WGTRI:-unset}" | tee $R/setting.txt
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for p in exact fast; do
  run sel_mem_$p 120 $cs --tool memcheck --error-exitcode 9 ./deltanet selftest --device cuda --count 4 --precision $p --vectors $TOP/.gpu/vectors
  pack
done
run sel_race 180 $cs --tool racecheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
pack
per_token 16384 65536 131072 262144 524288
pack
