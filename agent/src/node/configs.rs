//! Managed config files (an NCCL environment file, a fabric-manager config)
//! with a version history and a last-known-good mark.
//!
//! Layout under the state dir: `configs/<name>/history.json` and
//! `configs/<name>/v<N>` holding each version's content. Applying writes the
//! target file atomically; rolling back writes an earlier version back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::NodeError;
use nightshift_proto::fsutil::{replace_contents, write_atomic};

/// One managed file, as configured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManagedConfig {
    /// The file nightshift writes.
    pub path: PathBuf,
    /// Who reads the file, and so what must restart for a change to take
    /// effect: `files` (read at every use: at once), `jobs` (the running
    /// jobs read it when they start: they are requeued), or `unit` (a
    /// systemd service, restarted with `systemctl restart <unit>`).
    #[serde(default)]
    pub consumer: Consumer,
    /// The systemd unit, with `consumer: unit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// `systemctl` (argv[0] of the restart).
    #[serde(default = "systemctl", skip_serializing_if = "is_systemctl")]
    pub systemctl_path: String,
}

/// Who reads a managed config.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Consumer {
    #[default]
    Files,
    Jobs,
    Unit,
}

fn systemctl() -> String {
    "systemctl".into()
}

fn is_systemctl(s: &str) -> bool {
    s == "systemctl"
}

impl ManagedConfig {
    /// A file read at every use (a change takes effect at once).
    pub fn file(path: PathBuf) -> ManagedConfig {
        ManagedConfig { path, consumer: Consumer::Files, unit: None, systemctl_path: systemctl() }
    }

    /// What the agent's config must say, checked at start.
    pub fn check(&self) -> Result<(), String> {
        match (self.consumer, &self.unit) {
            (Consumer::Unit, None) => Err("consumer: unit needs `unit:` (the systemd unit to restart)".into()),
            (Consumer::Unit, Some(u))
                if u.is_empty()
                    || !u.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@' | ':')) =>
            {
                Err(format!("unit: expected a systemd unit name such as nvidia-fabricmanager, found {u:?}"))
            }
            (Consumer::Files | Consumer::Jobs, Some(_)) => Err("unit: only with consumer: unit".into()),
            _ => Ok(()),
        }
    }
}

/// One recorded version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigVersion {
    pub version: u32,
    pub sha256: String,
    pub applied_at_ms: i64,
    #[serde(default)]
    pub note: Option<String>,
    /// `Some(true)` known good, `Some(false)` known bad.
    #[serde(default)]
    pub good: Option<bool>,
}

/// A config's history.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigHistory {
    pub name: String,
    pub path: PathBuf,
    pub current: Option<u32>,
    pub last_good: Option<u32>,
    pub versions: Vec<ConfigVersion>,
}

impl ConfigHistory {
    fn find(&self, version: u32) -> Option<&ConfigVersion> {
        self.versions.iter().find(|v| v.version == version)
    }
}

/// The store.
#[derive(Debug, Clone)]
pub struct ConfigStore {
    root: PathBuf,
    managed: BTreeMap<String, ManagedConfig>,
}

fn sha(content: &str) -> String {
    hex::encode(Sha256::digest(content.as_bytes()))
}

impl ConfigStore {
    pub fn new(root: PathBuf, managed: BTreeMap<String, ManagedConfig>) -> ConfigStore {
        ConfigStore { root, managed }
    }

