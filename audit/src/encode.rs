//! A record's two encodings — the canonical bytes its hash covers and its
//! line in the record log — built by its caller, all but the three fields
//! only the writer knows (`seq`, `ts_ms`, `prev_hash`).
//!
//! The writer thread chains records one after another: each hash covers
//! the one before, so that work is serial, on one thread, for every
//! appender at once. Here the caller's own task does what does not depend
//! on the chain — RFC 8785 canonical JSON of the payload and of every other
//! hashed field, serde_json's bytes of the line — and the writer only
//! streams SHA-256 over those bytes with the three fields spliced in, then
//! copies the line together.
//!
//! The bytes are the same as [`AuditRecord::compute_hash`] and
//! `serde_json::to_vec(&record)` produce: the tests below compare them on
//! generated records, and every chain written this way is verified by
//! `compute_hash` itself (`verify`, open, salvage). What this module cannot
//! write exactly — a number past 2^53 (RFC 8785 writes numbers as doubles),
//! a previous hash that is not lowercase hex, a payload the canonicaliser
//! refuses — takes the slow path: the record is hashed and serialized
//! whole, as before.

use std::ops::Range;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::runs::RunSummary;
use super::{AuditRecord, CHAIN_VERSION, NewRecord, sha256_hex};

/// Integers up to this are written as plain digits by RFC 8785 (they are
/// exact as doubles); past it the slow path asks the canonicaliser.
const EXACT: u64 = 1 << 53;

/// A record made ready by its caller: chained by [`Prepared::chain`].
pub(super) struct Prepared {
    /// The record, `seq`, `ts_ms`, `prev_hash` and `hash` not yet set.
    record: AuditRecord,
    /// Canonical bytes of the hashed fields up to `prev_hash`'s value
    /// (`hash[..split]`), then from after it up to `seq`'s (`hash[split..]`).
    /// Empty when the slow path is taken.
    hash: Vec<u8>,
    split: usize,
    /// serde_json's bytes of the line from after `ts_ms`'s value up to
    /// `prev_hash`'s.
    line: Vec<u8>,
    /// The exact bytes of the run summary the record changes.
    summary: Option<Vec<u8>>,
    /// The summary line after its `summary_of` value: `,"summary":"…"}`.
    summary_tail: Vec<u8>,
    /// The summary's run id and creation time.
    meta: Option<(String, i64)>,
}

/// A record chained: its hash set, its lines in the buffer.
pub(super) struct Chained {
    pub(super) record: AuditRecord,
    /// Where its record line (without the newline) is in the buffer.
    pub(super) line: Range<usize>,
    pub(super) summary: Option<Vec<u8>>,
    pub(super) meta: Option<(String, i64)>,
}

/// (A failure leaves part of `v` in `buf`: the slow path is taken then.)
fn canon<T: Serialize>(buf: &mut Vec<u8>, v: &T) -> bool {
    serde_json_canonicalizer::to_writer(v, buf).is_ok()
}

/// RFC 8785 canonical JSON of a payload, written directly: the general
/// canonicaliser buffers and sorts every object member through its own
/// formatter, which was most of a caller's cost. Strings are escaped as
/// serde_json escapes them (the same rule: `"`, `\` and U+0000–U+001F,
/// with the short forms and lowercase `\u00xx`); members are ordered by
/// their names' UTF-16 code units; integers up to 2^53 are plain digits,
/// and every other number is written by the canonicaliser itself.
fn canon_value(buf: &mut Vec<u8>, v: &serde_json::Value) -> bool {
    use serde_json::Value;
    match v {
        Value::Null => buf.extend_from_slice(b"null"),
        Value::Bool(true) => buf.extend_from_slice(b"true"),
        Value::Bool(false) => buf.extend_from_slice(b"false"),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) if i.unsigned_abs() <= EXACT => push_int(buf, i128::from(i)),
            (_, Some(u)) if u <= EXACT => push_int(buf, i128::from(u)),
            _ => return canon(buf, n),
        },
        Value::String(s) => return json(buf, s),
        Value::Array(items) => {
            buf.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                if !canon_value(buf, item) {
                    return false;
                }
            }
            buf.push(b']');
        }
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            // UTF-8 byte order is UTF-16 order but for characters past
            // U+D7FF; only names holding one need the slower comparison.
            if members.iter().any(|(k, _)| k.chars().any(|c| c > '\u{d7ff}')) {
                members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            } else {
                members.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            }
            buf.push(b'{');
            for (i, (k, item)) in members.into_iter().enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                if !json(buf, k) {
                    return false;
                }
                buf.push(b':');
                if !canon_value(buf, item) {
                    return false;
                }
            }
            buf.push(b'}');
        }
    }
    true
}

