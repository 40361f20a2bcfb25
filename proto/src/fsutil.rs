//! Small file helpers: atomic replace and durable append.

use std::io::Write;
use std::path::Path;

/// Replace `path` with `bytes` atomically: write a sibling temp file, fsync
/// it, rename it over the target, fsync the directory. The file is made
/// mode 0600 whatever the umask (a private key or a state file is never
/// readable by others, not even for a moment).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_as(path, bytes, None)
}

/// [`write_atomic`], the new file taking `keep`'s owner and mode (the file
/// it replaces) instead of 0600. An owner this process may not give
/// (another user's file, no CAP_CHOWN) is a `PermissionDenied` before
/// anything is renamed.
fn write_atomic_as(path: &Path, bytes: &[u8], keep: Option<&std::fs::Metadata>) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        // A temp file left by a crash keeps its old mode: set it again.
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        if let Some(m) = keep {
            let mine = f.metadata()?;
            if (mine.uid(), mine.gid()) != (m.uid(), m.gid()) {
                std::os::unix::fs::fchown(&f, Some(m.uid()), Some(m.gid()))?;
            }
            f.set_permissions(std::fs::Permissions::from_mode(m.mode() & 0o7777))?;
        }
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Replace a file's content, atomically where its folder is writable, else
/// in place. Under systemd's `ProtectSystem=strict` a file listed in
/// `ReadWritePaths=` is writable while its folder (`/etc`) is not: no
/// temp file can be made beside it, and nothing can be renamed over the
/// bind mount it is. Then the file is truncated and written through, and
/// fsynced. Returns whether the write was in place.
///
/// The file keeps the mode and owner it had (a 0600 secret stays 0600, a
/// 0644 file others read stays readable); one that did not exist is made
/// 0600. One whose owner cannot be given to a new file is written in place
/// (which keeps both).
///
/// The in-place write is not atomic: a crash in the middle leaves part of
/// the new content. Callers keep each content elsewhere first (the agent's
/// config history does) so the file can be written again.
pub fn replace_contents(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    use std::io::ErrorKind::*;
    let keep = std::fs::metadata(path).ok();
    match write_atomic_as(path, bytes, keep.as_ref()) {
        Ok(()) => Ok(false),
        Err(e) if matches!(e.kind(), ReadOnlyFilesystem | PermissionDenied | ResourceBusy | CrossesDevices) => {
            let mut f = match std::fs::OpenOptions::new().write(true).truncate(true).open(path) {
                Ok(f) => f,
                Err(open) => {
                    return Err(std::io::Error::new(
                        open.kind(),
                        format!(
                            "{e} (a temp file and rename in its folder), and {open} writing it in place: under systemd's ProtectSystem=strict the file must exist and be listed in ReadWritePaths="
                        ),
                    ));
                }
            };
            f.write_all(bytes)?;
            f.sync_all()?;
            Ok(true)
        }
        Err(e) => Err(e),
    }
}

/// Set a file's mode to 0600 (owner read/write only).
pub fn restrict(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// Issue 46 point 11: a replaced file took the umask's mode (a 0600
    /// secret became 0644); a new one was readable by others until it was
    /// restricted.
    #[test]
    fn a_replaced_file_keeps_its_mode_and_a_new_one_is_private() {
        let dir = tempfile::tempdir().unwrap();
        for keep in [0o600, 0o640, 0o644, 0o400] {
            let p = dir.path().join(format!("f{keep:o}"));
            std::fs::write(&p, "old").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(keep)).unwrap();
            assert!(!replace_contents(&p, b"new").unwrap(), "{keep:o}: atomic, its folder is writable");
            assert_eq!(std::fs::read(&p).unwrap(), b"new");
            assert_eq!(mode(&p), keep, "{keep:o}");
        }
        let fresh = dir.path().join("fresh");
        replace_contents(&fresh, b"x").unwrap();
        write_atomic(&dir.path().join("key"), b"secret").unwrap();
        assert_eq!((mode(&fresh), mode(&dir.path().join("key"))), (0o600, 0o600));
        // A temp file a crash left behind, readable by all, is not reused as is.
        let stale = dir.path().join(format!(".key2.tmp-{}", std::process::id()));
        std::fs::write(&stale, "").unwrap();
        std::fs::set_permissions(&stale, std::fs::Permissions::from_mode(0o666)).unwrap();
        write_atomic(&dir.path().join("key2"), b"secret").unwrap();
        assert_eq!(mode(&dir.path().join("key2")), 0o600);
        assert!(!stale.exists());
    }
}
