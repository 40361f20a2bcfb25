//! RMA evidence (`collect_evidence`): what a GPU vendor asks for with a
//! return — NVIDIA's `nvidia-bug-report.sh`, AMD's `amd-smi` reports — and
//! the agent's last health check (with its `dcgmi diag`), gathered into a
//! folder on the node with every file hashed. Argument vectors through
//! [`crate::procs`] with a timeout, never a shell; the whole bundle never
//! exceeds `max_bytes`; only the newest `keep` bundles stay.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nightshift_proto::{EVIDENCE_MANIFEST, EvidenceBundle, EvidenceCollected, EvidenceFile, Vendor};
use serde::{Deserialize, Serialize};
use sha2::Digest;

/// The agent policy's `evidence:` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvidencePolicy {
    /// Where bundles go. Absent: `evidence/` in the agent's state folder.
    #[serde(default)]
    pub dir: Option<PathBuf>,
    /// For each tool (a bug report takes minutes on a busy node); 1 to 600
    /// (the engine waits 30 minutes for the whole bundle).
    #[serde(default = "default_timeout")]
    pub timeout_secs: u64,
    /// The most one bundle may hold on disk, all files together.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
    /// Bundles kept; older ones are removed when a new one is made.
    #[serde(default = "default_keep")]
    pub keep: usize,
    /// NVIDIA's bug-report script (run as `PATH --output-file FILE`).
    #[serde(default = "default_nvidia")]
    pub nvidia_bug_report_path: PathBuf,
    /// AMD's CLI (`static`, `metric` and `bad-pages` reports, `--json`).
    #[serde(default = "default_amd")]
    pub amd_smi_path: PathBuf,
}

fn default_timeout() -> u64 {
    300
}
fn default_max_bytes() -> u64 {
    256 << 20
}
fn default_keep() -> usize {
    20
}
fn default_nvidia() -> PathBuf {
    "nvidia-bug-report.sh".into()
}
fn default_amd() -> PathBuf {
    "amd-smi".into()
}

impl Default for EvidencePolicy {
    fn default() -> Self {
        EvidencePolicy {
            dir: None,
            timeout_secs: default_timeout(),
            max_bytes: default_max_bytes(),
            keep: default_keep(),
            nvidia_bug_report_path: default_nvidia(),
            amd_smi_path: default_amd(),
        }
    }
}

/// What one bundle is asked for.
pub struct Request<'a> {
    pub node: &'a str,
    pub gpu: Option<u32>,
    pub reason: &'a str,
    pub vendor: Vendor,
    pub now_ms: i64,
    /// The agent's last health check as JSON, if it ran one.
    pub last_health: Option<serde_json::Value>,
}

/// The tools to run for `vendor`: (file name, argv; `{out}` is the file's
/// path for a tool that writes its own file, else its stdout goes there).
fn commands(p: &EvidencePolicy, vendor: Vendor) -> Vec<(&'static str, Vec<String>)> {
    let s = |x: &Path| x.to_string_lossy().into_owned();
    match vendor {
        Vendor::Amd => ["static", "metric", "bad-pages"]
            .into_iter()
            .zip(["amd-smi-static.json", "amd-smi-metric.json", "amd-smi-bad-pages.json"])
            .map(|(what, file)| (file, vec![s(&p.amd_smi_path), what.to_string(), "--json".to_string()]))
            .collect(),
        _ => vec![(
            "nvidia-bug-report.out",
            vec![s(&p.nvidia_bug_report_path), "--output-file".into(), "{out}/nvidia-bug-report.log".into()],
        )],
    }
}