fn json<T: Serialize + ?Sized>(buf: &mut Vec<u8>, v: &T) -> bool {
    serde_json::to_writer(&mut *buf, v).is_ok()
}

/// Decimal digits of `n`, as both encoders write an integer.
fn push_int(buf: &mut Vec<u8>, n: i128) {
    let mut digits = [0u8; 40];
    let mut i = digits.len();
    let mut m = n.unsigned_abs();
    loop {
        i -= 1;
        digits[i] = b'0' + (m % 10) as u8;
        m /= 10;
        if m == 0 {
            break;
        }
    }
    if n < 0 {
        buf.push(b'-');
    }
    buf.extend_from_slice(&digits[i..]);
}

fn is_hex(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Prepared {
    /// Prepare `rec` (and the summary it changes: its digest goes into the
    /// payload as `summary_sha256`, so the chain vouches for it).
    pub(super) fn new(rec: NewRecord, summary: Option<&RunSummary>) -> Prepared {
        let summary_bytes = summary.map(|s| serde_json::to_vec(s).unwrap_or_default());
        let mut record = rec.unchained();
        if let (Some(bytes), Some(obj)) = (&summary_bytes, record.data.as_object_mut()) {
            obj.insert("summary_sha256".into(), serde_json::Value::String(sha256_hex(bytes)));
        }
        let r = &record;
        // RFC 8785 orders an object's members by name: these are in order.
        // Strings, integers and null are written alike by RFC 8785 and by
        // serde_json (`canon_value`); the payload is not.
        let mut hash = Vec::with_capacity(256);
        let mut ok = true;
        hash.extend_from_slice(b"{\"actor\":");
        ok &= json(&mut hash, &r.actor);
        hash.extend_from_slice(b",\"data\":");
        ok &= canon_value(&mut hash, &r.data);
        hash.extend_from_slice(b",\"gpu\":");
        ok &= json(&mut hash, &r.gpu);
        hash.extend_from_slice(b",\"kind\":");
        ok &= json(&mut hash, &r.kind);
        hash.extend_from_slice(b",\"node\":");
        ok &= json(&mut hash, &r.node);
        hash.extend_from_slice(b",\"prev_hash\":\"");
        let split = hash.len();
        hash.extend_from_slice(b"\",\"run\":");
        ok &= json(&mut hash, &r.run);
        hash.extend_from_slice(b",\"runbook\":");
        ok &= json(&mut hash, &r.runbook);
        hash.extend_from_slice(b",\"seq\":");
        // serde_json writes the struct's fields in their declared order.
        let mut line = Vec::with_capacity(256);
        line.extend_from_slice(b",\"kind\":");
        ok &= json(&mut line, &r.kind);
        line.extend_from_slice(b",\"run\":");
        ok &= json(&mut line, &r.run);
        line.extend_from_slice(b",\"node\":");
        ok &= json(&mut line, &r.node);
        line.extend_from_slice(b",\"gpu\":");
        ok &= json(&mut line, &r.gpu);
        line.extend_from_slice(b",\"runbook\":");
        ok &= json(&mut line, &r.runbook);
        line.extend_from_slice(b",\"actor\":");
        ok &= json(&mut line, &r.actor);
        line.extend_from_slice(b",\"data\":");
        ok &= json(&mut line, &r.data);
        line.extend_from_slice(b",\"prev_hash\":\"");
        let mut summary_tail = Vec::new();
        if let Some(bytes) = &summary_bytes {
            summary_tail.extend_from_slice(b",\"summary\":");
            ok &= json(&mut summary_tail, &*String::from_utf8_lossy(bytes));
            summary_tail.push(b'}');
        }
        if !ok {
            hash.clear();
        }
        Prepared {
            record,
            hash,
            split,
            line,
            summary: summary_bytes,
            summary_tail,
            meta: summary.map(|s| (s.id.clone(), s.created_ms)),
        }
    }

    /// Chain the record as `seq` after `prev` at `ts_ms`: its hash, and its
    /// line (with its summary line, if any) appended to `buf`, each ending
    /// in a newline.
    pub(super) fn chain(self, seq: u64, ts_ms: i64, prev: &str, buf: &mut Vec<u8>) -> Chained {
        let mut r = self.record;
        r.seq = seq;
        r.ts_ms = ts_ms;
        r.prev_hash = prev.to_string();
        let start = buf.len();
        if self.hash.is_empty() || seq > EXACT || ts_ms.unsigned_abs() > EXACT || !is_hex(prev) {
            r.hash = r.compute_hash();
            let _ = serde_json::to_writer(&mut *buf, &r);
        } else {
            let mut h = Sha256::new();
            h.update(&self.hash[..self.split]);
            h.update(prev.as_bytes());
            h.update(&self.hash[self.split..]);
            // The tail goes into `buf` first (where the line will be), is
            // hashed, and is then overwritten by the line.
            push_int(buf, i128::from(seq));
            buf.extend_from_slice(b",\"ts_ms\":");
            push_int(buf, i128::from(ts_ms));
            buf.extend_from_slice(b",\"v\":");
            push_int(buf, i128::from(CHAIN_VERSION));
            buf.push(b'}');
            h.update(&buf[start..]);
            buf.truncate(start);
            let mut hex = [0u8; 64];
            // 32 bytes always fit 64 hex digits.
            let _ = hex::encode_to_slice(h.finalize(), &mut hex);
            r.hash = String::from_utf8_lossy(&hex).into_owned();
            buf.extend_from_slice(b"{\"seq\":");
            push_int(buf, i128::from(seq));
            buf.extend_from_slice(b",\"ts_ms\":");
            push_int(buf, i128::from(ts_ms));
            buf.extend_from_slice(&self.line);
            buf.extend_from_slice(prev.as_bytes());
            buf.extend_from_slice(b"\",\"hash\":\"");
            buf.extend_from_slice(r.hash.as_bytes());
            buf.extend_from_slice(b"\",\"v\":");
            push_int(buf, i128::from(CHAIN_VERSION));
            buf.push(b'}');
        }
        let line = start..buf.len();
        buf.push(b'\n');
        if self.summary.is_some() {
            buf.extend_from_slice(b"{\"summary_of\":");
            push_int(buf, i128::from(seq));
            buf.extend_from_slice(&self.summary_tail);
            buf.push(b'\n');
        }
        Chained { record: r, line, summary: self.summary, meta: self.meta }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::encode_lines;
    use crate::{GENESIS, RecordKind};
    use serde_json::{Value, json};

    /// The slow path: the record hashed and serialized whole, as
    /// `compute_hash` and serde_json do — what the fast path must equal.
    fn slow(rec: &NewRecord, summary: Option<&RunSummary>, seq: u64, ts_ms: i64, prev: &str) -> (AuditRecord, Vec<u8>) {
        let sb = summary.map(|s| serde_json::to_vec(s).unwrap());
        // Built field by field here (not through `unchained`): the test's
        // reference shares no code with what it checks but `compute_hash`.
        let mut data = rec.data.clone();
        if let (Some(b), Some(o)) = (&sb, data.as_object_mut()) {
            o.insert("summary_sha256".into(), Value::String(sha256_hex(b)));
        }
        let mut r = AuditRecord {
            seq,
            ts_ms,
            kind: rec.kind,
            run: rec.run.clone(),
            node: rec.node.clone(),
            gpu: rec.gpu,
            runbook: rec.runbook.clone(),
            actor: rec.actor.clone(),
            data,
            prev_hash: prev.into(),
            hash: String::new(),
            v: Some(2),
        };
        r.hash = r.compute_hash();
        let mut buf = Vec::new();
        encode_lines(&mut buf, &serde_json::to_vec(&r).unwrap(), seq, sb.as_deref());
        (r, buf)
    }

    /// A small deterministic generator (no dependency for it).
    struct Gen(u64);
    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
            xs[(self.next() % xs.len() as u64) as usize]
        }
        /// Strings that exercise escaping: quotes, backslashes, controls,
        /// non-ASCII, astral characters (RFC 8785 sorts names by UTF-16).
        fn text(&mut self) -> String {
            let parts = [
                "gpu",
                "a\"b",
                "back\\slash",
                "tab\tnl\n",
                "\u{1}\u{1f}",
                "é",
                "日本",
                "\u{1F600}",
                "\u{e000}",
                "",
                "/",
                "\u{7f}",
                "\u{2028}",
                "x",
            ];
            (0..self.next() % 4).map(|_| self.pick(&parts)).collect()
        }
        fn number(&mut self) -> Value {
            match self.next() % 8 {
                0 => json!(self.next() as i64),
                1 => json!(-((self.next() % 1000) as i64)),
                2 => json!((self.next() % 100_000) as f64 / 7.0),
                3 => json!(1e21),
                4 => json!(0.1),
                5 => json!(u64::MAX),
                6 => json!(-0.0),
                _ => json!((self.next() % (1 << 53)) as i64),
            }
        }
        fn value(&mut self, depth: u32) -> Value {
            match self.next() % if depth == 0 { 4 } else { 6 } {
                0 => Value::Null,
                1 => Value::Bool(self.next().is_multiple_of(2)),
                2 => self.number(),
                3 => Value::String(self.text()),
                4 => Value::Array((0..self.next() % 4).map(|_| self.value(depth - 1)).collect()),
                _ => Value::Object((0..self.next() % 5).map(|_| (self.text(), self.value(depth - 1))).collect()),
            }
        }
        fn opt(&mut self) -> Option<String> {
            (!self.next().is_multiple_of(3)).then(|| self.text())
        }
    }

    fn summary(id: &str) -> RunSummary {
        let queued = AuditRecord {
            seq: 1,
            ts_ms: 1,
            kind: RecordKind::RunQueued,
            run: Some(id.into()),
            node: Some("n1".into()),
            gpu: None,
            runbook: Some("rb".into()),
            actor: "user:a".into(),
            data: json!({"target": crate::runs::Target::node("n1"), "detail": "a \"quoted\" detail\n"}),
            prev_hash: String::new(),
            hash: String::new(),
            v: None,
        };
        crate::rebuild_summary(id, &[&queued]).unwrap_or_else(|| panic!("a summary of {id:?}"))
    }

    #[test]
    fn the_prepared_bytes_are_the_whole_records_bytes() {
        let kinds = [RecordKind::Note, RecordKind::ActionIntent, RecordKind::RunFinished, RecordKind::EventReceived];
        let mut g = Gen(0x9e37_79b9_7f4a_7c15);
        let mut prev = GENESIS.to_string();
        let (mut fast_paths, mut summaries) = (0, 0);
        for i in 0..3000u64 {
            let data = match g.next() % 5 {
                0 => Value::Null,
                1 => g.value(0),
                _ => Value::Object((0..g.next() % 6).map(|_| (g.text(), g.value(3))).collect()),
            };
            let mut rec = NewRecord::new(kinds[(g.next() % 4) as usize], &g.text(), data);
            rec.run = g.opt();
            rec.node = g.opt();
            rec.runbook = g.opt();
            rec.gpu = g.next().is_multiple_of(2).then(|| (g.next() % 9) as u32);
            let s = g.next().is_multiple_of(4).then(|| summary(&g.text()));
            let seq = match i % 50 {
                0 => EXACT + 1 + g.next() % 1000,
                1 => EXACT,
                _ => i + 1,
            };
            let ts = match i % 40 {
                0 => -(g.next() as i64 % 5000),
                1 => i64::MAX,
                2 => -(EXACT as i64),
                _ => 1_700_000_000_000 + i as i64,
            };
            let (want, want_line) = slow(&rec, s.as_ref(), seq, ts, &prev);
            let p = Prepared::new(rec, s.as_ref());
            fast_paths += usize::from(!p.hash.is_empty() && seq <= EXACT && ts.unsigned_abs() <= EXACT);
            summaries += usize::from(s.is_some());
            let mut buf = b"earlier lines\n".to_vec();
            let c = p.chain(seq, ts, &prev, &mut buf);
            assert_eq!(c.record, want, "record {i}");
            assert_eq!(c.record.compute_hash(), c.record.hash, "record {i}: its hash verifies");
            assert_eq!(&buf[14..], &want_line[..], "record {i}: {}", String::from_utf8_lossy(&buf));
            let line: AuditRecord = serde_json::from_slice(&buf[c.line.clone()]).unwrap();
            assert_eq!(line, want, "record {i}: the line reads back");
            assert_eq!(c.summary, s.as_ref().map(|s| serde_json::to_vec(s).unwrap()));
            prev = c.record.hash;
        }
        // The cases above reach both paths, and summaries.
        assert!(fast_paths > 2500 && fast_paths < 3000, "{fast_paths} on the fast path");
        assert!(summaries > 500, "{summaries} with a summary");
    }

    #[test]
    fn a_previous_hash_that_is_not_lowercase_hex_takes_the_slow_path() {
        for prev in ["ABCDEF", "a\"b", "é", ""] {
            let rec = NewRecord::new(RecordKind::Note, "engine", json!({"k": 1}));
            let (want, want_line) = slow(&rec, None, 7, 1000, prev);
            let mut buf = Vec::new();
            let c = Prepared::new(rec, None).chain(7, 1000, prev, &mut buf);
            assert_eq!((c.record, buf), (want, want_line), "prev {prev:?}");
        }
    }

    #[test]
    fn integers_are_written_as_both_encoders_write_them() {
        for n in [0i128, 7, -7, 10, 99, 100, i128::from(i64::MIN), i128::from(u64::MAX), 1 << 53] {
            let mut b = Vec::new();
            push_int(&mut b, n);
            assert_eq!(String::from_utf8(b).unwrap(), n.to_string());
        }
    }
}
