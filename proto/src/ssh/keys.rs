//! Ed25519 keys: host keys, engine keys, authorized-keys files, and the
//! SHA-256 fingerprints that pin them.

use std::path::{Path, PathBuf};

use russh::keys::ssh_key::LineEnding;
use russh::keys::{Algorithm, HashAlg};
pub use russh::keys::{PrivateKey, PublicKey};

/// A key file problem.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read key {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("cannot write key {path}: {message}")]
    Write { path: PathBuf, message: String },
    #[error("{path}:{line}: not an OpenSSH public key ({message}); expected `ssh-ed25519 AAAA… comment`")]
    Authorized { path: PathBuf, line: usize, message: String },
    #[error("cannot generate a key: {0}")]
    Generate(String),
}

/// A fresh Ed25519 key.
pub fn generate(comment: &str) -> Result<PrivateKey, KeyError> {
    let mut key =
        PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519).map_err(|e| KeyError::Generate(e.to_string()))?;
    key.set_comment(comment);
    Ok(key)
}

/// Write a private key (mode 0600) and its `.pub` beside it.
pub fn write_keypair(key: &PrivateKey, path: &Path) -> Result<(), KeyError> {
    let werr = |e: &dyn std::fmt::Display| KeyError::Write { path: path.into(), message: e.to_string() };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| werr(&e))?;
    }
    let pem = key.to_openssh(LineEnding::LF).map_err(|e| werr(&e))?;
    crate::fsutil::write_atomic(path, pem.as_bytes()).map_err(|e| werr(&e))?;
    crate::fsutil::restrict(path).map_err(|e| werr(&e))?;
    let public = key.public_key().to_openssh().map_err(|e| werr(&e))?;
    let pub_path = pub_path(path);
    std::fs::write(&pub_path, format!("{public}\n")).map_err(|e| werr(&e))?;
    Ok(())
}

/// `<path>.pub`.
pub fn pub_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".pub");
    PathBuf::from(p)
}

/// Read a private key.
pub fn load(path: &Path) -> Result<PrivateKey, KeyError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| KeyError::Read { path: path.into(), message: e.to_string() })?;
    PrivateKey::from_openssh(text.as_bytes()).map_err(|e| KeyError::Read { path: path.into(), message: e.to_string() })
}

/// Read a private key, or generate one there (mode 0600) if the file does
/// not exist. Returns whether it was created.
pub fn load_or_create(path: &Path, comment: &str) -> Result<(PrivateKey, bool), KeyError> {
    if path.exists() {
        return Ok((load(path)?, false));
    }
    let key = generate(comment)?;
    write_keypair(&key, path)?;
    Ok((key, true))
}

/// `SHA256:…`, as `ssh-keygen -l` prints it.
pub fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(HashAlg::Sha256).to_string()
}

/// Parse an authorized-keys file: one OpenSSH public key per line, `#`
/// comments and blank lines ignored. Errors name the line.
pub fn parse_authorized(text: &str, path: &Path) -> Result<Vec<PublicKey>, KeyError> {
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let key = PublicKey::from_openssh(line).map_err(|e| KeyError::Authorized {
            path: path.into(),
            line: i + 1,
            message: e.to_string(),
        })?;
        keys.push(key);
    }
    Ok(keys)
}

/// Read an authorized-keys file.
pub fn load_authorized(path: &Path) -> Result<Vec<PublicKey>, KeyError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| KeyError::Read { path: path.into(), message: e.to_string() })?;
    parse_authorized(&text, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_with_private_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k/host_key");
        let (k, created) = load_or_create(&path, "test").unwrap();
        assert!(created);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (k2, created) = load_or_create(&path, "test").unwrap();
        assert!(!created);
        assert_eq!(fingerprint(k.public_key()), fingerprint(k2.public_key()));
        assert!(fingerprint(k.public_key()).starts_with("SHA256:"));
        let pubs = load_authorized(&pub_path(&path)).unwrap();
        assert_eq!(pubs.len(), 1);
    }

    #[test]
    fn bad_authorized_lines_are_named() {
        let err = parse_authorized("# engine\n\nssh-ed25519 notbase64 x\n", Path::new("ak")).unwrap_err();
        assert!(err.to_string().starts_with("ak:3: not an OpenSSH public key"), "{err}");
    }
}
