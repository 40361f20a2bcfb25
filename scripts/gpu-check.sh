#!/usr/bin/env bash
# Read-only hardware check: what `nightshift-agent probe` reads through NVML
# against what `nvidia-smi` reports, GPU by GPU — names, UUIDs, temperature,
# power draw, power limit and its min/max, utilisation, memory. Exits 1 on a
# mismatch beyond rounding and sampling jitter, 2 when a tool is missing.
# It changes nothing on the GPUs.
#
#   scripts/gpu-check.sh                       # nightshift-agent on PATH
#   NIGHTSHIFT_AGENT=target/release/nightshift-agent scripts/gpu-check.sh
#   NIGHTSHIFT_NVML_LIB=/path/libnvidia-ml.so.1  (a specific library)
set -euo pipefail

agent=${NIGHTSHIFT_AGENT:-nightshift-agent}
for tool in "$agent" nvidia-smi python3; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "gpu-check: $tool not found" >&2
    exit 2
  fi
done

probe_args=(probe --backend nvml --json)
if [ -n "${NIGHTSHIFT_NVML_LIB:-}" ]; then
  probe_args+=(--nvml-lib "$NIGHTSHIFT_NVML_LIB")
fi
probe=$("$agent" "${probe_args[@]}")
fields=index,name,uuid,temperature.gpu,power.draw,power.limit,power.min_limit,power.max_limit,utilization.gpu,memory.used,memory.total
smi=$(nvidia-smi --query-gpu="$fields" --format=csv,noheader,nounits)

python3 - "$probe" "$smi" <<'PY'
import json, sys

probe = json.loads(sys.argv[1])
rows = [[c.strip() for c in line.split(",")] for line in sys.argv[2].strip().splitlines()]
by_index = {g["index"]: g for g in probe["gpus"]}

def num(s):
    try:
        return float(s)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"

failures, lines = [], []

def check(gpu, what, ours, theirs, ok):
    good = theirs is None or ours is None or ok(ours, theirs)
    lines.append(f"GPU {gpu}  {what:<16} nightshift {ours!s:<28} nvidia-smi {theirs!s:<28} {'ok' if good else 'MISMATCH'}")
    if not good:
        failures.append(f"GPU {gpu} {what}: nightshift {ours}, nvidia-smi {theirs}")

if len(rows) != len(probe["gpus"]):
    failures.append(f"GPU count: nightshift {len(probe['gpus'])}, nvidia-smi {len(rows)}")
for r in rows:
    i = int(r[0])
    g = by_index.get(i)
    if g is None:
        failures.append(f"GPU {i}: nvidia-smi lists it, nightshift does not")
        continue
    s = g["sample"]
    same = lambda a, b: a == b
    near = lambda tol: (lambda a, b: abs(a - b) <= tol)
    rel = lambda frac, floor: (lambda a, b: abs(a - b) <= max(floor, frac * max(abs(a), abs(b))))
    check(i, "name", g["name"], r[1], same)
    check(i, "uuid", g.get("uuid"), r[2], same)
    # Static values: rounding only.
    check(i, "power limit W", s["power_limit_watts"], num(r[5]), near(1.0))
    check(i, "power min W", g["power_min_watts"], num(r[6]), near(1.0))
    check(i, "power max W", g["power_max_watts"], num(r[7]), near(1.0))
    check(i, "memory total MiB", g["mem_total_mib"], num(r[10]), rel(0.01, 2))
    # Live values, sampled a moment apart: jitter allowed.
    check(i, "temperature C", s["temperature_c"], num(r[3]), near(3.0))
    check(i, "power draw W", s["power_watts"], num(r[4]), rel(0.15, 20.0))
    check(i, "utilisation %", s["util_pct"], num(r[8]), near(15.0))
    check(i, "memory used MiB", g["mem_used_mib"], num(r[9]), rel(0.02, 64))

print("\n".join(lines))
if failures:
    print("gpu-check: MISMATCH\n  " + "\n  ".join(failures))
    sys.exit(1)
print(f"gpu-check: ok ({len(rows)} GPU(s), backend {probe['backend']})")
PY
