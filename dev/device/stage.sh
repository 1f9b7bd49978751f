#!/usr/bin/env bash
# Builds the release binaries here and stages them, stripped, with the call scripts in .dev/all/
# (git-ignored), which a device call carries: run(command="bash .dev/all/callX.sh",
# carry=[".dev/all", ".gpu"]); .gpu/ comes from ../shared/gpu/prepare.sh (FLA's wheel, anchors.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-$PWD/.nvrtc/nvidia/cu13/lib}"
cargo build --release --bins --examples
cargo test --release --no-run 2>&1 | tee /tmp/deltanet-no-run.txt >/dev/null
D=.dev/all
mkdir -p $D
for n in engine fused decode cuda cp; do
  exe=$(grep -o "target/release/deps/$n-[0-9a-f]*" /tmp/deltanet-no-run.txt | head -1)
  cp "$exe" $D/${n}_test
done
cp target/release/deltanet $D/
cp target/release/examples/engine $D/engine_example
strip $D/*_test $D/deltanet $D/engine_example
cp dev/device/call*.sh dev/device/lib.sh $D/
du -sh $D