/// Gather one bundle under `root` (the policy's `dir`, or the state
/// folder's `evidence/`).
pub async fn collect(p: &EvidencePolicy, root: &Path, req: Request<'_>) -> Result<EvidenceCollected, String> {
    let id = format!("ev-{}-{}-{}", req.node, req.gpu.map_or("node".to_string(), |g| format!("gpu{g}")), req.now_ms);
    let dir = root.join(&id);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create the evidence folder {}: {e}", dir.display()))?;
    let timeout = Duration::from_secs(p.timeout_secs);
    let mut errors: Vec<(String, String)> = Vec::new();
    for (file, argv) in commands(p, req.vendor) {
        let argv: Vec<String> = argv.into_iter().map(|a| a.replace("{out}", &dir.to_string_lossy())).collect();
        let out = dir.join(file);
        match crate::procs::run_to_file(&argv, timeout, &out, p.max_bytes).await {
            Ok(c) => {
                if let Some(e) = c.error {
                    errors.push((file.to_string(), e));
                }
            }
            Err(e) => {
                // The tool is not there: the bundle says so in its place.
                let _ = std::fs::write(&out, format!("{e}\n"));
                errors.push((file.to_string(), e.to_string()));
            }
        }
    }
    if let Some(h) = &req.last_health {
        let text = serde_json::to_vec_pretty(h).unwrap_or_default();
        std::fs::write(dir.join("last-health-check.json"), text).map_err(|e| format!("cannot write: {e}"))?;
    }
    // Every file the tools left, in name order, within the bundle's limit.
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != EVIDENCE_MANIFEST)
        .collect();
    names.sort();
    let mut room = p.max_bytes;
    let mut files = Vec::new();
    for name in names {
        let path = dir.join(&name);
        let mut error = errors.iter().find(|(f, _)| *f == name).map(|(_, e)| e.clone());
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        if len > room {
            let f = std::fs::OpenOptions::new().write(true).open(&path).map_err(|e| e.to_string())?;
            f.set_len(room).map_err(|e| format!("cannot cut {}: {e}", path.display()))?;
            let cut = format!("cut from {len} bytes at the bundle's size limit of {} bytes", p.max_bytes);
            error = Some(error.map_or(cut.clone(), |e| format!("{e}; {cut}")));
        }
        let data = std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        room -= data.len() as u64;
        files.push(EvidenceFile {
            name,
            bytes: data.len() as u64,
            sha256: hex::encode(sha2::Sha256::digest(&data)),
            error,
        });
    }
    let bundle = EvidenceBundle {
        id: id.clone(),
        node: req.node.to_string(),
        gpu: req.gpu,
        reason: req.reason.to_string(),
        created_ms: req.now_ms,
        files,
    };
    let manifest = serde_json::to_vec_pretty(&bundle).map_err(|e| e.to_string())?;
    nightshift_proto::fsutil::write_atomic(&dir.join(EVIDENCE_MANIFEST), &manifest)
        .map_err(|e| format!("cannot write the evidence manifest: {e}"))?;
    prune(root, p.keep);
    Ok(EvidenceCollected {
        sha256: hex::encode(sha2::Sha256::digest(&manifest)),
        dir: dir.to_string_lossy().into_owned(),
        bundle,
    })
}

/// Why a piece of a bundle cannot be read: a name that is not one
/// (`BadRequest`), or nothing by that name (`NotFound`).
#[derive(Debug, Clone, PartialEq)]
pub enum ReadError {
    BadName(String),
    NotFound(String),
}

/// A piece of one file of a bundle under `root` (`read_evidence`): only a
/// bundle folder of `root`, only a file its manifest lists (or the
/// manifest), never through a link.
pub fn read(root: &Path, a: &nightshift_proto::ReadEvidenceArgs) -> Result<nightshift_proto::EvidenceChunk, ReadError> {
    use std::io::{Read, Seek, SeekFrom};
    for (what, name) in [("bundle", &a.bundle), ("file", &a.file)] {
        if !nightshift_proto::plain_evidence_name(name) {
            return Err(ReadError::BadName(format!(
                "{what}: expected a plain name (letters, digits, '-', '_', '.'; no path), found {name:?}"
            )));
        }
    }
    let dir = root.join(&a.bundle);
    let is_dir = std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir());
    let manifest = is_dir.then(|| std::fs::read(dir.join(EVIDENCE_MANIFEST)).ok()).flatten();
    let Some(bundle) = manifest.and_then(|m| serde_json::from_slice::<EvidenceBundle>(&m).ok()) else {
        return Err(ReadError::NotFound(format!(
            "bundle {}: no such bundle on this node (it keeps the newest ones only)",
            a.bundle
        )));
    };
    if a.file != EVIDENCE_MANIFEST && !bundle.files.iter().any(|f| f.name == a.file) {
        let names: Vec<&str> = bundle.files.iter().map(|f| f.name.as_str()).collect();
        return Err(ReadError::NotFound(format!(
            "file {}: expected one of {EVIDENCE_MANIFEST}, {} in bundle {}",
            a.file,
            names.join(", "),
            a.bundle
        )));
    }
    let path = dir.join(&a.file);
    let meta = std::fs::symlink_metadata(&path)
        .ok()
        .filter(|m| m.is_file())
        .ok_or_else(|| ReadError::NotFound(format!("file {} of bundle {}: not on the node", a.file, a.bundle)))?;
    let size = meta.len();
    let mut f = std::fs::File::open(&path).map_err(|e| ReadError::NotFound(format!("{}: {e}", path.display())))?;
    let offset = a.offset.min(size);
    f.seek(SeekFrom::Start(offset)).map_err(|e| ReadError::NotFound(format!("{}: {e}", path.display())))?;
    let mut buf = Vec::with_capacity(nightshift_proto::EVIDENCE_CHUNK_BYTES.min(size as usize));
    f.take(nightshift_proto::EVIDENCE_CHUNK_BYTES as u64)
        .read_to_end(&mut buf)
        .map_err(|e| ReadError::NotFound(format!("{}: {e}", path.display())))?;
    Ok(nightshift_proto::EvidenceChunk {
        offset,
        size,
        eof: offset + buf.len() as u64 >= size,
        data_hex: hex::encode(&buf),
    })
}

