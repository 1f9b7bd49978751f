#!/usr/bin/env bash
# The NCCL exchange on the one GPU lent (one rank): the exchange's all-gather and the ranks over
# it against the plain forward (tests/cp.rs), with torch's libnccl (nvidia-nccl wheel) made
# loadable as libnccl.so.
# run(command="bash .dev/all/callAH.sh", carry=[".dev/all"])
cd "$(dirname "$0")"
TAG=ah; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0] + '/lib')" 2>/dev/null)
ls -la $NCCL_DIR | tee $R/nccl_lib.txt
mkdir -p /tmp/ncl && ln -sf $NCCL_DIR/libnccl.so.2 /tmp/ncl/libnccl.so
export LD_LIBRARY_PATH=/tmp/ncl:$NCCL_DIR:$LD_LIBRARY_PATH
run cp_test 120 env NCCL_DEBUG=WARN ./cp_test --nocapture
nvidia-smi -L | tee $R/gpus.txt
pack
