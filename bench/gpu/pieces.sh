#!/usr/bin/env bash
# Lays FILES out for the lent GPU machine, which takes at most 64 MiB of files per call with the
# repository's tracked files counted in: each file is cut into pieces (NAME.partNN) and the
# pieces are filled into .dev/c1, .dev/c2, ... (ignored through .git/info/exclude), each folder
# small enough for one call. Then, one call per folder in order, naming it in `carry`:
#   bash bench/gpu/hybrid.sh piece .dev/cK     (every folder but the last)
#   bash bench/gpu/hybrid.sh run .dev/cN       (the last: joins the pieces, then runs)
# Calls on a warm machine take ~7 s for 46 MB; the machine goes back after 30 s idle, so make
# them one right after the other.
#
#   bash bench/gpu/pieces.sh models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/dev/sift.gz /tmp/dev/gputest.gz
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qx '/.dev/' .git/info/exclude 2>/dev/null || echo '/.dev/' >> .git/info/exclude
tracked=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
budget=$(( (64 << 20) - tracked - (2 << 20) ))
[ "$budget" -gt $((8 << 20)) ] || { echo "the tracked files ($tracked bytes) leave no room in a 64 MiB call" >&2; exit 1; }
rm -rf .dev && mkdir -p .dev
folder=1; used=0; mkdir -p .dev/c1
for f in "$@"; do
    size=$(stat -c %s "$f"); off=0; k=0
    while [ "$off" -lt "$size" ]; do
        room=$((budget - used))
        if [ "$room" -lt $((1 << 20)) ]; then folder=$((folder + 1)); used=0; room=$budget; mkdir -p .dev/c$folder; fi
        n=$(( size - off < room ? size - off : room ))
        part=.dev/c$folder/$(basename "$f").part$(printf %02d $k)
        dd if="$f" of="$part" bs=1M iflag=skip_bytes,count_bytes skip="$off" count="$n" status=none
        off=$((off + n)); used=$((used + n)); k=$((k + 1))
    done
    sha256sum "$f" | sed "s|  .*|  $(basename "$f")|" >> .dev/c$folder/sums
done
# Every folder's sums travel with the last one (the join checks them).
cat .dev/c*/sums > /tmp/pieces.sums && rm -f .dev/c*/sums && mv /tmp/pieces.sums .dev/c$folder/sums
du -sb .dev/c* | sed 's|^|  |'
echo "$folder calls: piece .dev/c1 .. .dev/c$((folder - 1)), then run .dev/c$folder"
