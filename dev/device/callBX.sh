#!/usr/bin/env bash
# Issue 8 and 9 shapes in both precisions with the present default (the fast precision's
# chunk_intra variants on), FLA and (after callBR1.sh on the same machine) FlashQLA in the same
# call: callBU.sh without its T=524288 part.
# run(command="bash .dev/all/callBX.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/z3"])
TAG=bx PER_TOKEN=0 exec bash "$(dirname "$0")/callBU.sh"
