//! A loaded runbook — manifest plus compiled script — and loading a folder
//! of them, reporting every bad file with file:line:column.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::runbooks::manifest::{LoadError, Manifest};
use crate::runbooks::script;

/// A manifest with its compiled script.
#[derive(Debug, Clone)]
pub struct Runbook {
    /// SHA-256 of the manifest's and the script's bytes (hex): what a run
    /// is admitted and approved as. A reload that changes either changes it.
    pub digest: String,
    pub manifest: Manifest,
    pub manifest_path: PathBuf,
    pub script_path: PathBuf,
    pub script_source: String,
    pub ast: Arc<rhai::AST>,
}

/// Every loaded runbook, and what failed to load.
#[derive(Debug, Clone, Default)]
pub struct RunbookSet {
    pub runbooks: Vec<Runbook>,
    pub errors: Vec<LoadError>,
}

/// The runbook set in force: read whole by everyone, replaced whole by a
/// reload — a reader never sees half of one set and half of another, and
/// nothing changes a set in force.
pub(crate) struct Loaded {
    set: std::sync::RwLock<std::sync::Arc<RunbookSet>>,
}

impl Loaded {
    pub(crate) fn new(set: RunbookSet) -> Loaded {
        Loaded { set: std::sync::RwLock::new(std::sync::Arc::new(set)) }
    }

    /// The set in force.
    pub(crate) fn get(&self) -> std::sync::Arc<RunbookSet> {
        self.set.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Put `set` in force.
    pub(crate) fn replace(&self, set: RunbookSet) {
        *self.set.write().unwrap_or_else(|e| e.into_inner()) = std::sync::Arc::new(set);
    }
}

impl RunbookSet {
    /// The runbook called `name`.
    pub fn get(&self, name: &str) -> Option<(usize, &Runbook)> {
        self.runbooks.iter().enumerate().find(|(_, r)| r.manifest.name == name)
    }

    /// Names, for messages.
    pub fn names(&self) -> Vec<String> {
        self.runbooks.iter().map(|r| r.manifest.name.clone()).collect()
    }
}

/// Load one manifest file and its script.
pub fn load_file(path: &Path, engine: &rhai::Engine) -> Result<Runbook, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|e| LoadError {
        file: path.into(),
        line: 0,
        column: 0,
        message: format!("cannot read: {e}"),
    })?;
    let manifest = Manifest::parse(&text, path)?;
    let script_path = path.parent().unwrap_or(Path::new(".")).join(&manifest.script);
    let script_source = std::fs::read_to_string(&script_path).map_err(|e| {
        let (line, column) = crate::runbooks::manifest::locate(&text, &manifest.script);
        LoadError {
            file: path.into(),
            line,
            column,
            message: format!("script: cannot read {}: {e}", script_path.display()),
        }
    })?;
    let ast = script::compile(engine, &script_source, &script_path)?;
    let digest = {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update((text.len() as u64).to_be_bytes());
        h.update(text.as_bytes());
        h.update(script_source.as_bytes());
        hex::encode(h.finalize())
    };
    Ok(Runbook { digest, manifest, manifest_path: path.into(), script_path, script_source, ast: Arc::new(ast) })
}

/// Load every `*.yaml` manifest in `dir` (not recursive). Bad files are
/// reported, good ones loaded; two runbooks with one name is an error.
pub fn load_dir(dir: &Path, engine: &rhai::Engine) -> RunbookSet {
    let mut set = RunbookSet::default();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            set.errors.push(LoadError {
                file: dir.into(),
                line: 0,
                column: 0,
                message: format!("cannot read the runbook folder: {e}"),
            });
            return set;
        }
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    paths.sort();
    for p in paths {
        match load_file(&p, engine) {
            Ok(rb) => {
                if let Some((_, other)) = set.get(&rb.manifest.name) {
                    let (line, column) = (2, 1);
                    set.errors.push(LoadError {
                        file: p.clone(),
                        line,
                        column,
                        message: format!(
                            "runbook name `{}` is already used by {}",
                            rb.manifest.name,
                            other.manifest_path.display()
                        ),
                    });
                } else {
                    set.runbooks.push(rb);
                }
            }
            Err(e) => set.errors.push(e),
        }
    }
    set
}
