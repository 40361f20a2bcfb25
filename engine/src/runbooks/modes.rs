//! Runbook modes (act or shadow) as an admin set them: the audit chain's
//! `runbook_mode` records are the truth; `runbook-modes.json` in the data
//! dir is a cache of them, rewritten when it disagrees.

use std::collections::BTreeMap;

/// The whole fleet's mode, one admin switch over every runbook's own:
/// `act` (each runbook in its mode), `shadow` (every automatic run is a
/// shadow run: admitted as if real, every action a dry run) or `paused`
/// (no automatic run starts — suppressed, audited once per runbook and
/// target, faults kept pending and a person told; runs already going go
/// on). A person's manual run is never held back by it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FleetMode {
    #[default]
    Act,
    Shadow,
    Paused,
}

impl FleetMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FleetMode::Act => "act",
            FleetMode::Shadow => "shadow",
            FleetMode::Paused => "paused",
        }
    }

    /// The mode a `fleet_mode` record sets; `shadow` for one that cannot be
    /// read (never `act` on a record nobody can read).
    pub fn of_record(r: &crate::audit::AuditRecord) -> FleetMode {
        r.payload::<crate::audit::data::FleetMode>()
            .ok()
            .and_then(|p| serde_json::from_value(serde_json::json!(p.to)).ok())
            .unwrap_or_else(|| {
                tracing::error!(seq = r.seq, "a fleet_mode record cannot be read: the fleet is taken as in shadow");
                FleetMode::Shadow
            })
    }
}

/// The runbook modes an admin set, over the manifests' — the chain's, kept
/// in `runbook-modes.json` after every change. Its map is its own: each
/// change is saved by the same call that makes it.
pub(crate) struct ModeBook {
    path: std::path::PathBuf,
    set: std::sync::Mutex<BTreeMap<String, crate::runbooks::manifest::Mode>>,
    /// The fleet's mode as last read from the chain, with the audit
    /// store's [`kind_changes`](crate::audit::AuditStore::kind_changes) read
    /// before it (`fleet_mode.rs`): every run reads the mode, and the chain
    /// is read again only when a record of its kind may have come.
    fleet: std::sync::Mutex<Option<(u64, FleetModeNow)>>,
}

/// The fleet's mode, with who set it and why (`None`: nobody yet).
pub(crate) type FleetModeNow = (FleetMode, Option<(String, String)>);

impl ModeBook {
    /// The modes the chain says ([`load_modes`]), kept under `data_dir`.
    pub(crate) fn load(audit: &crate::audit::AuditStore, data_dir: &std::path::Path) -> ModeBook {
        ModeBook {
            path: modes_path(data_dir),
            set: std::sync::Mutex::new(load_modes(audit, data_dir)),
            fleet: std::sync::Mutex::new(None),
        }
    }

    /// The fleet's mode read while the store's `kind_changes` was
    /// `version`, if that is the last one read.
    pub(crate) fn fleet_read_at(&self, version: u64) -> Option<FleetModeNow> {
        let g = self.fleet.lock().unwrap_or_else(|e| e.into_inner());
        g.as_ref().filter(|(v, _)| *v == version).map(|(_, m)| m.clone())
    }

    /// Keep the fleet's mode as read while `kind_changes` was `version`.
    pub(crate) fn keep_fleet(&self, version: u64, mode: FleetModeNow) {
        *self.fleet.lock().unwrap_or_else(|e| e.into_inner()) = Some((version, mode));
    }

    /// The mode an admin set for `runbook`, if any.
    pub(crate) fn get(&self, runbook: &str) -> Option<crate::runbooks::manifest::Mode> {
        self.lock().get(runbook).copied()
    }

    /// `runbook` now runs in `mode` (its record is on the chain), saved.
    pub(crate) fn set(&self, runbook: &str, mode: crate::runbooks::manifest::Mode) {
        let mut set = self.lock();
        set.insert(runbook.to_string(), mode);
        self.save(&set);
    }

