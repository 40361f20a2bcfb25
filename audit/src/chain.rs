//! The chain rule, written once: [`Walk`] checks records in `seq` order —
//! gap-free from 1, each linked to the one before, each hash its content's
//! — for every reader (the record log, sled, PostgreSQL), with one wording
//! per [`Break`]; and which breaks a `salvaged` record excuses. The lowest
//! layer of the crate: it names no other module.

use super::*;

/// The breaks in the chain (a gap before a record, or a `prev_hash` that
/// does not match) an earlier salvage documented: (the record after the
/// break, the `salvaged` record that documents it), sorted. A salvage is
/// appended after every record it recovered, so it can only excuse a break
/// before itself: a `salvaged` record put in the middle of the chain to
/// excuse the break it makes (its own, or the next record's link to it)
/// excuses nothing.
pub fn excuses<'a>(records: impl Iterator<Item = &'a AuditRecord>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = records
        .filter(|r| r.kind == RecordKind::Salvaged)
        .flat_map(|r| {
            let by = r.seq;
            r.data["excused"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|v| v.as_u64())
                .filter(move |e| *e < by)
                .map(move |e| (e, by))
        })
        .collect();
    out.sort_unstable();
    out.dedup_by_key(|(e, _)| *e);
    out
}

/// Why a record does not continue the chain. One wording for every reader
/// (the record log, sled, PostgreSQL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Break {
    /// A record is missing: `expected` came next, `found` came instead.
    Missing { expected: u64, found: u64 },
    /// `seq`'s `prev_hash` is not the record before it's hash.
    Unlinked { seq: u64 },
    /// `seq`'s content does not hash to its `hash`.
    Altered { seq: u64 },
    /// `seq` is a version 1 record after the version 2 record `first_v2`:
    /// version 1 is only ever a prefix of a chain (records written before
    /// the switch), so a later one is a downgrade.
    Downgraded { seq: u64, first_v2: u64 },
}

impl Break {
    /// The record the break is reported at.
    pub fn seq(&self) -> u64 {
        match self {
            Break::Missing { expected, .. } => *expected,
            Break::Unlinked { seq } | Break::Altered { seq } | Break::Downgraded { seq, .. } => *seq,
        }
    }
}

impl std::fmt::Display for Break {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Break::Missing { expected, found } => {
                write!(f, "record {expected} is missing (the next record is {found})")
            }
            Break::Unlinked { seq } => write!(
                f,
                "record {seq} does not link to record {}: its prev_hash is not that record's hash",
                seq.saturating_sub(1)
            ),
            Break::Altered { seq } => write!(f, "record {seq} was altered: its hash does not match its content"),
            Break::Downgraded { seq, first_v2 } => write!(
                f,
                "record {seq} was downgraded: expected hash version 2 after record {first_v2}, found version 1"
            ),
        }
    }
}

/// The chain rule, walked record by record in `seq` order: gap-free from 1,
/// each record linked to the one before, each hash its content's — except
/// the breaks an earlier salvage documented (`excused`), which are noted in
/// `used`.
pub struct Walk<'a> {
    expected: u64,
    prev: String,
    excused: &'a std::collections::HashMap<u64, u64>,
    /// The first version 2 record seen: no version 1 record may follow.
    first_v2: Option<u64>,
    /// (record after an excused break, the `salvaged` record excusing it).
    pub used: Vec<(u64, u64)>,
}