/// Keep the newest `keep` bundles (by their creation time in the name).
fn prune(root: &Path, keep: usize) {
    let Ok(rd) = std::fs::read_dir(root) else { return };
    let mut dirs: Vec<(i64, PathBuf)> = rd
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let ts = name.strip_prefix("ev-")?.rsplit('-').next()?.parse().ok()?;
            Some((ts, e.path()))
        })
        .collect();
    dirs.sort();
    let extra = dirs.len().saturating_sub(keep);
    for (_, d) in dirs.into_iter().take(extra) {
        if let Err(e) = std::fs::remove_dir_all(&d) {
            tracing::warn!(dir = %d.display(), error = %e, "cannot remove an old evidence bundle");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    fn req(now_ms: i64) -> Request<'static> {
        Request { node: "n1", gpu: Some(3), reason: "RMA", vendor: Vendor::Nvidia, now_ms, last_health: None }
    }

    /// A bug report is kept and hashed; one past the size limit is cut and
    /// says so; one that hangs is killed at the timeout and says so; a tool
    /// that is not installed leaves its error in its place. Every bundle
    /// verifies; older bundles beyond `keep` go.
    #[tokio::test]
    async fn a_bundle_is_hashed_bounded_in_size_and_time_and_verifies() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("evidence");
        let fine = script(tmp.path(), "fine.sh", "echo report > \"$2.gz\"; echo done");
        let huge = script(tmp.path(), "huge.sh", "head -c 3000000 /dev/zero > \"$2.gz\"");
        let hangs = script(tmp.path(), "hangs.sh", "echo started; sleep 30");
        let cases: [(PathBuf, u64, &str, Option<&str>); 4] = [
            (fine, 1 << 20, "nvidia-bug-report.log.gz", None),
            (huge, 1 << 20, "nvidia-bug-report.log.gz", Some("at the bundle's size limit of 1048576 bytes")),
            (hangs, 1 << 20, "nvidia-bug-report.out", Some("did not finish within 1 s and was killed")),
            (tmp.path().join("absent.sh"), 1 << 20, "nvidia-bug-report.out", Some("cannot start")),
        ];
        for (i, (tool, max, file, want)) in cases.into_iter().enumerate() {
            let p = EvidencePolicy {
                timeout_secs: 1,
                max_bytes: max,
                keep: 2,
                nvidia_bug_report_path: tool,
                ..EvidencePolicy::default()
            };
            let got = collect(&p, &root, req(1000 + i as i64)).await.unwrap();
            let f = got.bundle.files.iter().find(|f| f.name == file).unwrap_or_else(|| panic!("{i}: {got:?}"));
            match want {
                None => assert!(f.error.is_none(), "{i}: {f:?}"),
                Some(w) => assert!(f.error.as_deref().is_some_and(|e| e.contains(w)), "{i}: {f:?}"),
            }
            let total: u64 = got.bundle.files.iter().map(|f| f.bytes).sum();
            assert!(total <= max, "{i}: {total} bytes");
            let (back, sha) = nightshift_proto::verify_evidence_dir(Path::new(&got.dir)).unwrap();
            assert_eq!((back, sha), (got.bundle.clone(), got.sha256.clone()));
        }
        let left: Vec<_> = std::fs::read_dir(&root).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left.len(), 2, "keep: 2 → {left:?}");
    }

    #[tokio::test]
    async fn a_bundle_is_read_back_in_pieces_and_nothing_else_is() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("evidence");
        let tool = script(tmp.path(), "bug-report", "head -c 300000 /dev/zero | tr '\\0' x > \"$2.gz\"\n");
        let p = EvidencePolicy { nvidia_bug_report_path: tool, ..EvidencePolicy::default() };
        let got = collect(&p, &root, req(1000)).await.unwrap();
        std::fs::write(tmp.path().join("secret"), "not evidence").unwrap();
        let args = |bundle: &str, file: &str, offset: u64| nightshift_proto::ReadEvidenceArgs {
            bundle: bundle.into(),
            file: file.into(),
            offset,
        };
        // The whole file, in pieces.
        let mut data = Vec::new();
        loop {
            let c = read(&root, &args(&got.bundle.id, "nvidia-bug-report.log.gz", data.len() as u64)).unwrap();
            assert_eq!(c.size, 300_000);
            data.extend(hex::decode(&c.data_hex).unwrap());
            if c.eof {
                break;
            }
        }
        assert_eq!(data.len(), 300_000);
        assert_eq!(
            hex::encode(sha2::Sha256::digest(&data)),
            got.bundle.files.iter().find(|f| f.name == "nvidia-bug-report.log.gz").unwrap().sha256
        );
        let m = read(&root, &args(&got.bundle.id, EVIDENCE_MANIFEST, 0)).unwrap();
        assert!(m.eof && hex::decode(m.data_hex).unwrap().starts_with(b"{"));
        // Nothing outside the bundle's listed files, whatever the name.
        for (bundle, file) in [
            ("..", "secret"),
            (got.bundle.id.as_str(), "../../secret"),
            (got.bundle.id.as_str(), ".hidden"),
            ("/etc", "passwd"),
            ("", "x"),
        ] {
            assert!(matches!(read(&root, &args(bundle, file, 0)), Err(ReadError::BadName(_))), "{bundle}/{file}");
        }
        std::fs::write(root.join(&got.bundle.id).join("planted"), "x").unwrap();
        let e = read(&root, &args(&got.bundle.id, "planted", 0)).unwrap_err();
        assert!(
            matches!(&e, ReadError::NotFound(m) if m.starts_with("file planted: expected one of manifest.json, nvidia-bug-report.log.gz")),
            "{e:?}"
        );
        assert!(matches!(read(&root, &args("ev-gone", "x", 0)), Err(ReadError::NotFound(_))));
        // A listed name that became a link is not followed.
        let f = root.join(&got.bundle.id).join("nvidia-bug-report.out");
        std::fs::remove_file(&f).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("secret"), &f).unwrap();
        assert!(matches!(read(&root, &args(&got.bundle.id, "nvidia-bug-report.out", 0)), Err(ReadError::NotFound(_))));
    }

    #[tokio::test]
    async fn a_changed_file_no_longer_verifies() {
        let tmp = tempfile::tempdir().unwrap();
        let tool = script(tmp.path(), "fine.sh", "echo report > \"$2.gz\"");
        let p = EvidencePolicy { nvidia_bug_report_path: tool, ..EvidencePolicy::default() };
        let got = collect(&p, &tmp.path().join("ev"), req(1)).await.unwrap();
        let dir = Path::new(&got.dir);
        std::fs::write(dir.join("nvidia-bug-report.log.gz"), "edited\n").unwrap();
        let e = nightshift_proto::verify_evidence_dir(dir).unwrap_err();
        assert!(e.contains("nvidia-bug-report.log.gz: expected 7 bytes with sha256"), "{e}");
        std::fs::write(dir.join("nvidia-bug-report.log.gz"), "report\n").unwrap();
        std::fs::write(dir.join("extra.txt"), "x").unwrap();
        let e = nightshift_proto::verify_evidence_dir(dir).unwrap_err();
        assert!(e.contains("extra.txt is not in the manifest"), "{e}");
    }
}
