#!/usr/bin/env bash
# Run nccl_regroup.py LAUNCHES times per form, each a fresh `torchrun --nproc-per-node 2`, and say of each launch
# how many groups ended and whether the next one hung (a rank's stack dump: faulthandler's "Timeout") or failed
# otherwise. One JSON line per launch in OUT/regroup.jsonl, the ranks' output beside it, a summary at the end.
#   scripts/probes/nccl-regroup.sh OUT LAUNCHES GROUPS FORM...      e.g.  ... "$OUT/regroup" 8 5 nccl device_id
set -uo pipefail
[ $# -ge 4 ] || { sed -n '2,5p' "$0" >&2; exit 2; }
out=$1 launches=$2 groups=$3; shift 3
mkdir -p "$out"
here=$(dirname "$0")
for n in $(seq 1 "$launches"); do
  for form in "$@"; do
    log=$out/$form-g$groups-$n
    t=$(date +%s.%N)
    timeout --kill-after=10 $(( 30 * groups + 60 )) torchrun --standalone --nproc-per-node 2 \
        "$here/nccl_regroup.py" --groups "$groups" --form "$form" >"$log.out" 2>"$log.err"
    rc=$?
    python3 - "$log" "$form" "$groups" "$n" "$rc" "$t" >>"$out/regroup.jsonl" <<'PY'
import json, sys, time
log, form, groups, n, rc, t = sys.argv[1:]
done = {}
for line in open(log + ".out"):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    done.setdefault(r["group"], set()).add(r["rank"])
ended = [g for g in range(1, int(groups) + 1) if done.get(g) == {0, 1}]
hung = "Timeout (" in open(log + ".err", errors="replace").read()
state = "ended" if len(ended) == int(groups) else ("hung" if hung else "failed")
print(json.dumps({"form": form, "groups": int(groups), "launch": int(n), "exit": int(rc), "groups_ended": len(ended),
                  "state": state, "wall_s": round(time.time() - float(t), 1)}))
PY
  done
done
python3 - "$out/regroup.jsonl" <<'PY'
import collections, json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = collections.defaultdict(list)
for r in rows:
    by[(r["form"], r["groups"])].append(r)
for (form, groups), rs in sorted(by.items()):
    states = collections.Counter(r["state"] for r in rs)
    hung_at = collections.Counter(r["groups_ended"] + 1 for r in rs if r["state"] == "hung")
    print(f"{form}, {groups} group(s) a process: {len(rs)} launches {dict(states)}, "
          f"{sum(r['groups_ended'] for r in rs)} groups ended, hung at group: {dict(sorted(hung_at.items())) or 'none'}")
PY