impl<'a> Walk<'a> {
    pub fn new(excused: &'a std::collections::HashMap<u64, u64>) -> Walk<'a> {
        Walk { expected: 1, prev: GENESIS.to_string(), excused, first_v2: None, used: Vec::new() }
    }

    /// The next `seq` the chain expects.
    pub fn expected(&self) -> u64 {
        self.expected
    }

    /// Records verified so far: 1 to `verified_up_to`.
    pub fn verified_up_to(&self) -> u64 {
        self.expected - 1
    }

    /// The report of a walk over `records` records that broke at
    /// `first_bad_seq` with `problem`.
    pub fn broken(&self, records: u64, first_bad_seq: u64, problem: String) -> crate::VerifyReport {
        crate::VerifyReport {
            ok: false,
            verified_up_to: self.verified_up_to(),
            records,
            first_bad_seq: Some(first_bad_seq),
            problem: Some(problem),
            excused: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// The report of a walk over `records` records that held, naming the
    /// breaks salvage records excused.
    pub fn whole(self, records: u64) -> crate::VerifyReport {
        crate::VerifyReport {
            ok: true,
            verified_up_to: self.verified_up_to(),
            records,
            first_bad_seq: None,
            problem: None,
            excused: self.used,
            notes: Vec::new(),
        }
    }

    /// Check the next record.
    pub fn check(&mut self, r: &AuditRecord) -> Result<(), Break> {
        let excuse = self.excused.get(&r.seq).copied();
        if (r.seq != self.expected || r.prev_hash != self.prev)
            && let Some(by) = excuse
        {
            self.used.push((r.seq, by));
        }
        if r.seq != self.expected && excuse.is_none() {
            return Err(Break::Missing { expected: self.expected, found: r.seq });
        }
        if r.prev_hash != self.prev && excuse.is_none() {
            return Err(Break::Unlinked { seq: r.seq });
        }
        if r.compute_hash() != r.hash {
            return Err(Break::Altered { seq: r.seq });
        }
        match (r.v, self.first_v2) {
            (None, Some(first_v2)) => return Err(Break::Downgraded { seq: r.seq, first_v2 }),
            (Some(_), None) => self.first_v2 = Some(r.seq),
            _ => {}
        }
        self.prev = r.hash.clone();
        self.expected = r.seq + 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(n: u64) -> Vec<AuditRecord> {
        let mut prev = GENESIS.to_string();
        (1..=n)
            .map(|seq| {
                let mut r = AuditRecord {
                    seq,
                    ts_ms: seq as i64,
                    kind: RecordKind::Note,
                    run: None,
                    node: None,
                    gpu: None,
                    runbook: None,
                    actor: "engine".into(),
                    data: serde_json::json!({"n": seq}),
                    prev_hash: prev.clone(),
                    hash: String::new(),
                    v: Some(2),
                };
                r.hash = r.compute_hash();
                prev = r.hash.clone();
                r
            })
            .collect()
    }

    /// One rule, one wording: a gap, a broken link, an edited record; a
    /// break a later salvage documents is excused and noted.
    #[test]
    fn the_chain_rule_names_each_break() {
        let walk = |recs: &[AuditRecord], excused: &std::collections::HashMap<u64, u64>| {
            let mut w = Walk::new(excused);
            let r = recs.iter().try_for_each(|r| w.check(r));
            (r.map_err(|b| b.to_string()), w.verified_up_to(), w.used)
        };
        let none = std::collections::HashMap::new();
        let ok = chain(4);
        assert_eq!(walk(&ok, &none), (Ok(()), 4, vec![]));
        let mut gap = chain(4);
        gap.remove(1);
        assert_eq!(walk(&gap, &none).0, Err("record 2 is missing (the next record is 3)".into()));
        let mut unlinked = chain(4);
        unlinked[2].prev_hash = "00".into();
        unlinked[2].hash = unlinked[2].compute_hash();
        assert_eq!(
            walk(&unlinked, &none).0,
            Err("record 3 does not link to record 2: its prev_hash is not that record's hash".into())
        );
        let mut altered = chain(4);
        altered[3].data = serde_json::json!({"n": 99});
        assert_eq!(walk(&altered, &none).0, Err("record 4 was altered: its hash does not match its content".into()));
        // A version 1 record (hashed as version 1, so its own hash checks)
        // after a version 2 one.
        let rechain = |recs: &mut [AuditRecord]| {
            let mut prev = GENESIS.to_string();
            for r in recs.iter_mut() {
                r.prev_hash = prev;
                r.hash = r.compute_hash();
                prev = r.hash.clone();
            }
        };
        let mut downgraded = chain(4);
        downgraded[2].v = None;
        rechain(&mut downgraded);
        assert_eq!(
            walk(&downgraded, &none).0,
            Err("record 3 was downgraded: expected hash version 2 after record 1, found version 1".into())
        );
        let mut prefix = chain(4);
        prefix[0].v = None;
        prefix[1].v = None;
        rechain(&mut prefix);
        assert_eq!(
            walk(&prefix, &none),
            (Ok(()), 4, vec![]),
            "version 1 as a prefix is a store from before the switch"
        );
        // Record 3 follows a documented loss (record 2 gone), excused by record 9.
        let excused = std::collections::HashMap::from([(3, 9)]);
        assert_eq!(walk(&gap, &excused), (Ok(()), 4, vec![(3, 9)]));
    }
}
