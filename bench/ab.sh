#!/bin/bash
# Alternates sift binaries (or wrapper scripts) running `sift bench ARGS` for ROUNDS rounds and
# prints each one's median tok/s (the last tg/pp figure of each run): A/B comparisons on a noisy host.
# usage: ab.sh ROUNDS "ARGS" binA binB ...   (alternating; prints median tok/s per binary)
rounds=$1; args=$2; shift 2
declare -A res
for i in $(seq $rounds); do
  for b in "$@"; do
    v=$($b bench $args 2>&1 | grep -E "tg[0-9]+|pp[0-9]+" | tail -1 | awk -F'|' '{print $(NF-1)}' | awk '{print $1}')
    res[$b]="${res[$b]} $v"
  done
done
for b in "$@"; do
  echo "$b: $(echo ${res[$b]} | tr ' ' '\n' | sort -n | awk '{a[NR]=$1} END{print "median", a[int((NR+1)/2)], "all:"}') ${res[$b]}"
done
