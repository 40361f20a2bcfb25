#!/usr/bin/env python3
"""Check a nightshift audit export without nightshift: recompute every
record's hash and every link to the record before.

    nightshift audit export --format jsonl | scripts/verify-chain.py
    nightshift audit export --format jsonl | scripts/verify-chain.py --head SEQ:HASH

Version 2 records ("v": 2) are hashed over the RFC 8785 canonical JSON of
the record without "hash". Version 1 records (written before the format
had a version) are hashed over serde_json's compact bytes of the fields in
a fixed order (seq, ts_ms, kind, run, node, gpu, runbook, actor, data with
its keys sorted, prev_hash), reproduced here; a version 1 record is
accepted only before the first version 2 one, so removing "v" from a
record is a downgrade that is refused, never a way around the hash.

--head SEQ:HASH (the line `nightshift audit head` printed, kept somewhere
the engine cannot write) also requires record SEQ to carry HASH: a store
rewritten whole, hashes and all, fails there.

Prints "ok: N records (K version 1)" and exits 0, or names the first bad
record and exits 1.

The canonical forms here cover what nightshift writes (object keys are
ASCII, numbers within double range); for anything else use a full RFC 8785
library.
"""
import hashlib
import json
import math
import sys

GENESIS = "0" * 64


def dump(o, number):
    """Compact JSON with object keys sorted and floats written by `number`:
    RFC 8785 (version 2) and serde_json (version 1) differ only there. (RFC
    8785 sorts keys by UTF-16 code units, serde_json by bytes: the same for
    the ASCII keys nightshift writes.)"""
    if isinstance(o, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + dump(o[k], number) for k in sorted(o)) + "}"
    if isinstance(o, list):
        return "[" + ",".join(dump(x, number) for x in o) + "]"
    if isinstance(o, bool) or o is None:
        return json.dumps(o)
    if isinstance(o, float):
        return number(o)
    return json.dumps(o, ensure_ascii=False)


def ecma(o):
    """A float in ECMAScript number form: 700.0 is "700", 0.1 stays "0.1"."""
    if o.is_integer() and abs(o) < 1e21:
        return str(int(o))
    r = repr(o)
    if "e" in r:
        mant, exp = r.split("e")
        r = mant + "e" + ("+" if not exp.startswith("-") else "-") + exp.lstrip("+-").lstrip("0")
    return r


def canon(o):
    return dump(o, ecma)


def ryu(o):
    """A float as serde_json writes it (the ryu crate's shortest form):
    700.0, 0.1, 1e+16, 1.5e-7, 0.0001."""
    if o == 0:
        return "-0.0" if math.copysign(1.0, o) < 0 else "0.0"
    r = repr(o)
    sign = ""
    if r.startswith("-"):
        sign, r = "-", r[1:]
    mant, _, exp = r.partition("e")
    ip, _, fp = mant.partition(".")
    digits = (ip + fp).lstrip("0")
    k = int(exp or 0) - len(fp)
    stripped = digits.rstrip("0")
    k += len(digits) - len(stripped)
    digits = stripped
    length = len(digits)
    kk = length + k
    if 0 <= k and kk <= 16:
        out = digits + "0" * k + ".0"
    elif 0 < kk <= 16:
        out = digits[:kk] + "." + digits[kk:]
    elif -5 < kk <= 0:
        out = "0." + "0" * -kk + digits
    else:
        exp = kk - 1
        mant = digits if length == 1 else digits[0] + "." + digits[1:]
        out = mant + "e" + ("+" if exp >= 0 else "") + str(exp)
    return sign + out


def compact(o):
    """serde_json's compact bytes of a parsed value (its maps sort keys)."""
    return dump(o, ryu)


V1_FIELDS = ("seq", "ts_ms", "kind", "run", "node", "gpu", "runbook", "actor", "data", "prev_hash")


def v1_hash(rec):
    body = "{" + ",".join(json.dumps(k) + ":" + compact(rec.get(k)) for k in V1_FIELDS) + "}"
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def parse_head(arg):
    seq, _, digest = arg.partition(":")
    if not seq.isdigit() or len(digest) != 64:
        raise SystemExit(f"--head: expected SEQ:HASH (a record number and 64 hex digits), found {arg!r}")
    return int(seq), digest.lower()


def main():
    head = None
    args = sys.argv[1:]
    if args[:1] == ["--head"] and len(args) == 2:
        head = parse_head(args[1])
    elif args:
        raise SystemExit("usage: verify-chain.py [--head SEQ:HASH] < export.jsonl")
    prev, n, v1, first_v2 = GENESIS, 0, 0, None
    head_seen = False
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
            # Version 1 is only ever a prefix (records from before the
            # switch): a version 1 record after a version 2 one is a
            # downgrade.
            print(f"record {seq} (line {lineno}): expected hash version 2 after record {first_v2}, found version 1")
            return 1
        elif version == 1:
            digest = v1_hash(rec)
            if digest != rec.get("hash"):
                print(f"record {seq} (line {lineno}): expected hash {digest} (version 1), found {rec.get('hash')}")
                return 1
            v1 += 1
        else:
            print(f"record {seq} (line {lineno}): expected hash version 1 or 2, found {version}")
            return 1
        if head is not None and seq == head[0]:
            if rec["hash"].lower() != head[1]:
                print(f"record {seq} (line {lineno}): expected the anchored hash {head[1]}, found {rec['hash']}")
                return 1
            head_seen = True
        prev, n = rec["hash"], n + 1
    if head is not None and not head_seen:
        print(f"expected record {head[0]} (the anchored head) in the export, found the chain ends at {n} records")
        return 1
    print(f"ok: {n} records ({v1} version 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