    /// Names of managed configs.
    pub fn names(&self) -> Vec<String> {
        self.managed.keys().cloned().collect()
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn managed(&self, name: &str) -> Result<&ManagedConfig, NodeError> {
        self.managed.get(name).ok_or_else(|| {
            NodeError::NotFound(format!(
                "no managed config named `{name}`: expected one of [{}] (add it under `configs:` in agent.yaml)",
                self.names().join(", ")
            ))
        })
    }

    /// Read a config's history; on first use, the file on disk (if any)
    /// becomes version 1, marked good — it is what the node was running.
    pub fn history(&self, name: &str, now_ms: i64) -> Result<ConfigHistory, NodeError> {
        let managed = self.managed(name)?;
        let path = self.dir(name).join("history.json");
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| NodeError::Io(format!("config history {} is corrupt: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut h = ConfigHistory { name: name.into(), path: managed.path.clone(), ..Default::default() };
                if let Ok(content) = std::fs::read_to_string(&managed.path) {
                    self.store_version(name, 1, &content)?;
                    h.versions.push(ConfigVersion {
                        version: 1,
                        sha256: sha(&content),
                        applied_at_ms: now_ms,
                        note: Some("found on disk when nightshift first managed it".into()),
                        good: Some(true),
                    });
                    h.current = Some(1);
                    h.last_good = Some(1);
                    self.save(&h)?;
                }
                Ok(h)
            }
            Err(e) => Err(NodeError::Io(format!("cannot read {}: {e}", path.display()))),
        }
    }

    fn save(&self, h: &ConfigHistory) -> Result<(), NodeError> {
        let bytes = serde_json::to_vec_pretty(h).map_err(|e| NodeError::Io(e.to_string()))?;
        write_atomic(&self.dir(&h.name).join("history.json"), &bytes).map_err(|e| NodeError::Io(e.to_string()))
    }

    fn store_version(&self, name: &str, version: u32, content: &str) -> Result<(), NodeError> {
        write_atomic(&self.dir(name).join(format!("v{version}")), content.as_bytes())
            .map_err(|e| NodeError::Io(e.to_string()))
    }

    /// Content of a stored version.
    pub fn content(&self, name: &str, version: u32) -> Result<String, NodeError> {
        std::fs::read_to_string(self.dir(name).join(format!("v{version}")))
            .map_err(|e| NodeError::NotFound(format!("version {version} of `{name}` is not stored: {e}")))
    }

    /// Write the managed file: atomically where its folder is writable,
    /// in place where only the file is (systemd's `ProtectSystem=strict`
    /// with the file in `ReadWritePaths=`). Each version's content is
    /// stored first, so a torn in-place write is repaired by writing again.
    fn write_target(path: &Path, content: &str) -> Result<(), NodeError> {
        match replace_contents(path, content.as_bytes()) {
            Ok(in_place) => {
                if in_place {
                    tracing::info!(path = %path.display(), "config written in place: its folder is read-only");
                }
                Ok(())
            }
            Err(e) => Err(NodeError::Io(format!("cannot write {}: {e}", path.display()))),
        }
    }

    /// Write a new version and make it current. Returns the new history.
    pub fn apply(
        &self,
        name: &str,
        content: &str,
        note: Option<String>,
        now_ms: i64,
    ) -> Result<ConfigHistory, NodeError> {
        let mut h = self.history(name, now_ms)?;
        let version = h.versions.iter().map(|v| v.version).max().unwrap_or(0) + 1;
        self.store_version(name, version, content)?;
        Self::write_target(&h.path, content)?;
        h.versions.push(ConfigVersion { version, sha256: sha(content), applied_at_ms: now_ms, note, good: None });
        h.current = Some(version);
        self.save(&h)?;
        Ok(h)
    }

    /// The version the file on disk holds now: the current one when its
    /// content matches, else the newest recorded version with that content,
    /// else `None` (someone wrote content nightshift never recorded).
    pub fn version_on_disk(&self, h: &ConfigHistory) -> Option<u32> {
        let content = std::fs::read_to_string(&h.path).ok()?;
        let digest = sha(&content);
        if let Some(c) = h.current.and_then(|c| h.find(c))
            && c.sha256 == digest
        {
            return Some(c.version);
        }
        h.versions.iter().rev().find(|v| v.sha256 == digest).map(|v| v.version)
    }

    /// Record the file's content as a version when it matches none (a person
    /// edited it by hand) and make that version current. Returns the history.
    pub fn adopt_disk(&self, name: &str, now_ms: i64) -> Result<ConfigHistory, NodeError> {
        let mut h = self.history(name, now_ms)?;
        let Ok(content) = std::fs::read_to_string(&h.path) else { return Ok(h) };
        match self.version_on_disk(&h) {
            Some(v) if h.current == Some(v) => Ok(h),
            Some(v) => {
                h.current = Some(v);
                self.save(&h)?;
                Ok(h)
            }
            None => {
                let version = h.versions.iter().map(|v| v.version).max().unwrap_or(0) + 1;
                self.store_version(name, version, &content)?;
                h.versions.push(ConfigVersion {
                    version,
                    sha256: sha(&content),
                    applied_at_ms: now_ms,
                    note: Some("found on disk: changed outside nightshift".into()),
                    good: None,
                });
                h.current = Some(version);
                self.save(&h)?;
                Ok(h)
            }
        }
    }

    /// Whether applying `content` would change nothing.
    pub fn is_current(&self, h: &ConfigHistory, content: &str) -> bool {
        h.current.and_then(|c| h.find(c)).is_some_and(|v| v.sha256 == sha(content))
    }

    /// The version a rollback goes to: `to`, or the last known good.
    pub fn rollback_target(&self, h: &ConfigHistory, to: Option<u32>) -> Result<u32, NodeError> {
        let target = match to {
            Some(v) => v,
            None => h.last_good.ok_or_else(|| {
                NodeError::NotFound(format!(
                    "`{}` has no last-known-good version to roll back to: mark one with config_mark",
                    h.name
                ))
            })?,
        };
        if h.find(target).is_none() {
            let known: Vec<String> = h.versions.iter().map(|v| v.version.to_string()).collect();
            return Err(NodeError::NotFound(format!(
                "`{}` has no version {target}: expected one of [{}]",
                h.name,
                known.join(", ")
            )));
        }
        Ok(target)
    }

    /// Make `version` current again. Returns the new history and the content.
    pub fn rollback(&self, name: &str, version: u32, now_ms: i64) -> Result<(ConfigHistory, String), NodeError> {
        let mut h = self.history(name, now_ms)?;
        self.rollback_target(&h, Some(version))?;
        let content = self.content(name, version)?;
        Self::write_target(&h.path, &content)?;
        h.current = Some(version);
        self.save(&h)?;
        Ok((h, content))
    }

    /// Mark a version good (it becomes the last known good) or bad.
    pub fn mark(&self, name: &str, version: u32, good: bool, now_ms: i64) -> Result<ConfigHistory, NodeError> {
        let mut h = self.history(name, now_ms)?;
        self.rollback_target(&h, Some(version))?;
        for v in h.versions.iter_mut() {
            if v.version == version {
                v.good = Some(good);
            }
        }
        if good {
            h.last_good = Some(version);
        } else if h.last_good == Some(version) {
            h.last_good = h.versions.iter().filter(|v| v.good == Some(true)).map(|v| v.version).max();
        }
        self.save(&h)?;
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_rollback_mark() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("nccl.env");
        std::fs::write(&target, "NCCL_DEBUG=WARN\n").unwrap();
        let store = ConfigStore::new(
            dir.path().join("state"),
            [("nccl-env".to_string(), ManagedConfig::file(target.clone()))].into(),
        );
        let h = store.history("nccl-env", 1).unwrap();
        assert_eq!((h.current, h.last_good), (Some(1), Some(1)));
        let h = store.apply("nccl-env", "NCCL_P2P_DISABLE=1\n", Some("try".into()), 2).unwrap();
        assert_eq!(h.current, Some(2));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "NCCL_P2P_DISABLE=1\n");
        assert!(store.is_current(&h, "NCCL_P2P_DISABLE=1\n"));
        let to = store.rollback_target(&h, None).unwrap();
        assert_eq!(to, 1);
        let (h, content) = store.rollback("nccl-env", to, 3).unwrap();
        assert_eq!((h.current, content.as_str()), (Some(1), "NCCL_DEBUG=WARN\n"));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "NCCL_DEBUG=WARN\n");
        let h = store.mark("nccl-env", 2, false, 4).unwrap();
        assert_eq!(h.versions[1].good, Some(false));
        let err = store.rollback_target(&h, Some(7)).unwrap_err();
        assert_eq!(err.to_string(), "`nccl-env` has no version 7: expected one of [1, 2]");
        let err = store.history("fabric", 0).unwrap_err();
        assert!(err.to_string().contains("no managed config named `fabric`: expected one of [nccl-env]"));
    }

    /// Issue 46 point 11: applying and rolling back keep the managed file's
    /// own mode (a 0600 secret stayed 0600 only by luck of the umask; a
    /// 0644 file others read became the umask's); the copies of each
    /// version in the state dir are 0600.
    #[test]
    fn the_managed_file_keeps_its_mode_and_the_copies_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        for keep in [0o600, 0o640, 0o644] {
            let dir = tempfile::tempdir().unwrap();
            let target = dir.path().join("nccl.env");
            std::fs::write(&target, "NCCL_DEBUG=WARN\n").unwrap();
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(keep)).unwrap();
            let store = ConfigStore::new(
                dir.path().join("state"),
                [("nccl-env".to_string(), ManagedConfig::file(target.clone()))].into(),
            );
            store.apply("nccl-env", "NCCL_P2P_DISABLE=1\n", None, 2).unwrap();
            assert_eq!(mode(&target), keep, "applied");
            store.rollback("nccl-env", 1, 3).unwrap();
            assert_eq!(mode(&target), keep, "rolled back");
            for v in ["v1", "v2", "history.json"] {
                assert_eq!(mode(&store.dir("nccl-env").join(v)), 0o600, "{v}");
            }
        }
    }
}
