//! The chain's rules that more than one reader applies: which breaks a
//! `salvaged` record excuses (the record log's open, `verify`, salvage).
//! The lowest layer of the crate: it names no other module.

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
