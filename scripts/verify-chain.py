#!/usr/bin/env python3
"""Check a nightshift audit export without nightshift: recompute every
version 2 record's hash (SHA-256 of the RFC 8785 canonical JSON of the
record without "hash") and every link to the record before.

    nightshift audit export --format jsonl | scripts/verify-chain.py

Prints "ok: N records (K version 1 records linked, not rehashed)" and exits
0, or names the first bad record and exits 1. Version 1 records (written
before the format had a version) are checked for their links only: their
hash is over serde_json's bytes, which only nightshift reproduces.

The canonical form here covers what nightshift writes (object keys are
ASCII, numbers within double range); for anything else use a full RFC 8785
library.
"""
import hashlib
import json
import sys

GENESIS = "0" * 64


def canon(o):
    if isinstance(o, dict):
        # RFC 8785 sorts keys by UTF-16 code units; for ASCII keys that is
        # plain sorting.
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + canon(o[k]) for k in sorted(o)) + "}"
    if isinstance(o, list):
        return "[" + ",".join(canon(x) for x in o) + "]"
    if isinstance(o, bool) or o is None:
        return json.dumps(o)
    if isinstance(o, float):
        # ECMAScript number form: 700.0 is "700", 0.1 stays "0.1".
        if o.is_integer() and abs(o) < 1e21:
            return str(int(o))
        r = repr(o)
        if "e" in r:
            mant, exp = r.split("e")
            r = mant + "e" + ("+" if not exp.startswith("-") else "-") + exp.lstrip("+-").lstrip("0")
        return r
    return json.dumps(o, ensure_ascii=False)


def main():
    prev, n, v1, first_v2 = GENESIS, 0, 0, None
    for lineno, line in enumerate(sys.stdin, 1):
        line = line.strip("\x00\n ")
        if not line:
            continue
        rec = json.loads(line)
        if "summary_of" in rec:
            continue  # a run summary line of a raw records.jsonl
        seq = rec.get("seq")
        if rec.get("prev_hash") != prev:
            print(f"record {seq} (line {lineno}): expected prev_hash {prev}, found {rec.get('prev_hash')}")
            return 1
        version = rec.get("v", 1)
        if version == 2:
            if first_v2 is None:
                first_v2 = seq
            body = {k: v for k, v in rec.items() if k != "hash"}
            digest = hashlib.sha256(canon(body).encode("utf-8")).hexdigest()
            if digest != rec.get("hash"):
                print(f"record {seq} (line {lineno}): expected hash {digest}, found {rec.get('hash')}")
                return 1
        elif version == 1 and first_v2 is not None:
            # Every record after the first version 2 record is version 2: a
            # version 1 record there is a downgrade, which would hide an edit
            # (version 1 records are only linked here, not rehashed).
            print(f"record {seq} (line {lineno}): expected hash version 2 after record {first_v2}, found version 1")
            return 1
        elif version == 1:
            v1 += 1
        else:
            print(f"record {seq} (line {lineno}): expected hash version 1 or 2, found {version}")
            return 1
        prev, n = rec["hash"], n + 1
    print(f"ok: {n} records ({v1} version 1 records linked, not rehashed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