    /// Exactly `modes` (a new leader takes the chain's: a mode the file held
    /// with no record behind it does not hold), saved.
    pub(crate) fn replace(&self, modes: BTreeMap<String, crate::runbooks::manifest::Mode>) {
        let mut set = self.lock();
        *set = modes;
        self.save(&set);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, crate::runbooks::manifest::Mode>> {
        self.set.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn save(&self, set: &BTreeMap<String, crate::runbooks::manifest::Mode>) {
        let bytes = serde_json::to_vec_pretty(set).unwrap_or_default();
        if let Err(e) = nightshift_proto::fsutil::write_atomic(&self.path, &bytes) {
            tracing::error!(path = %self.path.display(), error = %e, "cannot save runbook modes: they hold until a restart");
        }
    }
}

/// Where promotions and demotions are kept.
pub fn modes_path(data_dir: &std::path::Path) -> std::path::PathBuf {
    data_dir.join("runbook-modes.json")
}

/// The modes an admin set, as the audit chain records them (each runbook's
/// newest `runbook_mode` record). `runbook-modes.json` is only a cache of
/// them: a file that says otherwise (edited while the engine was stopped)
/// is named in the log and rewritten from the chain — no promotion holds
/// without its record.
pub fn load_modes(
    audit: &crate::audit::AuditStore,
    data_dir: &std::path::Path,
) -> BTreeMap<String, crate::runbooks::manifest::Mode> {
    let chain = match audit.records_of_kind(crate::audit::RecordKind::RunbookMode) {
        Ok(records) => modes_from_records(&records),
        Err(e) => {
            tracing::error!(error = %e, "cannot read the runbook modes from the audit chain: the manifests' modes hold");
            return BTreeMap::new();
        }
    };
    let path = modes_path(data_dir);
    let file: Option<BTreeMap<String, crate::runbooks::manifest::Mode>> =
        std::fs::read(&path).ok().and_then(|b| serde_json::from_slice(&b).ok());
    if file.as_ref() != Some(&chain) && (file.is_some() || !chain.is_empty()) {
        if file.is_some() {
            tracing::warn!(path = %path.display(), file = ?file, chain = ?chain,
                "runbook-modes.json disagrees with the audit chain (changed outside nightshift?): the chain's modes hold");
        }
        let bytes = serde_json::to_vec_pretty(&chain).unwrap_or_default();
        if let Err(e) = nightshift_proto::fsutil::write_atomic(&path, &bytes) {
            tracing::error!(path = %path.display(), error = %e, "cannot rewrite runbook-modes.json");
        }
    }
    chain
}

/// Each runbook's newest mode in `records` (oldest first).
pub fn modes_from_records(records: &[crate::audit::AuditRecord]) -> BTreeMap<String, crate::runbooks::manifest::Mode> {
    let mut out = BTreeMap::new();
    for r in records.iter().filter(|r| r.kind == crate::audit::RecordKind::RunbookMode) {
        let Some(name) = r.runbook.as_ref() else { continue };
        let to = match r.payload::<crate::audit::data::RunbookMode>() {
            Ok(p) => p.to,
            Err(e) => {
                tracing::error!(runbook = %name, error = %e, "an audited runbook mode cannot be read");
                continue;
            }
        };
        match serde_json::from_value::<crate::runbooks::manifest::Mode>(serde_json::json!(to)) {
            Ok(m) => {
                out.insert(name.clone(), m);
            }
            Err(e) => {
                tracing::error!(runbook = %name, seq = r.seq, error = %e, "an audited runbook mode cannot be read")
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Regression (issue 27 item 10: `runbook-modes.json` edited on a
    /// stopped engine promoted a runbook with no record while the chain
    /// still said shadow): the chain's modes hold and the file is rewritten.
    #[tokio::test]
    async fn runbook_modes_come_from_the_chain_not_the_file() {
        use crate::audit::{AuditStore, NewRecord, RecordKind};
        use crate::runbooks::manifest::Mode;
        let dir = tempfile::tempdir().unwrap();
        let clock: nightshift_proto::clock::SharedClock = Arc::new(nightshift_proto::clock::VirtualClock::new(1));
        let audit = AuditStore::open(dir.path(), clock).unwrap();
        audit
            .append(
                NewRecord::new(RecordKind::RunbookMode, "user:ada", serde_json::json!({"from": "shadow", "to": "act"}))
                    .runbook("hot-cap"),
                None,
            )
            .await
            .unwrap();
        let path = modes_path(dir.path());
        std::fs::write(&path, r#"{"hot-cap": "shadow", "drain-all": "act"}"#).unwrap();
        let modes = load_modes(&audit, dir.path());
        assert_eq!(modes, BTreeMap::from([("hot-cap".to_string(), Mode::Act)]));
        let file: BTreeMap<String, Mode> = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(file, modes, "the file is rewritten from the chain");
        // A lost file is rebuilt too.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(load_modes(&audit, dir.path()), modes);
        assert!(path.exists());
    }

    /// The book saves what it is told, and replaces whole.
    #[tokio::test]
    async fn the_mode_book_saves_each_change() {
        use crate::runbooks::manifest::Mode;
        let dir = tempfile::tempdir().unwrap();
        let clock: nightshift_proto::clock::SharedClock = Arc::new(nightshift_proto::clock::VirtualClock::new(1));
        let audit = crate::audit::AuditStore::open(dir.path(), clock).unwrap();
        let book = ModeBook::load(&audit, dir.path());
        let saved = || -> BTreeMap<String, Mode> {
            serde_json::from_slice(&std::fs::read(modes_path(dir.path())).unwrap_or_default()).unwrap_or_default()
        };
        book.set("hot-cap", Mode::Act);
        assert_eq!((book.get("hot-cap"), saved().len()), (Some(Mode::Act), 1));
        book.replace(BTreeMap::from([("drain".to_string(), Mode::Shadow)]));
        assert_eq!(book.get("hot-cap"), None);
        assert_eq!(saved(), BTreeMap::from([("drain".to_string(), Mode::Shadow)]));
    }
}
