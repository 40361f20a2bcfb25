//! Small file helpers: atomic replace and durable append.

use std::io::Write;
use std::path::Path;

/// Replace `path` with `bytes` atomically: write a sibling temp file, fsync
/// it, rename it over the target, fsync the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
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
/// The in-place write is not atomic: a crash in the middle leaves part of
/// the new content. Callers keep each content elsewhere first (the agent's
/// config history does) so the file can be written again.
pub fn replace_contents(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    use std::io::ErrorKind::*;
    match write_atomic(path, bytes) {
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
